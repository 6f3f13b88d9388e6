"""The DeepResearchGym format, in one place: Search-o1 traces, key points, span matching (core-safe, stdlib only).

Two commands read this data and must label the same document the same way: ``branchgate dataset build
--format searcho1`` (``logs_to_dataset/readers/searcho1.py``: each retrieved document of a trace becomes an
evidence event with key-point ``labels``) and ``branchgate env build --format drgym``
(``pipeline/env_build.py``: a retrieval corpus whose passages carry key-point labels, used by ``branchgate
simulate``). Both take every rule below from this module.

**Search-o1 traces** (``Searcho1_ClueWeb22/<qid>.a``): searches between ``<|begin_search_query|>`` and
``<|end_search_query|>``, each followed by a result block between ``<|begin_search_result|>`` and
``<|end_search_result|>``. ``parse_trace`` is a tag state machine (tags quoted inside a document are document
text; stray, nested and unterminated tags are reported through ``warn``, a cut trace is read up to the cut).
``parse_documents`` splits a result block at lines ``Doc i (…)``: the header takes everything up to the
line's last ``)`` (URLs may hold parentheses) and reads ``URL: …`` and an optional ``, ClueWebID: …``.
Document id = ClueWebID, else the URL, else a hash of the text. This is the reader's former rule; the
environment builder's former pattern required a ClueWebID, so the text of a document without one was
silently appended to the previous document.

**Key points** (``key_point/<qid>.json``: ``{key_points: {<doc id | "null">: [{point_number, point_content,
spans}]}}``; ``key_point/<qid>_aggregated.json``: ``{key_points: [{point_number, point_content,
original_point_number}]}``), read by ``parse_key_points``. Per-document points are numbered 1-based in file
order across all documents (their own ``point_number`` restarts per document); ``original_point_number``
refers to that numbering. A key point's id is ``<qid>#<point_number>`` (``kp_id``): unique across queries,
because the environment's corpus is shared by all queries (a passage can cover points of several). The
reader used ``kp<point_number>`` before, which collides across queries. A document id is compared stripped
and case-insensitively (``doc_key``); points of the ``null`` document belong to the document
``null:<qid>``. An aggregated entry needs a string ``point_content`` (the environment stores it; its
``point_number`` defaults to its position), a link must be an integer in range (not a boolean), and a
per-document point without any non-blank span links to nothing: it has no text that could show the point,
so the environment could never place it (the reader used to label its document by id anyway).

Normalisation, span matching and the labels of a document: ``logs_to_dataset/spans.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import InputError
from branchgate.fileio import load_json, read_bounded

W = "searcho1: "  # prefix of the warnings about trace structure (counted by the dataset builder's report)
TAG = re.compile(r"<\|(begin|end)_search_(query|result)\|>")
DOC = re.compile(r"^Doc (\d+) \((.*)\)[ \t]*\r?$", re.M)
DOC_FIELDS = re.compile(r"URL:\s*(.*?)(?:,\s*ClueWebID:\s*(.*))?$")
KEYPOINT_DIR = "key_point"
TRACE_DIR = "Searcho1_ClueWeb22"
NULL_DOCS = ("", "null", "none")

Warn = Callable[..., None]


def _no_warn(*_args) -> None:
    return None


# ----------------------------------------------------------------------------------------------------------
# Search-o1 traces
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Search:
    query: str
    result: str | None = None  # the result block's text, None when the trace has none for this search
    after: str = ""  # the text between this search's result and the next search


@dataclass
class Doc:
    id: str  # ClueWebID, else the URL, else "sha256:<16 hex>" of the text
    url: str
    text: str


def parse_trace(text: str, warn: Warn = _no_warn) -> tuple[str, list[Search], list[str], bool]:
    """Split a trace into (text before the first search, searches, orphan result blocks, truncated)."""
    prefix_parts: list[str] = []
    searches: list[Search] = []
    orphans: list[str] = []
    mode, cursor, truncated = None, 0, False

    def add_text(s: str) -> None:
        if searches:
            searches[-1].after += s
        else:
            prefix_parts.append(s)

    for m in TAG.finditer(text):
        kind = m.group(1, 2)
        if mode == "result" and kind != ("end", "result"):
            continue  # tags quoted inside a document are document text
        if kind == ("begin", "query"):
            if mode == "query":
                warn(W + "nested begin_search_query (earlier one dropped)")
            else:
                add_text(text[cursor : m.start()])
            mode, cursor = "query", m.end()
        elif kind == ("end", "query"):
            if mode != "query":
                warn(W + "stray end_search_query tag")
                continue
            searches.append(Search(text[cursor : m.start()].strip()))
            mode, cursor = None, m.end()
        elif kind == ("begin", "result"):
            if mode == "query":
                warn(W + "begin_search_result inside an open query (query dropped)")
            else:
                add_text(text[cursor : m.start()])
            mode, cursor = "result", m.end()
        else:  # end result
            if mode != "result":
                warn(W + "stray end_search_result tag")
                continue
            body = text[cursor : m.start()]
            if searches and searches[-1].result is None:
                searches[-1].result = body
            else:
                warn(W + "result block without a preceding search (kept as raw)")
                orphans.append(body)
            mode, cursor = None, m.end()
    rest = text[cursor:]
    if mode == "query":
        warn(W + "unterminated search query at the end of the trace (not counted as a search)")
        truncated = True
        add_text(rest)
    elif mode == "result":
        warn(W + "unterminated search result at the end of the trace (read up to the cut)")
        truncated = True
        if searches and searches[-1].result is None:
            searches[-1].result = rest
        else:
            orphans.append(rest)
    else:
        add_text(rest)
    return "".join(prefix_parts), searches, orphans, truncated


def parse_documents(body: str, warn: Warn = _no_warn) -> list[Doc]:
    """The ``Doc i (URL: …, ClueWebID: …)`` blocks of one result block, in order."""
    heads = list(DOC.finditer(body))
    if heads and body[: heads[0].start()].strip():
        warn(W + "text before the first document of a result block (ignored)")
    docs = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
        doc_text = body[h.end() : end].strip()
        fields = DOC_FIELDS.match(h.group(2).strip())
        url = (fields.group(1) if fields else "").strip()
        cw = ((fields.group(2) if fields else None) or "").strip()
        if cw.lower() in NULL_DOCS:
            cw = ""
            warn(
                W + "document without a ClueWebID (URL used as its id)"
                if url
                else W + "document with neither ClueWebID nor URL (id = hash of its text)"
            )
        eid = cw or url or "sha256:" + hashlib.sha256(doc_text.encode("utf-8")).hexdigest()[:16]
        docs.append(Doc(eid, url, doc_text))
    return docs


def trace_documents(text: str, warn: Warn = _no_warn) -> list[Doc]:
    """Every document of every result block of a trace (a search's results and orphan blocks), in order."""
    return trace_contents(text, warn)[0]


def trace_contents(text: str, warn: Warn = _no_warn) -> tuple[list[Doc], list[str]]:
    """``trace_documents`` and the trace's search queries (whitespace folded, non-empty, in order), from one parse."""
    _, searches, orphans, _ = parse_trace(text, warn)
    bodies = [s.result for s in searches if s.result is not None] + orphans
    queries = [" ".join(s.query.split()) for s in searches if s.query.strip()]
    return [d for body in bodies for d in parse_documents(body, warn)], queries


# ----------------------------------------------------------------------------------------------------------
# key points
# ----------------------------------------------------------------------------------------------------------


def doc_key(doc_id: str) -> str:
    """A document id as compared: stripped, lower-cased."""
    return str(doc_id).strip().lower()


def kp_id(qid: str, number) -> str:
    return f"{qid}#{number}"


def kp_order(kid: str):
    """Sort key of key-point ids: by query id, then point number as a number."""
    q, _, n = kid.rpartition("#")
    return (q, 0, int(n), "") if n.isdigit() else (q, 1, 0, n)


def keypoint_files(directory: Path, qid: str) -> tuple[Path, Path]:
    return Path(directory) / f"{qid}.json", Path(directory) / f"{qid}_aggregated.json"


def read_json(path: Path):
    """A JSON file's content; ``InputError`` naming the file (and line) when it cannot be read."""
    return load_json(read_bounded(path, str(path)), str(path))  # fileio: the one bounded read and JSON loader


@dataclass
class KeyPoint:
    id: str  # "<qid>#<point_number>"
    text: str
    sources: list[tuple[str, str]] = field(default_factory=list)  # (doc key, span as written) it merges


@dataclass
class QueryKeyPoints:
    """One query's aggregated key points with the quoted spans (and their documents) behind each."""

    qid: str
    points: list[KeyPoint]
    names: dict[str, str] = field(default_factory=dict)  # doc key -> the id as first written in the file
    problems: list[tuple[str, str]] = field(default_factory=list)  # (file, reason) per ignored entry or link
    bad_links: int = 0
    bad_entries: int = 0

    @property
    def ids(self) -> list[str]:
        return [k.id for k in self.points]


def parse_key_points(
    qid: str, per_doc, aggregated, per_doc_file: str = "", aggregated_file: str = ""
) -> QueryKeyPoints:
    """The key points of query ``qid`` from the loaded ``<qid>.json`` and ``<qid>_aggregated.json``.

    ``InputError`` when either file lacks its ``key_points`` (object per document / list); malformed entries
    and out-of-range links are ignored, counted and described in ``problems``."""
    if not isinstance(per_doc, dict) or not isinstance(per_doc.get("key_points"), dict):
        raise InputError("field 'key_points' must be an object {doc id: [points]}", per_doc_file or None)
    if not isinstance(aggregated, dict) or not isinstance(aggregated.get("key_points"), list):
        raise InputError("field 'key_points' must be a list", aggregated_file or None)
    out = QueryKeyPoints(qid, [])
    originals: list[tuple[str, list[str]]] = []  # per-document points in file order: (doc key, spans)
    for doc, points in per_doc["key_points"].items():
        key = doc_key(doc) if doc is not None else ""
        key = f"null:{qid}" if key in NULL_DOCS else key
        out.names.setdefault(key, key if key.startswith("null:") else str(doc).strip())
        if not isinstance(points, list):
            out.bad_entries += 1
            out.problems.append((per_doc_file, f"key_points[{doc!r}]: not a list of points"))
            continue
        for p in points:
            spans = p.get("spans") if isinstance(p, dict) else None
            if not isinstance(p, dict):
                out.bad_entries += 1
                out.problems.append((per_doc_file, f"key_points[{doc!r}]: a point that is not an object"))
            originals.append(
                (key, [s for s in spans if isinstance(s, str) and s.strip()] if isinstance(spans, list) else [])
            )
    by_id: dict[str, KeyPoint] = {}
    for i, k in enumerate(aggregated["key_points"]):
        num = k.get("point_number", i + 1) if isinstance(k, dict) else None
        links = (k.get("original_point_number") or []) if isinstance(k, dict) else None
        if not isinstance(k, dict) or not isinstance(k.get("point_content"), str):
            reason = "needs 'point_content'"
        elif isinstance(num, bool) or not isinstance(num, int):
            reason = "'point_number' must be an integer"
        elif not isinstance(links, list):
            reason = "'original_point_number' must be a list"
        else:
            reason = ""
        if reason:
            out.bad_entries += 1
            out.problems.append((aggregated_file, f"key_points[{i}]: {reason}"))
            continue
        kid = kp_id(qid, num)
        if kid not in by_id:
            by_id[kid] = KeyPoint(kid, k["point_content"].strip())
            out.points.append(by_id[kid])
        for n in links:
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(originals):
                out.bad_links += 1
                out.problems.append(
                    (aggregated_file, f"key_points[{i}].original_point_number: {n!r} outside 1..{len(originals)}")
                )
                continue
            doc, spans = originals[n - 1]
            by_id[kid].sources += [(doc, s) for s in spans]
    return out


def load_key_points(directory: Path, qid: str) -> QueryKeyPoints:
    """``parse_key_points`` of the two files of query ``qid`` in ``directory``; ``InputError`` when one is
    missing, unreadable or malformed."""
    files = keypoint_files(directory, qid)
    for f in files:
        if not f.exists():
            raise InputError(f"query {qid}: key-point file missing", str(f))
    return parse_key_points(qid, *map(read_json, files), *map(str, files))


def read_queries(
    src: Path, skip: Callable[[Path, int | None, str], None]
) -> Iterator[tuple[Path, int, str | None, str, list[Doc]]]:
    """Per JSON object line of ``src/queries/*.jsonl`` (files in name order): (file, line, query id, query text,
    its ``DocStream`` documents that hold a full text). Invalid lines and lines without an id and a query are
    reported with ``skip(file, line, reason)``; the latter still give their documents (query id None)."""
    for qf in sorted((Path(src) / "queries").glob("*.jsonl")):
        with open(qf, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = load_json(line, str(qf), lineno)
                except InputError as exc:
                    skip(qf, lineno, exc.reason)
                    continue
                if not isinstance(obj, dict):
                    skip(qf, lineno, "not a JSON object")
                    continue
                stream = obj.get("DocStream") if isinstance(obj.get("DocStream"), list) else []
                docs = [
                    Doc(str(d["CluewebID"]), str(d.get("Url") or ""), d["CluewebDocument"])
                    for d in stream
                    if isinstance(d, dict) and d.get("CluewebID") and isinstance(d.get("CluewebDocument"), str)
                ]
                qid, query = obj.get("id"), obj.get("query")
                if qid is None or not isinstance(query, str) or not query.strip():
                    skip(qf, lineno, "needs fields 'id' and 'query'")
                    if docs:
                        yield qf, lineno, None, "", docs
                    continue
                yield qf, lineno, str(qid), query.strip(), docs


def check_layout(src: Path) -> None:
    """``InputError`` unless ``src`` is a DeepResearchGym folder (``queries/*.jsonl`` and ``key_point/``)."""
    if not src.is_dir():
        raise InputError("not a directory", str(src))
    missing = [name for name in ("queries", KEYPOINT_DIR) if not (src / name).is_dir()]
    if missing:
        raise InputError(
            f"not a DeepResearchGym folder: missing {', '.join(m + '/' for m in missing)} (expected queries/*.jsonl, "
            f"key_point/<qid>.json + <qid>_aggregated.json, optional {TRACE_DIR}/*.a)",
            str(src),
        )
    if not list((src / "queries").glob("*.jsonl")):
        raise InputError("queries/ has no *.jsonl file", str(src))
