"""The one OpenAI-compatible ``/chat/completions`` client (stdlib urllib; no openai package).

Used by the pipeline's chat generator (``pipeline/generate.py``) and the LLM judge label source
(``logs_to_dataset/judge.py``). ``chat`` posts one request and returns the answer's text, its ``usage`` (as the
server reported it, ``{}`` when it did not) and the seconds it took. Connection failures, timeouts and HTTP
408/429/5xx are retried ``retries`` times (waiting 0.5 s, 1 s, 2 s, …); then, and at once for any other HTTP
status, a body that is not JSON or a response without ``choices[0].message.content``, a ``BranchgateError``
names the endpoint URL. ``json_in`` pulls the JSON value out of an answer wrapped in prose or a code fence.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from branchgate.errors import BranchgateError

RETRIED_HTTP = frozenset({408, 429, 500, 502, 503, 504})
BACKOFF = 0.5  # seconds before the first retry; doubled each time


@dataclass
class ChatReply:
    content: str
    usage: dict  # the response's ``usage`` (prompt_tokens, completion_tokens, …), {} when absent
    seconds: float
    attempts: int  # 1 + the retries it took


def endpoint(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


def chat(
    base_url: str,
    model: str,
    messages: list[dict],
    *,
    api_key: str | None = None,
    timeout: float = 60.0,
    retries: int = 0,
    who: str = "LLM",
    **params,
) -> ChatReply:
    """One chat completion of ``messages`` (``params`` such as ``temperature`` go into the request body)."""
    url = endpoint(base_url)
    body = json.dumps({"model": model, "messages": messages, **params}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=timeout) as resp:
                raw = resp.read()
            break
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read()[:200]
            except OSError:
                detail = b""
            error = f"{who}: {url} answered HTTP {exc.code}: {detail!r}"
            if exc.code not in RETRIED_HTTP:
                raise BranchgateError(error) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            error = f"{who}: cannot reach {url} ({getattr(exc, 'reason', None) or exc})"
        if attempt > retries:
            raise BranchgateError(error + (f", after {attempt} attempts" if attempt > 1 else "")) from None
        time.sleep(BACKOFF * 2 ** (attempt - 1))
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BranchgateError(f"{who}: {url} did not answer JSON: {raw[:200]!r}") from None
    try:
        content = data["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError
    except (KeyError, IndexError, TypeError):
        raise BranchgateError(f"{who}: unexpected response shape from {url}: {str(data)[:200]}") from None
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ChatReply(content, usage, time.monotonic() - start, attempt)


def json_in(content: str, kind: type = list):
    """The JSON list (``kind=list``) or object (``kind=dict``) in an LLM answer, from its first opening bracket to
    its last closing one (so prose or a code fence around it does not matter). ``ValueError`` says what is wrong."""
    what, (open_, close) = ("list", "[]") if kind is list else ("object", "{}")
    start, end = content.find(open_), content.rfind(close)
    if start < 0 or end <= start:
        raise ValueError(f"no JSON {what} in the answer")
    try:
        value = json.loads(content[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON {what} in the answer ({exc.msg})") from None
    if not isinstance(value, kind):
        raise ValueError(f"no JSON {what} in the answer")
    return value
