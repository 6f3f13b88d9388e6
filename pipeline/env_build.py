"""Building local retrieval environments from benchmark data (the folder they are saved to: ``env.py``).

- Chunking (``chunking.py``): documents become sentence "atoms" (the sentences one labelled span touches merge
  into one, so a span is never split), packed greedily into passages of about a target length.
- ``build_drgym``: the DeepResearchGym layout (``queries/*.jsonl``, ``key_point/``, ``Searcho1_ClueWeb22/*.a``).
  Parsing, key points, ids and span labelling are ``logs_to_dataset/drgym.py``'s (``SpanIndex`` over every
  query's key points), the rules ``branchgate dataset build --format searcho1`` labels evidence with: a
  document's passages carry, together, the key points the reader gives that document.
  With ``agent_queries`` (``env build --agent-queries``), each query's meta keeps its Search-o1 agent's searches
  (``agent_queries``, at most ``MAX_AGENT_QUERIES``): the offline planner's real-text candidates
  (``generate.agent_steps``). Off by default: a controller trained on such an environment has seen the very
  queries of those logs, so it must not be judged on the same questions' logs.
- ``build_musique``: MuSiQue questions, one key point per decomposition step on its supporting paragraph.
- ``unit="page"``: one passage per document (a page, as a search engine lists it: its first line is its title),
  not chunks. drgym: every document whose full text is known (from the traces or a DocStream), labelled as the
  Search-o1 reader labels a document (``SpanIndex.labels``: its own key points by id, and other documents' spans
  located in it); a ground-truth document known only by its quoted spans is no page (a string of quotes has
  neither a title nor a page's length; counted in the notes, its key points reachable only where another page
  quotes them); musique: each paragraph already is a titled page. The manifest records ``unit``.

Over 400 lines: the two source formats' builds (drgym, musique) share their corpus, labelling and distractor steps;
chunking is apart (``chunking.py``).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import check_output_dir
from branchgate.logs_to_dataset.drgym import (
    KEYPOINT_DIR,
    TRACE_DIR,
    check_layout,
    doc_key,
    keypoint_files,
    kp_order,
    load_key_points,
    read_json,
    read_queries,
    trace_contents,
)
from branchgate.logs_to_dataset.spans import SpanIndex, normalize
from branchgate.pipeline import env
from branchgate.pipeline.chunking import Atom, pack, span_atoms, split_long, text_atoms
from branchgate.pipeline.env import DEFAULT_CHUNK_WORDS, FORMATS, UNITS

MAX_AGENT_QUERIES = 16  # a query's Search-o1 sub-queries kept in its meta (the planner asks one per step)
MAX_AGENT_QUERY_CHARS = 300

__all__ = [
    "Atom",
    "Builder",
    "build",
    "build_drgym",
    "build_musique",
    "pack",
    "span_atoms",
    "split_long",
    "text_atoms",
]  # the chunking names stay importable from here

log = logging.getLogger(__name__)


def _rng(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16], 16))


# ----------------------------------------------------------------------------------------------------------
# the environment being built
# ----------------------------------------------------------------------------------------------------------


class Builder:
    def __init__(
        self, fmt: str, sources: list[str], chunk_words: int = DEFAULT_CHUNK_WORDS, seed: int = 0, unit: str = "passage"
    ):
        self.fmt, self.sources, self.chunk_words, self.seed, self.unit = fmt, sources, chunk_words, seed, unit
        self.queries: dict[str, dict] = {}
        self.passages: list[dict] = []
        self._by_text: dict[str, int] = {}
        self.skipped: list[dict] = []
        self.unreachable: list[dict] = []
        self.notes: Counter = Counter()

    def skip(self, file, line, reason: str) -> None:
        self.skipped.append({"file": str(file), "line": line, "reason": reason})

    def note(self, message: str, n: int = 1) -> None:
        """Count ``n`` occurrences of ``message`` in the manifest's notes (none: no entry)."""
        if n:
            self.notes[message] += n

    def add_passage(self, doc: str, atom: Atom, kind: str) -> int | None:
        """Append a passage (index returned); an exact duplicate text merges its labels into the first."""
        text = atom.text.strip()
        key = normalize(text)
        if not key:
            return None
        if key in self._by_text:  # mirrored pages, repeated spans: one passage, labels merged
            i = self._by_text[key]
            self.label(i, atom.labels)
            self.notes["duplicate_passages_merged"] += 1
            return i
        self._by_text[key] = len(self.passages)
        self.passages.append(
            {
                "id": f"p{len(self.passages):06d}",
                "doc": doc,
                "text": text,
                "labels": sorted(atom.labels, key=kp_order),
                "kind": kind,
            }
        )
        return len(self.passages) - 1

    def label(self, i: int, labels: set[str]) -> None:
        """Add key points to passage ``i``."""
        self.passages[i]["labels"] = sorted(set(self.passages[i]["labels"]) | labels, key=kp_order)

    def write(self, out: str | Path) -> Path:
        if not self.queries:
            raise BranchgateError(
                f"no usable query in {', '.join(self.sources)}; skipped: "
                + "; ".join(f"{s['file']}:{s['line'] or ''} {s['reason']}" for s in self.skipped[:5])
            )
        if not self.passages:
            raise BranchgateError(f"no passage could be built from {', '.join(self.sources)}")
        return env.save(
            out,
            fmt=self.fmt,
            sources=self.sources,
            chunk_words=self.chunk_words,
            seed=self.seed,
            queries=self.queries,
            passages=self.passages,
            unreachable=self.unreachable,
            notes=self.notes,
            skipped=self.skipped,
            unit=self.unit,
        )


# ----------------------------------------------------------------------------------------------------------
# DeepResearchGym
# ----------------------------------------------------------------------------------------------------------


@dataclass
class _Docs:
    """The documents' full texts read so far (query files and traces), by ``doc_key``."""

    fulltext: dict[str, str] = field(default_factory=dict)  # doc key -> its longest text
    names: dict[str, str] = field(default_factory=dict)  # doc key -> the id as first written

    def add(self, doc_id: str, text: str) -> None:
        key = doc_key(doc_id)
        self.names.setdefault(key, doc_id.strip())
        if len(text) > len(self.fulltext.get(key, "")):
            self.fulltext[key] = text


def build_drgym(
    sources: list[str],
    out: str | Path,
    chunk_words: int = DEFAULT_CHUNK_WORDS,
    seed: int = 0,
    max_queries: int | None = None,
    progress: bool = True,
    unit: str = "passage",
    agent_queries: bool = False,
) -> Path:
    """Queries with key points (with ``agent_queries``, each keeps its Search-o1 agent's searches in
    ``meta.agent_queries``); passages: the ground-truth documents (full text where a trace or DocStream
    holds it, spans located and never split; else their quoted spans) and the other trace documents
    (distractors, chunked to lengths drawn from the relevant passages'), labelled by ``SpanIndex``; with
    ``unit="page"`` one passage per document (``_pages``)."""
    b = Builder("drgym", sources, chunk_words, seed, unit)
    docs = _Docs()
    query_kps = []
    for src in map(Path, sources):
        check_layout(src)
        new_ids = _drgym_queries(b, src, docs, max_queries)
        query_kps += _drgym_key_points(b, src, new_ids)
        _drgym_traces(b, src, docs, set(new_ids) if max_queries is not None else None, agent_queries)
    index = SpanIndex(query_kps)
    docs.names.update(index.names)  # ground-truth documents: named as in their key-point file
    if unit == "page":
        _pages(b, index, docs)
    else:
        gt_lengths = _ground_truth_passages(b, index, docs, chunk_words, progress)
        _distractor_passages(b, index, docs, sorted(gt_lengths) or [chunk_words], seed, progress)
    b.notes["full_text_docs"] = len(docs.fulltext)
    b.notes["ground_truth_docs"] = len(index.own)
    b.notes["ground_truth_docs_with_full_text"] = len(set(index.own) & set(docs.fulltext))
    return b.write(out)


def _drgym_queries(b: Builder, src: Path, docs: _Docs, max_queries: int | None) -> list[str]:
    """Read ``src``'s query files (their documents' texts into ``docs``); returns the ids of the queries new
    to the build (at most ``max_queries`` in all)."""
    new_ids: list[str] = []
    for qf, lineno, qid, query, qdocs in read_queries(src, b.skip):
        for d in qdocs:
            docs.add(d.id, d.text)
        if qid is None:
            continue
        if qid in b.queries:
            if b.queries[qid]["query"] != query:
                b.skip(qf, lineno, f"query id {qid} repeats with a different text (kept the first)")
            continue
        if max_queries is not None and len(b.queries) >= max_queries:
            continue
        b.queries[qid] = {"id": qid, "query": query, "key_points": [], "meta": {"source": str(qf)}}
        new_ids.append(qid)
    return new_ids


def _drgym_key_points(b: Builder, src: Path, new_ids: list[str]) -> list:
    """The key points of the queries ``new_ids`` (a query without any is dropped, and skipped)."""
    query_kps = []
    for qid in new_ids:
        try:
            kps = load_key_points(src / KEYPOINT_DIR, qid)
        except InputError as exc:
            b.skip(exc.file, exc.line, exc.reason)
            del b.queries[qid]
            continue
        for file, reason in kps.problems:
            b.skip(file, None, reason)
        if not kps.points:
            b.skip(keypoint_files(src / KEYPOINT_DIR, qid)[1], None, f"query {qid}: no aggregated key points")
            del b.queries[qid]
            continue
        b.queries[qid]["key_points"] = [{"id": k.id, "text": k.text} for k in kps.points]
        b.unreachable += [
            {"query": qid, "key_point": k.id, "reason": "no source span (no original point with spans)"}
            for k in kps.points
            if not k.sources
        ]
        query_kps.append(kps)
    return query_kps


def _drgym_traces(b: Builder, src: Path, docs: _Docs, wanted: set[str] | None, agent_queries: bool) -> None:
    """The documents of ``src``'s Search-o1 traces (only the ``wanted`` queries' when given) into ``docs``; with
    ``agent_queries``, each query's searches into its ``meta.agent_queries``."""
    so_dir = src / TRACE_DIR
    if not so_dir.is_dir():
        b.notes["sources_without_Searcho1_ClueWeb22"] += 1
        return
    for a in sorted(so_dir.glob("*.a")):
        if wanted is not None and a.stem not in wanted:
            continue
        try:
            text = a.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            b.skip(a, None, f"unreadable: {exc}")
            continue
        found, asked = trace_contents(text, b.note)
        for d in found:
            docs.add(d.id, d.text)
        if agent_queries and a.stem in b.queries and asked:  # the offline planner's real-text candidates
            asked = [q[:MAX_AGENT_QUERY_CHARS] for q in asked]
            b.queries[a.stem]["meta"]["agent_queries"] = list(dict.fromkeys(asked))[:MAX_AGENT_QUERIES]
            b.notes["queries_with_agent_queries"] += 1


def _pairs(spans) -> int:  # notes count (span, key point) pairs
    return sum(len(labs) for _, labs in spans)


def _ground_truth_passages(b: Builder, index: SpanIndex, docs: _Docs, chunk_words: int, progress: bool) -> list[int]:
    """Passages of the ground-truth documents: full text where known (spans located, never split), else their
    spans. Returns the word counts of the labelled ones."""
    from tqdm.auto import tqdm

    gt_lengths: list[int] = []
    target = lambda: chunk_words  # noqa: E731
    for doc in tqdm(index.documents, desc="ground-truth docs", disable=not progress, leave=False):
        if doc in docs.fulltext:
            found, missing = index.locate(doc, docs.fulltext[doc])
            own = _pairs(index.own_spans(doc)) - _pairs(missing)
            b.notes["spans_located_in_full_text"] += own
            b.notes["spans_not_in_full_text"] += _pairs(missing)
            b.notes["spans_of_other_documents_located"] += _pairs((s, labs) for *s, labs in found) - own
            chunks = pack(split_long(text_atoms(docs.fulltext[doc], found), 2 * chunk_words), target)
            if missing:
                chunks += pack(span_atoms(missing), target)
        else:
            atoms = span_atoms(index.own_spans(doc))
            b.notes["spans_from_span_only_docs"] += _pairs(index.own_spans(doc))
            for a in atoms:  # a quote can hold a span of another document (or a shorter one of its own)
                a.labels |= index.labels(doc, a.text, own=False)
            chunks = pack(atoms, target)
        for c in chunks:
            b.add_passage(docs.names[doc], c, "ground_truth")
            if c.labels:
                gt_lengths.append(c.words)
    return gt_lengths


def _pages(b: Builder, index: SpanIndex, docs: _Docs) -> None:
    """One passage per document whose full text is known, labelled by ``SpanIndex.labels`` (own key points by id,
    other documents' spans located); ground-truth documents first."""
    b.note("ground_truth_docs_without_text_not_pages", sum(d not in docs.fulltext for d in index.documents))
    for doc in [d for d in index.documents if d in docs.fulltext]:
        b.add_passage(docs.names[doc], Atom(docs.fulltext[doc], index.labels(doc, docs.fulltext[doc])), "ground_truth")
    for doc in sorted(d for d in docs.fulltext if d not in index.own):
        text = docs.fulltext[doc]
        b.add_passage(docs.names[doc], Atom(text, index.labels(doc, text)), "distractor")


def _distractor_passages(b: Builder, index: SpanIndex, docs: _Docs, pool: list[int], seed: int, progress: bool) -> None:
    """Passages of the other full texts, chunked to lengths drawn from ``pool`` (the relevant passages' word
    counts, sorted); labelled where they quote another document's span (as the Search-o1 reader labels them)."""
    from tqdm.auto import tqdm

    chunk_words = b.chunk_words
    others = sorted(d for d in docs.fulltext if d not in index.own)
    for doc in tqdm(others, desc="distractor docs", disable=not progress, leave=False):
        rng = _rng(seed, docs.names[doc])
        draw = lambda rng=rng: max(8, pool[rng.randrange(len(pool))])  # noqa: E731
        found, _ = index.locate(doc, docs.fulltext[doc])
        b.notes["spans_of_other_documents_located"] += _pairs((s, labs) for *s, labs in found)
        b.notes["distractor_docs_with_spans"] += bool(found)
        for c in pack(split_long(text_atoms(docs.fulltext[doc], found), 2 * chunk_words), draw):
            b.add_passage(docs.names[doc], c, "distractor")


# ----------------------------------------------------------------------------------------------------------
# MuSiQue
# ----------------------------------------------------------------------------------------------------------


def build_musique(
    sources: list[str],
    out: str | Path,
    seed: int = 0,
    max_queries: int | None = None,
    question_ids: list[str] | None = None,
    unit: str = "passage",
) -> Path:
    """Questions with ``paragraphs`` (``is_supporting``) and ``question_decomposition``; one key point per
    decomposition step, covered by its supporting paragraph. Passages: the ``*_corpus.json`` files when
    present (and no subset is asked for), else the questions' own paragraphs (each a titled page already)."""
    b = Builder("musique", sources, 0, seed, unit)
    corpus, questions = _musique_files(b, sources)
    if question_ids is not None:
        wanted = set(question_ids)
        questions = [t for t in questions if isinstance(t[2], dict) and str(t[2].get("id")) in wanted]
    if max_queries is not None:
        questions = questions[:max_queries]
    subset = question_ids is not None or max_queries is not None
    if corpus and not subset:
        for title, text in corpus:
            _musique_passage(b, title, text)
    for f, i, q in questions:
        _musique_question(b, f, i, q)
    return b.write(out)


def _musique_files(b: Builder, sources: list[str]) -> tuple[list[tuple[str, str]], list[tuple[Path, int, dict]]]:
    """The corpus paragraphs ``(title, text)`` of the ``*_corpus.json`` files and the questions ``(file, index,
    question)`` of the others, in file order."""
    corpus: list[tuple[str, str]] = []
    questions: list[tuple[Path, int, dict]] = []
    for src in map(Path, sources):
        if not src.is_dir():
            raise InputError("not a directory", str(src))
        files = sorted(f for f in src.glob("*.json") if not f.name.startswith("."))  # not .branchgate.json
        if not files:
            raise InputError(
                "no *.json file (expected MuSiQue questions, e.g. musique_train.json, and optionally *_corpus.json)",
                str(src),
            )
        for f in files:
            data = read_json(f)
            if not isinstance(data, list):
                raise InputError("expected a JSON list", str(f))
            if f.stem.endswith("_corpus"):
                for i, p in enumerate(data):
                    if not isinstance(p, dict) or not isinstance(p.get("text"), str):
                        b.skip(f, None, f"[{i}]: needs 'title' and 'text'")
                        continue
                    corpus.append((str(p.get("title", "")), p["text"]))
            else:
                for i, q in enumerate(data):
                    questions.append((f, i, q))
    if not questions:
        raise InputError("no question file found (only *_corpus.json)", ", ".join(sources))
    return corpus, questions


def _musique_passage(b: Builder, title: str, text: str) -> int | None:
    return b.add_passage(title, Atom(f"{title}\n{text}".strip()), "corpus")


def _musique_question(b: Builder, f: Path, i: int, q) -> None:
    """Question ``i`` of file ``f``: its paragraphs as passages, one key point per decomposition step (else per
    supporting paragraph), labelled on its supporting paragraph."""
    where = f"[{i}]"
    if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("paragraphs"), list):
        b.skip(f, None, f"{where}: needs 'question' and 'paragraphs'")
        return
    qid = str(q.get("id", f"{f.stem}-{i}"))
    if qid in b.queries:
        b.skip(f, None, f"{where}: duplicate question id {qid}")
        return
    paras = q["paragraphs"]
    idx_of = {}
    for j, p in enumerate(paras):
        if isinstance(p, dict) and isinstance(p.get("paragraph_text"), str):
            idx_of[p.get("idx", j)] = _musique_passage(b, str(p.get("title", "")), p["paragraph_text"])
    steps = q.get("question_decomposition") or []
    kps = []
    for n, step in enumerate(steps, 1):
        kid = f"{qid}#{n}"
        text = f"{step.get('question', '')} {step.get('answer', '')}".strip()
        kps.append({"id": kid, "text": text})
        pi = idx_of.get(step.get("paragraph_support_idx"))
        if pi is None:
            b.unreachable.append({"query": qid, "key_point": kid, "reason": "no supporting paragraph"})
            continue
        b.label(pi, {kid})
    if not kps:  # no decomposition: each supporting paragraph is a key point
        for n, p in enumerate([p for p in paras if isinstance(p, dict) and p.get("is_supporting")], 1):
            kid = f"{qid}#{n}"
            kps.append({"id": kid, "text": p.get("title", "")})
            pi = _musique_passage(b, str(p.get("title", "")), str(p.get("paragraph_text", "")))
            if pi is None:
                continue
            b.label(pi, {kid})
    if not kps:
        b.skip(f, None, f"{where}: question {qid} has no decomposition and no supporting paragraph")
        return
    b.queries[qid] = {
        "id": qid,
        "query": q["question"].strip(),
        "key_points": kps,
        "meta": {"answer": q.get("answer"), "decomposition": [s.get("question") for s in steps]},
    }


OUTPUT_KIND = "env build"  # the command named in the environment folder's mark (``fileio.check_output_dir``)


def build(fmt: str, sources: list[str], out: str | Path, **kw) -> Path:
    """Build the ``fmt`` environment of ``sources`` at ``out`` (refused before reading if ``out`` overlaps a
    source, is a file, or is a folder with files no ``env build`` wrote)."""
    if fmt not in ("drgym", "musique"):
        raise BranchgateError(f"unknown environment format {fmt!r}; one of {', '.join(FORMATS)}")
    if kw.get("unit", "passage") not in UNITS:
        raise BranchgateError(f"unknown passage unit {kw['unit']!r}; one of {', '.join(UNITS)}")
    check_output_dir(out, sources, OUTPUT_KIND)
    if fmt == "drgym":
        path = build_drgym(sources, out, **kw)
    else:
        kw.pop("chunk_words", None)
        kw.pop("progress", None)
        kw.pop("agent_queries", None)  # drgym only: MuSiQue's own sub-questions serve
        path = build_musique(sources, out, **kw)
    return path  # env.save wrote it as an ``env build`` output (``fileio.atomic_dir``)
