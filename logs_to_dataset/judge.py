"""The ``judge`` label source: the user's own LLM names the new key points each expanded branch brings in.

Users' logs carry no ground-truth key points. DeepResearchGym's key points were themselves extracted by an LLM,
so an LLM reading a branch's evidence against what was known before gives the label the simulator's
``keypoints`` source gives from ground truth. It runs offline, once per log (stdlib only; any
OpenAI-compatible endpoint through ``branchgate/llm.py``), so the gate carries the judge's quality at no
run-time cost.

**What is judged.** ``Judge.utilities(rd)`` walks the run's frames in order and, per frame, its candidates that
were expanded with known evidence (``c.expanded and c.evidence_ids is not None``). A branch's evidence is E(c)
minus the passages already in the frame's context C_t (they add nothing by definition); a branch left with no
evidence text scores 0 without a request. The rest go to the judge with what was known before the frame opened:
the text of C_t (``rd.frames[i].context_ids``) and, as ALREADY NAMED, the key points the judge named for the
branches of earlier frames whose judged evidence (the passages their points were named from) is in C_t. A branch
whose evidence was pruned after retrieval is not in C_t, so neither are its points; a branch's points count as
known when any of its judged passages is in C_t (the judge names points per branch, not per passage).

**Utility.** The number of distinct key points named for the branch (normalised by ``spans.normalize``: NFKC,
case-folded, punctuation and spacing ignored; a point named twice for the branch counts once) that are not among
the points known before the frame. Siblings are judged independently: a point two branches of a frame both bring
is credited to both, whichever request or order they come in. This is the ``keypoints`` source's g(c) = |key
points covered by E(c)| minus those C_t covers, with the judge's points in place of ground-truth labels.

**Prompt and reply** (``PROMPT``). One request holds up to ``batch`` branches of one frame: the question, KNOWN
BEFORE (C_t's passages), ALREADY NAMED (the points known before the frame) and numbered BRANCHes (query +
evidence), each text block cut to ``max_evidence_chars`` (every passage an equal share; a short one's unused share
goes to the others). The reply must be one JSON object mapping every branch number to a list of short key-point
strings, ``{"1": ["…", "…"], "2": []}`` (prose or a code fence around it is tolerated; with one branch a bare
list is accepted). A reply that does not validate gets one retry (the bad answer and a correction as the next
turns); if that fails too, the batch's branches are failures: no utility (the build excludes them), counted.

**Batching: several branches per request, not concurrent requests.** The branches of a frame share their
KNOWN BEFORE block, the bulk of the prompt, so one request per frame sends it once instead of once per branch;
and a frame's ALREADY NAMED depends on the replies for earlier frames, so the requests of a run are made in order.

**Cache** (SQLite, default ``$BRANCHGATE_CACHE/judge.sqlite``): every request and its reply (content, usage) keyed
by sha256 of (model, messages), committed per reply, so a rerun makes no request and an interrupted run resumes
where it stopped (its earlier replies replay, so its later prompts are the same). Failed HTTP requests are not
cached. Temperature is 0.

**Errors.** Connection refused, timeouts, HTTP 4xx/5xx: ``BranchgateError`` naming the endpoint URL, after
``retries`` retries of the transient ones (``llm.chat``). ``stats()`` gives calls, cache hits, tokens (made now
and replayed from the cache), seconds, retries, bad replies and failures, for the dataset manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

from branchgate.errors import BranchgateError
from branchgate.llm import chat, endpoint, json_in
from branchgate.logs_to_dataset.decision_points import CandidateInfo, FrameInfo, RunDecisions
from branchgate.logs_to_dataset.spans import normalize

PROMPT = """You are judging web research. For the question below, each BRANCH is a search query with the evidence
it retrieved. For EACH branch, list every key point its evidence adds: short
factual statements (at most 20 words each) that help answer the question and that are not already stated in
KNOWN BEFORE or listed in ALREADY NAMED. Judge every branch on its own: list a point under each branch whose
evidence shows it, even when another branch in this request shows it too. Give an empty list to a branch whose
evidence is off-topic or only repeats what is known. Use only what the evidence says.

Answer with one JSON object and nothing else, with exactly the keys {keys}, each mapping to that branch's list of
key points, for example {example}

QUESTION: {question}

KNOWN BEFORE:
<<<
{known}
>>>

ALREADY NAMED:
{named}
{branches}"""

BRANCH = """
BRANCH {n}
QUERY: {query}
EVIDENCE:
<<<
{evidence}
>>>
"""

RETRY = (
    "Your answer could not be read ({reason}). Answer again with the JSON object only: exactly the keys "
    "{keys}, each mapping to a list of key-point strings."
)

MAX_POINT_CHARS = 300  # a longer "key point" is kept, cut to this


def clip(texts: list[str], budget: int) -> str:
    """Passages (whitespace collapsed) joined by blank lines, cut to at most ``budget`` characters of text: every
    passage an equal share, a short passage's unused share going to the longer ones; a cut ends with "…"."""
    texts = [t for t in (" ".join(t.split()) for t in texts) if t]
    caps = [0] * len(texts)
    left = budget
    for rank, i in enumerate(sorted(range(len(texts)), key=lambda i: len(texts[i]))):
        caps[i] = min(len(texts[i]), left // (len(texts) - rank))
        left -= caps[i]
    return "\n\n".join(t if cap == len(t) else t[:cap].rstrip() + "…" for t, cap in zip(texts, caps) if cap)


def keys_of(n: int) -> str:
    return ", ".join(f'"{i}"' for i in range(1, n + 1))


def prompt_for(question: str, known: str, named: list[str], branches: list[tuple[str, str]]) -> str:
    """The request for ``branches`` [(query, evidence text)] given what was known before (see the module docstring)."""
    example = {"1": ["a key point", "another key point"]}
    if len(branches) > 1:
        example["2"] = []
    return PROMPT.format(
        keys=keys_of(len(branches)),
        example=json.dumps(example),
        question=" ".join(question.split()),
        known=known or "(nothing yet)",
        named="\n".join(f"- {p}" for p in named) or "(none)",
        branches="".join(
            BRANCH.format(n=n, query=" ".join(q.split()), evidence=ev) for n, (q, ev) in enumerate(branches, 1)
        ),
    )


def parse_points(content: str, n: int) -> list[list[str]]:
    """The key points per branch in a reply for ``n`` branches; ``ValueError`` says why the reply is unusable."""
    try:
        value = json_in(content, dict)
    except ValueError:
        if n != 1:
            raise
        value = {"1": json_in(content, list)}
    missing = [str(i) for i in range(1, n + 1) if str(i) not in value]
    if missing:
        raise ValueError(f"no key {', '.join(missing)}")
    out = []
    for i in range(1, n + 1):
        points = value[str(i)]
        if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
            raise ValueError(f"key {i} is not a list of strings")
        out.append([" ".join(p.split())[:MAX_POINT_CHARS] for p in points if p.strip()])
    return out


class JudgeCache:
    """(model, messages) → the reply's content and usage, in SQLite; each reply committed when it arrives."""

    def __init__(self, path: Path):
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=60)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS judge (key TEXT PRIMARY KEY, model TEXT, request TEXT, "
                "content TEXT, usage TEXT)"
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise BranchgateError(f"judge cache {path}: cannot open it ({exc})") from None

    @staticmethod
    def key(model: str, messages: list[dict]) -> str:
        blob = json.dumps({"model": model, "messages": messages}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> tuple[str, dict] | None:
        row = self._db.execute("SELECT content, usage FROM judge WHERE key=?", (key,)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def put(self, key: str, model: str, messages: list[dict], content: str, usage: dict) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO judge VALUES (?, ?, ?, ?, ?)",
            (key, model, json.dumps(messages, ensure_ascii=False), content, json.dumps(usage)),
        )
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def _tokens(usage: dict, name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and value >= 0 else 0


class Judge:
    """Realized utilities of a run's expanded branches from an LLM judge (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        cache: str | Path | None = None,
        batch: int = 8,
        max_evidence_chars: int = 4000,
        timeout: float = 60,
        api_key: str | None = None,
        retries: int = 2,
    ):
        if batch < 1 or max_evidence_chars < 1:
            raise BranchgateError(f"judge: batch ({batch}) and max_evidence_chars ({max_evidence_chars}) must be ≥ 1")
        self.base_url, self.model, self.batch = base_url, model, batch
        self.max_chars, self.timeout, self.api_key, self.retries = max_evidence_chars, timeout, api_key, retries
        if cache is None:
            from branchgate.fileio import default_cache_dir  # the one $BRANCHGATE_CACHE rule

            cache = default_cache_dir() / "judge.sqlite"
        self.cache = JudgeCache(Path(cache))
        self._stats = dict.fromkeys(
            (
                "runs",
                "branches",
                "key_points",
                "failures",
                "calls",
                "cached",
                "http_retries",
                "bad_replies",
                "usage_missing",
                "prompt_tokens",
                "completion_tokens",
                "cached_prompt_tokens",
                "cached_completion_tokens",
            ),
            0,
        )
        self._seconds = 0.0

    def utilities(self, rd: RunDecisions) -> dict[str, float]:
        """candidate_id → the number of distinct new key points the judge finds in that expanded candidate's
        evidence, beyond the frame's context C_t and the points named for the branches whose evidence is in C_t
        (siblings independent); only candidates with ``c.expanded and c.evidence_ids is not None`` whose batch got
        a valid reply."""
        self._stats["runs"] += 1
        judged: list[tuple[set[str], dict[str, str]]] = []  # per judged branch: (its judged ids, normalised → as named)
        out: dict[str, float] = {}
        for frame in rd.frames:
            context = set(frame.context_ids)
            known: dict[str, str] = {}  # the points of the branches whose judged evidence is in C_t, in order
            for ids, points in judged:
                if ids & context:
                    for norm, point in points.items():
                        known.setdefault(norm, point)
            todo: list[tuple[CandidateInfo, list[str], str]] = []
            for c in frame.candidates:
                if not c.expanded or c.evidence_ids is None:
                    continue
                ids = [i for i in c.evidence_ids if i not in context]
                evidence = clip([rd.evidence[i].text for i in ids], self.max_chars)
                if evidence:
                    todo.append((c, ids, evidence))
                else:  # nothing beyond C_t: nothing new, no request
                    out[c.candidate_id] = 0.0
                    self._stats["branches"] += 1
            for start in range(0, len(todo), self.batch):
                chunk = todo[start : start + self.batch]
                points = self._judge(
                    self._prompt(rd, frame, [(c, ev) for c, _, ev in chunk], list(known.values())), len(chunk)
                )
                if points is None:
                    self._stats["failures"] += len(chunk)
                    continue
                for (c, ids, _), found in zip(chunk, points):
                    mine: dict[str, str] = {}
                    for point in found:
                        norm = normalize(point)
                        if norm:
                            mine.setdefault(norm, point)
                    new = sum(1 for norm in mine if norm not in known)
                    judged.append((set(ids), mine))
                    out[c.candidate_id] = float(new)
                    self._stats["branches"] += 1
                    self._stats["key_points"] += new
        return out

    def stats(self) -> dict:
        """For the manifest: requests made now (``calls``, their tokens and ``seconds``) and replayed from the cache
        (``cached``, ``cached_*_tokens``: what those replies cost when they were made), ``http_retries``,
        ``bad_replies`` (replies that did not validate), ``failures`` (branches left without a utility),
        ``usage_missing`` (replies without ``usage``: their tokens are not counted)."""
        return {
            "model": self.model,
            "endpoint": endpoint(self.base_url),
            "cache": str(self.cache.path),
            **self._stats,
            "seconds": round(self._seconds, 3),
        }

    def close(self) -> None:
        self.cache.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prompt(
        self, rd: RunDecisions, frame: FrameInfo, chunk: list[tuple[CandidateInfo, str]], named: list[str]
    ) -> str:
        known = clip([rd.evidence[i].text for i in frame.context_ids], self.max_chars)
        kept: list[str] = []  # ALREADY NAMED (the points known before the frame), in order, within the same budget
        size = 0
        for point in named:
            size += len(point) + 3
            if size > self.max_chars:
                break
            kept.append(point)
        return prompt_for(rd.root_query, known, kept, [(c.query, ev) for c, ev in chunk])

    def _judge(self, prompt: str, n: int) -> list[list[str]] | None:
        """Key points per branch, or None when the reply and its one retry do not validate."""
        messages = [{"role": "user", "content": prompt}]
        for _attempt in range(2):
            content = self._complete(messages)
            try:
                return parse_points(content, n)
            except ValueError as exc:
                self._stats["bad_replies"] += 1
                messages = messages + [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": RETRY.format(reason=exc, keys=keys_of(n))},
                ]
        return None

    def _complete(self, messages: list[dict]) -> str:
        key = JudgeCache.key(self.model, messages)
        hit = self.cache.get(key)
        if hit is not None:
            content, usage = hit
            self._stats["cached"] += 1
            self._stats["cached_prompt_tokens"] += _tokens(usage, "prompt_tokens")
            self._stats["cached_completion_tokens"] += _tokens(usage, "completion_tokens")
            return content
        reply = chat(
            self.base_url,
            self.model,
            messages,
            api_key=self.api_key,
            timeout=self.timeout,
            retries=self.retries,
            who="judge",
            temperature=0,
        )
        self.cache.put(key, self.model, messages, reply.content, reply.usage)
        self._stats["calls"] += 1
        self._stats["http_retries"] += reply.attempts - 1
        self._stats["usage_missing"] += not reply.usage
        self._stats["prompt_tokens"] += _tokens(reply.usage, "prompt_tokens")
        self._stats["completion_tokens"] += _tokens(reply.usage, "completion_tokens")
        self._seconds += reply.seconds
        return reply.content


class JudgeSource:
    """``dataset build --labels judge`` (``logs_to_dataset/label_sources.py``): g = ``Judge.utilities``."""

    kind = "judge"
    threshold = 1.0  # one new key point
    higher_is_better = True

    def __init__(self, judge: Judge):
        self.judge = judge

    def needs_vectors(self, rd) -> bool:
        return False

    def missing(self, rd, info) -> str | None:
        return None

    def utilities(self, rd, info, tools) -> dict[str, float]:
        return self.judge.utilities(rd)

    def stats(self) -> dict:
        return self.judge.stats()

    def close(self) -> None:  # the build closes its label source when it is done
        self.judge.close()


def label_source(llm_url: str, llm_model: str, **options) -> JudgeSource:
    """The label source for ``llm_url``/``llm_model``; ``options`` go to ``Judge`` (cache, batch, …; the API key
    defaults to ``$OPENAI_API_KEY``, as for the chat generator)."""
    options.setdefault("api_key", os.environ.get("OPENAI_API_KEY"))
    return JudgeSource(Judge(llm_url, llm_model, **options))
