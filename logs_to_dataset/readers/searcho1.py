"""Search-o1 reasoning traces: ``<qid>.q`` (the question) + ``<qid>.a`` (the agent's trace).

Layout as in DeepResearchGym's ``Searcho1_ClueWeb22``: searches between ``<|begin_search_query|>`` and
``<|end_search_query|>``, each followed by a result block between ``<|begin_search_result|>`` and
``<|end_search_result|>`` holding documents ``Doc i (URL: …, ClueWebID: …)`` + their text.

How a trace becomes a run (run_id = qid, root_query = the ``.q`` text, system "search-o1"):

- Search-o1 searches one query at a time and each search is issued after reading the results of the
  previous ones, so every search is its own decision point: search i opens frame ``f<i>`` (depth i,
  parent = frame i-1 / candidate i-1, frame_query = the root query, no goal) with one candidate
  ``c<i>`` (its query). The retained context of frame i is thus the earlier searches and their
  documents. The trace states no research goals: goals are "" (counted in the warnings).
- A search with a result block is expanded (decision ``expand``, actor ``default``): each document is an
  ``evidence`` event the first time its id appears in the run (id = ClueWebID, else URL; source = URL;
  tokens = whitespace word count) and the search gets a ``retrieval`` listing its documents' ids.
- A search the trace ends on, with no result block, is a candidate without a decision (never executed).
- Reasoning text between a result block and the next search is a ``learning`` of that search; text
  before the first search is a ``learning`` with no candidate; the text after the last result block
  (the final answer) is the ``report``. A trace without searches is a run with zero decisions whose
  report is the whole trace.

Malformed input: missing ``.q`` → the run is skipped (reported); empty, binary or non-UTF-8 ``.a`` → skipped;
an unterminated query/result block (cut trace) → read up to the cut, run_end status "truncated", counted;
stray end tags and a result block without a query are counted (the latter kept as ``raw``).

Key-point labels (DeepResearchGym ground truth), when available for the query:

- Where: ``key_point/<qid>.json`` (per-document points: ``{question, key_points: {<ClueWebID or "null">:
  [{point_number, point_content, spans}]}}``) and ``key_point/<qid>_aggregated.json`` (merged points, each
  with ``original_point_number``). The folder is by default the sibling ``key_point/`` of the folder holding
  the ``.a`` file (``…/drgym/Searcho1_ClueWeb22`` → ``…/drgym/key_point``), or set with
  ``use_keypoints(DIR | "auto" | None)`` (``dataset build --keypoints DIR|auto|none``). Both files are
  companions of the trace (hashed into ``source_sha256``).
- Ids: a key point is ``"kp<point_number>"`` of the *aggregated* file (``"kp3"``). ``original_point_number``
  counts the per-document points 1-based in file order across all documents (the per-document
  ``point_number`` restarts at 1 per document); a link outside that range is ignored and counted.
- Labels of an evidence document = (a) the key points linked to a per-document point of that document
  (its ClueWebID, or URL when it has none, compared stripped and case-insensitively), plus (b) span matching:
  the key points of every per-document point (of ANY document) one of whose verbatim ``spans`` of at least
  ``MIN_SPAN_WORDS`` words occurs in the document's text, both normalised (NFKC, case-folded, curly quotes and
  dashes made plain, whitespace collapsed). Shorter spans are too generic to prove coverage.
- When ground truth is loaded, EVERY evidence event of the run gets ``labels`` (possibly ``[]``), so the
  dataset builder labels the run by key points; the run_start ``config["keypoints"]`` records the file, the
  number of key points and counts (``labelled_by_id``, ``labelled_by_span_only``, ``bad_links``).
- No key-point file for the query (the folder exists) → no labels (utility falls back to the teacher), a
  counted warning; an unreadable key-point file → the same (``strict``: ``InputError``); malformed entries
  are skipped and counted.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import InputError
from branchgate.logs_to_dataset.readers import Run, register
from branchgate.logs_to_dataset.schema import (Candidate, Decision, Evidence, FrameOpen, Learning, Raw, Report,
                                               Retrieval, RunEnd, RunStart)
from branchgate.logs_to_dataset.traces import ReadReport, is_binary

TAG = re.compile(r"<\|(begin|end)_search_(query|result)\|>")
DOC = re.compile(r"^Doc (\d+) \((.*)\)[ \t]*\r?$", re.M)
DOC_FIELDS = re.compile(r"URL:\s*(.*?)(?:,\s*ClueWebID:\s*(.*))?$")
W = "searcho1: "
KEYPOINT_DIR = "key_point"
MIN_SPAN_WORDS = 5
_PLAIN = (("\u2018", "'"), ("\u2019", "'"), ("\u201b", "'"), ("\u201c", '"'), ("\u201d", '"'),
          ("\u2013", "-"), ("\u2014", "-"))


@dataclass
class _Search:
    query: str
    result: str | None = None
    after: str = ""


def parse_trace(text: str, warn) -> tuple[str, list[_Search], list[str], bool]:
    """Split a trace into (text before the first search, searches, orphan result blocks, truncated)."""
    prefix_parts: list[str] = []
    searches: list[_Search] = []
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
                add_text(text[cursor:m.start()])
            mode, cursor = "query", m.end()
        elif kind == ("end", "query"):
            if mode != "query":
                warn(W + "stray end_search_query tag")
                continue
            searches.append(_Search(text[cursor:m.start()].strip()))
            mode, cursor = None, m.end()
        elif kind == ("begin", "result"):
            if mode == "query":
                warn(W + "begin_search_result inside an open query (query dropped)")
            else:
                add_text(text[cursor:m.start()])
            mode, cursor = "result", m.end()
        else:  # end result
            if mode != "result":
                warn(W + "stray end_search_result tag")
                continue
            body = text[cursor:m.start()]
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


def parse_documents(body: str, warn) -> list[tuple[str, str, str]]:
    """(evidence_id, url, text) per ``Doc i (URL: …, ClueWebID: …)`` block of a result."""
    heads = list(DOC.finditer(body))
    if heads and body[: heads[0].start()].strip():
        warn(W + "text before the first document of a result block (ignored)")
    docs = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
        doc_text = body[h.end():end].strip()
        fields = DOC_FIELDS.match(h.group(2).strip())
        url = (fields.group(1) if fields else "").strip()
        cw = ((fields.group(2) if fields else None) or "").strip()
        if cw.lower() in ("", "none", "null"):
            cw = ""
            warn(W + "document without a ClueWebID (URL used as its id)" if url else
                 W + "document with neither ClueWebID nor URL (id = hash of its text)")
        eid = cw or url or "sha256:" + hashlib.sha256(doc_text.encode("utf-8")).hexdigest()[:16]
        docs.append((eid, url, doc_text))
    return docs


def normalise(text: str) -> str:
    """Text as compared for span matching: NFKC, case-folded, plain quotes/dashes, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text)
    for a, b in _PLAIN:
        if a in text:
            text = text.replace(a, b)
    return " ".join(text.casefold().split())


def _doc_key(doc_id: str) -> str:
    return doc_id.strip().lower()


@dataclass
class GroundTruth:
    """One query's key points: which documents (by id) and which verbatim spans cover which key point."""

    file: str
    ids: list[str]
    by_doc: dict[str, set[str]] = field(default_factory=dict)
    raw_spans: list[tuple[str, str]] = field(default_factory=list)  # (span as written, key-point id)
    bad_links: int = 0
    bad_entries: int = 0
    _spans: dict[str, set[str]] | None = None

    @property
    def spans(self) -> dict[str, set[str]]:
        """Normalised span (≥ MIN_SPAN_WORDS words) → key points it proves; built on first use."""
        if self._spans is None:
            self._spans = {}
            for span, kid in self.raw_spans:
                norm = normalise(span)
                if len(norm.split()) >= MIN_SPAN_WORDS:
                    self._spans.setdefault(norm, set()).add(kid)
        return self._spans

    def labels(self, evidence_id: str, text: str) -> tuple[list[str], bool]:
        """Key-point ids covered by a document (sorted by number) and whether its id alone gave any."""
        by_id = set(self.by_doc.get(_doc_key(evidence_id), ()))
        found = set(by_id)
        if self.spans:
            norm = normalise(text)
            for span, kps in self.spans.items():
                if not kps <= found and span in norm:
                    found |= kps
        return sorted(found, key=lambda k: (len(k), k)), bool(by_id)


def keypoint_files(directory: Path, qid: str) -> tuple[Path, Path]:
    return directory / f"{qid}.json", directory / f"{qid}_aggregated.json"


def load_ground_truth(directory: Path, qid: str, warn, strict: bool = False) -> GroundTruth | None:
    """The key points of query ``qid`` from ``directory``, or None (counted warning) when missing/unreadable."""
    per_file, agg_file = keypoint_files(directory, qid)
    if not per_file.exists() and not agg_file.exists():
        warn(W + "no key-point file for the query (no labels; utility falls back to the teacher)")
        return None
    if not (per_file.exists() and agg_file.exists()):
        warn(W + "key-point files incomplete: need both <qid>.json and <qid>_aggregated.json (no labels)")
        return None
    data = []
    for f in (per_file, agg_file):
        try:
            data.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            if strict:
                raise InputError(f"unreadable key-point file: {exc}", str(f)) from None
            warn(W + f"unreadable key-point file {f.name} (no labels)")
            return None
    per, agg = data
    per_points = per.get("key_points") if isinstance(per, dict) else None
    agg_points = agg.get("key_points") if isinstance(agg, dict) else None
    if not isinstance(per_points, dict) or not isinstance(agg_points, list):
        reason = "key-point file without a key_points object (per document) / list (aggregated)"
        if strict:
            raise InputError(reason, str(per_file if not isinstance(per_points, dict) else agg_file))
        warn(W + reason + " (no labels)")
        return None
    gt = GroundTruth(str(per_file), [])
    flat: list[tuple[str, list[str]]] = []  # per-document points in file order: (doc key, spans)
    for doc_id, points in per_points.items():
        if not isinstance(points, list):
            gt.bad_entries += 1
            continue
        key = _doc_key(str(doc_id))
        for pt in points:
            spans = pt.get("spans") if isinstance(pt, dict) else None
            if not isinstance(pt, dict):
                gt.bad_entries += 1
                spans = None
            flat.append(("" if key in ("", "null", "none") else key,
                         [x for x in spans if isinstance(x, str)] if isinstance(spans, list) else []))
    for pt in agg_points:
        num = pt.get("point_number") if isinstance(pt, dict) else None
        links = pt.get("original_point_number") if isinstance(pt, dict) else None
        if num is None or not isinstance(links, list):
            gt.bad_entries += 1
            continue
        kid = f"kp{num}"
        if kid not in gt.ids:
            gt.ids.append(kid)
        for n in links:
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(flat):
                gt.bad_links += 1
                continue
            key, spans = flat[n - 1]
            if key:
                gt.by_doc.setdefault(key, set()).add(kid)
            gt.raw_spans += [(span, kid) for span in spans]
    warn(W + "key-point link (original_point_number) out of range (ignored)", gt.bad_links)
    warn(W + "malformed key-point entry (ignored)", gt.bad_entries)
    return gt


@contextmanager
def use_keypoints(setting: str | Path | None = "auto"):
    """Within the block, the Search-o1 reader takes key points from ``setting``: "auto" (sibling
    ``key_point/`` of each trace's folder), a directory, or None / "none" (no labels)."""
    if isinstance(setting, str) and setting.lower() in ("auto", "none", ""):
        setting = None if setting.lower() in ("none", "") else "auto"
    if setting not in (None, "auto"):
        setting = Path(setting)
        if not setting.is_dir():
            raise InputError("--keypoints: not a directory (expected DeepResearchGym key_point/)", str(setting))
    previous = SearchO1Reader.keypoints
    SearchO1Reader.keypoints = setting
    try:
        yield
    finally:
        SearchO1Reader.keypoints = previous


@register("searcho1")
class SearchO1Reader:
    keypoints: str | Path | None = "auto"  # see use_keypoints

    def detect(self, path: Path) -> bool:
        return path.suffix == ".a" and (path.with_suffix(".q").exists() or not is_binary(path))

    def keypoint_dir(self, path: Path) -> Path | None:
        """Where this trace's key points are looked up, or None (none expected)."""
        if self.keypoints is None:
            return None
        if self.keypoints == "auto":
            d = path.parent.parent / KEYPOINT_DIR
            return d if d.is_dir() else None
        return Path(self.keypoints)

    def companions(self, path: Path) -> list[Path]:
        d = self.keypoint_dir(path)
        kp = [f for f in keypoint_files(d, path.stem) if f.exists()] if d is not None else []
        return [path.with_suffix(".q"), *kp]

    def read(self, path: Path, strict: bool, report: ReadReport) -> Iterator[Run]:
        qfile = path.with_suffix(".q")
        if not qfile.exists():
            report.skip(path, None, f"missing question file {qfile.name}", strict)
            return
        texts = []
        for f in (qfile, path):
            if is_binary(f):
                report.skip(f, None, "binary data (NUL bytes), not a Search-o1 text file", strict)
                return
            try:
                texts.append(f.read_text(encoding="utf-8"))
            except UnicodeDecodeError as exc:
                report.skip(f, None, f"not UTF-8 text (byte {exc.start})", strict)
                return
        question, trace = texts
        if not trace.strip():
            report.skip(path, None, "empty trace file", strict)
            return
        if not question.strip():
            report.warn(W + "empty question file (root_query is empty)")
        kp_dir = self.keypoint_dir(path)
        gt = load_ground_truth(kp_dir, path.stem, report.warn, strict) if kp_dir is not None else None
        events = list(self.events(path.stem, question.strip(), trace, report.warn, gt))
        report.events += len(events)
        yield Run(path.stem, events, str(path), "searcho1")

    def events(self, run_id: str, root_query: str, trace: str, warn, gt: GroundTruth | None = None):
        seq = iter(range(1 << 30))

        def ev(cls, **kw):
            return cls(run_id=run_id, seq=next(seq), ts=None, **kw)

        prefix, searches, orphans, truncated = parse_trace(trace, warn)
        config: dict = {"format": "searcho1"}
        kp_counts = {"labelled_by_id": 0, "labelled_by_span_only": 0}
        if gt is not None:
            config["keypoints"] = {"file": gt.file, "n_key_points": len(gt.ids), "bad_links": gt.bad_links}
        start = ev(RunStart, root_query=root_query, system="search-o1", config=config)
        yield start
        if prefix.strip() and searches:
            yield ev(Learning, candidate_id=None, text=prefix.strip())
        seen: set[str] = set()
        expanded = tokens_total = 0
        for i, s in enumerate(searches):
            fid, cid = f"f{i}", f"c{i}"
            yield ev(FrameOpen, frame_id=fid, parent_frame=f"f{i - 1}" if i else None,
                     parent_candidate=f"c{i - 1}" if i else None, depth=i, frame_query=root_query, parent_goal="")
            if not s.query:
                warn(W + "empty search query")
            warn(W + "no research goals in the trace (goal left empty)")
            yield ev(Candidate, frame_id=fid, candidate_id=cid, order=0, query=s.query, goal="")
            if s.result is None:
                warn(W + "search without a result block (trace ends; candidate left undecided)")
            else:
                expanded += 1
                yield ev(Decision, candidate_id=cid, action="expand", actor="default")
                docs = parse_documents(s.result, warn)
                if not docs:
                    warn(W + "result block without documents (empty retrieval)")
                    if s.result.strip():
                        yield ev(Raw, source_type="searcho1_result_text", data=s.result.strip())
                ids, tokens = [], 0
                for eid, url, doc_text in docs:
                    n = len(doc_text.split())
                    if eid not in seen:
                        seen.add(eid)
                        labels = None
                        if gt is not None:
                            labels, by_id = gt.labels(eid, doc_text)
                            kp_counts["labelled_by_id"] += by_id
                            kp_counts["labelled_by_span_only"] += bool(labels) and not by_id
                        yield ev(Evidence, evidence_id=eid, text=doc_text, source=url, tokens=n, labels=labels)
                    if eid not in ids:
                        ids.append(eid)
                        tokens += n
                tokens_total += tokens
                yield ev(Retrieval, candidate_id=cid, query=s.query, evidence_ids=ids, tokens=tokens)
            after = s.after.strip()
            if after and i + 1 < len(searches):
                yield ev(Learning, candidate_id=cid, text=after)
        for body in orphans:
            yield ev(Raw, source_type="searcho1_orphan_result", data=body)
        final = (searches[-1].after if searches else prefix).strip()
        if final:
            yield ev(Report, text=final)
        if gt is not None:  # counted while the evidence was read; read() holds every event before use
            start.config["keypoints"].update(kp_counts)
        yield ev(RunEnd, status="truncated" if truncated else "ok",
                 totals={"nodes": expanded, "retrieval_calls": expanded, "searches": len(searches),
                         "evidence": len(seen), "tokens": tokens_total})
