"""The open_deep_research hook's message and config helpers (``inference/agents/open_deep_research.py``): the search
call's query list, the edit that removes pruned tool calls and queries from a model answer (and from its
provider copies), the first human message, a package setting for a call and the package version.
"""

from __future__ import annotations

import json


def _queries(call: dict) -> list[str] | None:
    args = call.get("args")
    listed = args.get("queries") if isinstance(args, dict) else None
    if isinstance(listed, list) and listed and all(isinstance(q, str) for q in listed):
        return listed
    return None


def _edited(message, calls: list[dict], drop: set[int], queries: dict[int, list[str]]):
    """``message`` without the calls at ``drop`` and with the ``queries`` given per call index."""
    kept_calls, gone, new_args = [], set(), {}
    for i, c in enumerate(calls):
        if i in drop:
            gone.add(c.get("id"))
            continue
        if i in queries:
            c = dict(c, args={**c["args"], "queries": queries[i]})
            new_args[c.get("id")] = c["args"]
        kept_calls.append(c)
    update = {"tool_calls": kept_calls}
    extra = getattr(message, "additional_kwargs", None) or {}
    if isinstance(extra.get("tool_calls"), list):  # OpenAI's wire copy
        wire = []
        for raw in extra["tool_calls"]:
            rid = raw.get("id") if isinstance(raw, dict) else None
            if rid in gone and rid is not None:
                continue
            if rid in new_args and isinstance(raw.get("function"), dict):
                raw = dict(raw, function=dict(raw["function"], arguments=json.dumps(new_args[rid])))
            wire.append(raw)
        update["additional_kwargs"] = dict(extra, tool_calls=wire)
    if isinstance(message.content, list):  # Anthropic's tool_use blocks
        blocks = []
        for b in message.content:
            bid = b.get("id") if isinstance(b, dict) and b.get("type") == "tool_use" else None
            if bid is not None and bid in gone:
                continue
            if bid is not None and bid in new_args:
                b = dict(b, input=new_args[bid])
            blocks.append(b)
        update["content"] = blocks
    return message.model_copy(update=update)


def _first_human(messages) -> str:
    for m in messages if isinstance(messages, (list, tuple)) else []:
        if getattr(m, "type", None) == "human" or (isinstance(m, dict) and m.get("role") in ("user", "human")):
            content = m.content if hasattr(m, "content") else m.get("content")
            return content if isinstance(content, str) else str(content or "")
    return ""


def _setting(config, name: str):
    """A package setting for this call (its Configuration reads the call's ``configurable`` and the environment)."""
    try:
        from open_deep_research.configuration import Configuration

        return getattr(Configuration.from_runnable_config(config), name)
    except Exception:
        return ((config or {}).get("configurable") or {}).get(name)


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("open-deep-research")
    except Exception:
        return None
