"""Search-o1 reasoning traces: ``<qid>.q`` (the question) + ``<qid>.a`` (the agent's trace).

Layout as in DeepResearchGym's ``Searcho1_ClueWeb22``: searches between ``<|begin_search_query|>`` and
``<|end_search_query|>``, each followed by a result block between ``<|begin_search_result|>`` and
``<|end_search_result|>`` holding documents ``Doc i (URL: …, ClueWebID: …)`` + their text. The trace and its
documents are parsed by ``logs_to_dataset/drgym.py`` (``parse_trace``, ``parse_documents``), the same code that
reads them into ``branchgate env build --format drgym`` environments.

How a trace becomes a run (run_id = qid, root_query = the ``.q`` text, system "search-o1"):

- Search-o1 searches one query at a time and each search is issued after reading the results of the
  previous ones, so every search is its own decision point: search i opens frame ``f<i>`` (depth i,
  parent = frame i-1 / candidate i-1, frame_query = the root query, no goal) with one candidate
  ``c<i>`` (its query). The retained context of frame i is thus the earlier searches and their
  documents. The trace states no research goals: goals are "" (counted in the warnings).
- A search with a result block is expanded (decision ``expand``, actor ``default``). Its documents, in order,
  are then the hits of a ``results`` event (trace schema v2), as a search engine shows them: ``hit_id`` = the
  document's id (ClueWebID, else URL; a document repeated within the block is one hit, the first, counted),
  ``title`` = the first line of its text (``texts.title_of``), ``snippet`` = the next ``SNIPPET_WORDS``
  whitespace words, ``rank`` = 0..n-1, ``url`` = its URL. Search-o1 reads every result it gets: each hit has a
  ``read`` event, action ``read``, actor ``agent``, no score. Each document is an ``evidence`` event the first time
  its id appears in the run (``hit_id`` = that id; source = URL; tokens = whitespace word count): a hit read again in
  a later search gets its ``read`` event, pointing at the same id, and no new evidence. The search gets a
  ``retrieval`` listing its documents' ids. Order: ``decision``, ``results``, ``read`` × hits, ``evidence``
  (new documents), ``retrieval``.
- A search the trace ends on, with no result block, is a candidate without a decision (never executed).
- Reasoning text between a result block and the next search is a ``learning`` of that search; text
  before the first search is a ``learning`` with no candidate; the text after the last result block
  (the final answer) is the ``report``. A trace without searches is a run with zero decisions whose
  report is the whole trace.

Malformed input: missing ``.q`` → the run is skipped (reported); empty, binary or non-UTF-8 ``.a`` → skipped;
an unterminated query/result block (cut trace) → read up to the cut, run_end status "truncated", counted;
stray end tags and a result block without a query are counted (the latter kept as ``raw``).

Key-point labels (DeepResearchGym ground truth), when available for the query. Every rule (file layout,
ids, normalisation, span matching) is ``logs_to_dataset/drgym.py``'s, shared with ``branchgate env build
--format drgym``, so a document gets the same key points here as its passages get in an environment:

- Where: ``key_point/<qid>.json`` and ``key_point/<qid>_aggregated.json``. The folder is by default the sibling
  ``key_point/`` of the folder holding the ``.a`` file (``…/drgym/Searcho1_ClueWeb22`` → ``…/drgym/key_point``),
  or set with ``use_keypoints(DIR | "auto" | None)`` (``dataset build --keypoints DIR|auto|none``). Both files
  are companions of the trace (hashed into ``source_sha256``).
- Ids: ``<qid>#<point_number>`` of the aggregated file (``"1000983#3"``), as in environments.
- Labels of an evidence document: ``spans.SpanIndex.labels`` — the key points quoted from that document (its
  ClueWebID, or URL when it has none), plus those whose span of at least ``spans.MIN_SPAN_WORDS`` words quoted
  from another document is located in its text.
- When ground truth is loaded, EVERY evidence event of the run gets ``labels`` (possibly ``[]``), so the
  dataset builder labels the run by key points; the run_start ``config["keypoints"]`` records the file, the
  number of key points and counts (``labelled_by_id``, ``labelled_by_span_only``, ``bad_links``).
- No key-point file for the query (the folder exists) → no labels (utility falls back to the teacher), a
  counted warning; an unreadable key-point file → the same (``strict``: ``InputError``); malformed entries
  are skipped and counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from branchgate.errors import InputError
from branchgate.logs_to_dataset.drgym import (
    KEYPOINT_DIR,
    Doc,
    QueryKeyPoints,
    W,
    doc_key,
    keypoint_files,
    kp_order,
    parse_documents,
    parse_key_points,
    parse_trace,
    read_json,
)
from branchgate.logs_to_dataset.spans import SpanIndex
from branchgate.logs_to_dataset.trace_schema import (
    Candidate,
    Decision,
    Evidence,
    FrameOpen,
    Hit,
    Learning,
    Raw,
    Read,
    Report,
    Results,
    Retrieval,
    RunEnd,
    RunStart,
)
from branchgate.logs_to_dataset.traces import ReadReport, Run, is_binary, text_problem
from branchgate.texts import hit_of


def result_hits(docs: list[Doc], warn) -> list[Hit]:
    """The hits of one result block: its documents in order, a document id repeated within the block kept once
    (the first; counted), ranked 0..n-1. Title = the text's first line, snippet = the next ``SNIPPET_WORDS``
    words."""
    hits: list[Hit] = []
    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            warn(W + "document repeated within a result block (one hit, the first)")
            continue
        seen.add(doc.id)
        title, rest = hit_of(doc.text)
        hits.append(Hit(hit_id=doc.id, title=title, snippet=rest, rank=len(hits), url=doc.url or None))
    return hits


@dataclass
class GroundTruth:
    """One query's key points, as the reader uses them: the file they came from and the span index."""

    file: str
    key_points: QueryKeyPoints
    index: SpanIndex

    @property
    def ids(self) -> list[str]:
        return self.key_points.ids

    @property
    def bad_links(self) -> int:
        return self.key_points.bad_links

    def labels(self, evidence_id: str, text: str) -> tuple[list[str], bool]:
        """Key-point ids a document covers (sorted by number) and whether its id alone gave any."""
        found = self.index.labels(evidence_id, text)
        return sorted(found, key=kp_order), bool(self.index.own.get(doc_key(evidence_id)))


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
            data.append(read_json(f))
        except InputError as exc:
            if strict:
                raise InputError(f"unreadable key-point file: {exc.reason}", exc.file, exc.line) from None
            warn(W + f"unreadable key-point file {f.name} (no labels)")
            return None
    try:
        kps = parse_key_points(qid, *data, str(per_file), str(agg_file))
    except InputError as exc:
        if strict:
            raise
        warn(W + exc.reason + " (no labels)")
        return None
    warn(W + "key-point link (original_point_number) out of range (ignored)", kps.bad_links)
    warn(W + "malformed key-point entry (ignored)", kps.bad_entries)
    return GroundTruth(str(per_file), kps, SpanIndex([kps]))


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


class SearchO1Reader:
    name = "searcho1"

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
            problem = text_problem(f)
            if problem:
                report.skip(f, None, f"{problem}, not a Search-o1 text file", strict)
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
        # each search is the next step of one chain of reasoning, made whatever the last one brought (bench/replay.py)
        config: dict = {"format": "searcho1", "follow_ups": "always"}
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
            yield ev(
                FrameOpen,
                frame_id=fid,
                parent_frame=f"f{i - 1}" if i else None,
                parent_candidate=f"c{i - 1}" if i else None,
                depth=i,
                frame_query=root_query,
                parent_goal="",
            )
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
                hits = result_hits(docs, warn)
                yield ev(Results, candidate_id=cid, query=s.query, hits=hits)
                for hit in hits:
                    yield ev(Read, candidate_id=cid, hit_id=hit.hit_id, action="read", actor="agent")
                if not docs:
                    warn(W + "result block without documents (empty retrieval)")
                    if s.result.strip():
                        yield ev(Raw, source_type="searcho1_result_text", data=s.result.strip())
                ids: dict[str, None] = {}  # a dict: membership in O(1)
                tokens = 0
                for d in docs:
                    eid, url, doc_text = d.id, d.url, d.text
                    n = len(doc_text.split())
                    if eid not in seen:
                        seen.add(eid)
                        labels = None
                        if gt is not None:
                            labels, by_id = gt.labels(eid, doc_text)
                            kp_counts["labelled_by_id"] += by_id
                            kp_counts["labelled_by_span_only"] += bool(labels) and not by_id
                        yield ev(
                            Evidence, evidence_id=eid, text=doc_text, source=url, tokens=n, labels=labels, hit_id=eid
                        )
                    if eid not in ids:
                        ids[eid] = None
                        tokens += n
                tokens_total += tokens
                yield ev(Retrieval, candidate_id=cid, query=s.query, evidence_ids=list(ids), tokens=tokens)
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
        yield ev(
            RunEnd,
            status="truncated" if truncated else "ok",
            totals={
                "nodes": expanded,
                "retrieval_calls": expanded,
                "searches": len(searches),
                "evidence": len(seen),
                "tokens": tokens_total,
            },
        )
