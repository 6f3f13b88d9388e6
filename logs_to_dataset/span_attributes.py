"""What one span's attributes say, in the OpenInference and GenAI conventions: its tool calls, their arguments
and text, retrieved documents, tool output, user messages and the root input (read by
``logs_to_dataset/readers/openinference.py``, whose docstring names every attribute). JSON only: nothing is
executed; an attribute that is not JSON is text.
"""

from __future__ import annotations

import json
import re

from branchgate.errors import InputError
from branchgate.fileio import load_json

CALL_KEY = re.compile(
    r"^llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$"
)
INPUT_KEY = re.compile(r"^llm\.input_messages\.(\d+)\.message\.(role|content|contents\.(\d+)\.message_content\.text)$")
DOC_KEY = re.compile(r"^retrieval\.documents\.(\d+)\.document\.(id|content|metadata|score)$")


def tool_calls(attrs: dict) -> list[dict]:
    """An LLM span's tool calls (``id``, ``name``, ``args``, and the ``field`` naming the call's function name):
    OpenInference's ``llm.output_messages`` keys, else GenAI's ``gen_ai.output.messages`` parts."""
    return _oi_calls(attrs) or _genai_calls(attrs.get("gen_ai.output.messages"))


def _oi_calls(attrs: dict) -> list[dict]:
    found: dict[tuple[int, int], dict] = {}
    for key, value in attrs.items():
        m = CALL_KEY.match(key)
        if m:
            found.setdefault((int(m.group(1)), int(m.group(2))), {})[m.group(3)] = value
    return [
        {
            "id": v.get("id"),
            "name": v.get("function.name"),
            "args": _json_args(v.get("function.arguments")),
            "field": f"llm.output_messages.{i}.message.tool_calls.{j}.tool_call.function.name",
        }
        for (i, j), v in sorted(found.items())
    ]


def _genai_calls(value) -> list[dict]:
    messages = parse_json(value) if isinstance(value, str) else value
    calls = []
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        for k, part in enumerate((m or {}).get("parts") or [] if isinstance(m, dict) else []):
            if isinstance(part, dict) and part.get("type") == "tool_call":
                calls.append(
                    {
                        "id": part.get("id"),
                        "name": part.get("name"),
                        "args": _json_args(part.get("arguments")),
                        "field": f"gen_ai.output.messages[{i}].parts[{k}].name",
                    }
                )
    return calls


def parse_json(text):
    """An attribute's JSON text (tool arguments, message lists) parsed, or None when it is not JSON."""
    try:
        return load_json(text) if isinstance(text, (str, bytes)) else None
    except InputError:
        return None


def cut_json(value) -> bool:
    return isinstance(value, str) and value.lstrip().startswith(("{", "[")) and parse_json(value) is None


def _json_args(value):
    if isinstance(value, str):
        parsed = parse_json(value)
        return parsed if parsed is not None else value
    return value if value is not None else {}


def forced(attrs: dict, name: str) -> bool:
    params = parse_json(attrs.get("llm.invocation_parameters"))
    if not isinstance(params, dict):
        return False
    choice, tools = params.get("tool_choice"), params.get("tools")
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    return choice in ("any", "required", name) and isinstance(tools, list) and len(tools) == 1


def call_text(call: dict) -> str:
    args = call.get("args")
    if isinstance(args, str):
        return args
    texts = []
    for v in args.values() if isinstance(args, dict) else []:
        if isinstance(v, str):
            texts.append(v)
        elif isinstance(v, list):
            texts.extend(x for x in v if isinstance(x, str))
    if texts:
        return "\n".join(texts)
    return f"{call['name']} {json.dumps(args, ensure_ascii=False, sort_keys=True)}" if args else call["name"]


def tool_args(attrs: dict):
    """A TOOL span's arguments, parsed when they are JSON."""
    return _json_args(attrs.get("gen_ai.tool.call.arguments", attrs.get("input.value")))


def documents(attrs: dict) -> list[tuple[str, str, str, str]]:
    """A retriever span's documents, in order: ``(id, content, source URL, title)`` (the source and title from
    the document's metadata: ``url`` / ``source`` / ``href`` and ``title``; "" when absent)."""
    docs: dict[int, dict] = {}
    for key, value in attrs.items():
        m = DOC_KEY.match(key)
        if m:
            docs.setdefault(int(m.group(1)), {})[m.group(2)] = value
    out = []
    for _, d in sorted(docs.items()):
        meta = parse_json(d.get("metadata")) if isinstance(d.get("metadata"), str) else d.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        out.append((str(d.get("id") or ""), str(d.get("content") or ""), _source(meta), str(meta.get("title") or "")))
    genai = attrs.get("gen_ai.retrieval.documents")
    for d in (parse_json(genai) if isinstance(genai, str) else genai) or []:
        if isinstance(d, dict):
            text = str(d.get("content") or d.get("text") or "")
            out.append((str(d.get("id") or ""), text, str(d.get("url") or ""), str(d.get("title") or "")))
    return [d for d in out if d[1].strip() or d[0]]


RESULT_TEXT = ("raw_content", "content", "body", "snippet")  # a search result's text, fullest first


def result_list(value) -> list[tuple[str, str, str, str, bool]]:
    """A search tool's output when it is a result list (JSON: a list of results, or an object with a ``results``
    list, each result an object with ``url`` or ``href`` and some text), as ``documents`` gives them plus whether
    the result came with its page (``raw_content``); [] for any other output. A result's text is its fullest
    (``raw_content``, else ``content`` / ``body`` / ``snippet``)."""
    got = parse_json(value) if isinstance(value, str) else value
    if isinstance(got, dict):
        got = got.get("results")
    if not isinstance(got, list):
        return []
    out = []
    for r in got:
        if not isinstance(r, dict):
            continue
        text = next((str(r[k]) for k in RESULT_TEXT if r.get(k)), "")
        if text.strip() and _source(r):
            out.append((_source(r), text, _source(r), str(r.get("title") or ""), bool(r.get("raw_content"))))
    return out


def _source(obj: dict) -> str:
    return next((str(obj[k]) for k in ("url", "source", "href") if obj.get(k)), "")


def tool_output(attrs: dict) -> str:
    value = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
    return value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)


def last_user(attrs: dict) -> str:
    msgs: dict[int, dict] = {}
    for key, value in attrs.items():
        m = INPUT_KEY.match(key)
        if m:
            field_ = "content" if m.group(2) != "role" else "role"
            entry = msgs.setdefault(int(m.group(1)), {})
            entry[field_] = entry.get(field_, "") + str(value) if field_ == "content" else str(value)
    users = [m.get("content", "") for _, m in sorted(msgs.items()) if m.get("role") in ("user", "human")]
    if not users:
        value = attrs.get("gen_ai.input.messages")
        genai = parse_json(value) if isinstance(value, str) else None
        for m in genai if isinstance(genai, list) else []:
            if isinstance(m, dict) and m.get("role") == "user":
                users.append(" ".join(str(p.get("content") or "") for p in m.get("parts") or [] if isinstance(p, dict)))
    return users[-1].strip() if users else ""


def root_text(value) -> str:
    if not isinstance(value, str):
        return ""
    parsed = parse_json(value)
    if parsed is None:
        return value.strip() if not value.lstrip().startswith(("{", "[")) else ""
    if isinstance(parsed, str):
        return parsed.strip()
    if isinstance(parsed, dict):
        for m in parsed.get("messages") or [] if isinstance(parsed.get("messages"), list) else []:
            if isinstance(m, dict):
                data = m.get("data") if isinstance(m.get("data"), dict) else m
                if m.get("type") == "human" or data.get("type") == "human" or m.get("role") == "user":
                    return str(data.get("content") or "").strip()
        for k in ("input", "question", "query"):
            if isinstance(parsed.get(k), str):
                return parsed[k].strip()
    return ""
