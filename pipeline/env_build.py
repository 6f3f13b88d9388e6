"""Building local retrieval environments from benchmark data (the folder they are saved to: ``env.py``).

- Chunking: documents become sentence "atoms" (the sentences one labelled span touches merge into one, so a
  span is never split), packed greedily into passages of about a target length.
- ``build_drgym``: the DeepResearchGym layout (``queries/*.jsonl``, ``key_point/``, ``Searcho1_ClueWeb22/*.a``).
  Parsing, key points, ids and span labelling are ``logs_to_dataset/drgym.py``'s (``SpanIndex`` over every
  query's key points), the rules ``branchgate dataset build --format searcho1`` labels evidence with: a
  document's passages carry, together, the key points the reader gives that document.
- ``build_musique``: MuSiQue questions, one key point per decomposition step on its supporting paragraph.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import check_output_dir, mark_output_dir
from branchgate.logs_to_dataset.drgym import (KEYPOINT_DIR, TRACE_DIR, check_layout, doc_key, keypoint_files, kp_order,
                                              load_key_points, read_json, read_queries, trace_documents)
from branchgate.logs_to_dataset.spans import SpanIndex, normalize
from branchgate.pipeline import env
from branchgate.pipeline.env import DEFAULT_CHUNK_WORDS, FORMATS
from branchgate.pipeline.textutil import sentence_ranges

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# chunking: pack "atoms" (sentences, merged so no labelled span is ever split) into passages
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Atom:
    text: str
    labels: set[str] = field(default_factory=set)
    protected: bool = False  # holds a labelled span: never split

    @property
    def words(self) -> int:
        return len(self.text.split())


def text_atoms(text: str, spans: list[tuple[int, int, set[str]]]) -> list[Atom]:
    """Sentence atoms of ``text``; the sentences one matched span ``(start, end, labels)`` touches merge."""
    units = sentence_ranges(text)
    if not units:
        return []
    starts = [s for s, _ in units]
    labels: list[set[str]] = [set() for _ in units]
    protected = [False] * len(units)
    join_next = [False] * len(units)
    for s, e, labs in spans:
        first = max(0, int(np.searchsorted(starts, s, side="right")) - 1)
        last = max(first, int(np.searchsorted(starts, max(s, e - 1), side="right")) - 1)
        for i in range(first, last + 1):
            labels[i] |= labs
            protected[i] = True
        for i in range(first, last):
            join_next[i] = True
    atoms: list[Atom] = []
    i = 0
    while i < len(units):
        j = i
        while join_next[j] and j + 1 < len(units):
            j += 1
        atoms.append(Atom(text[units[i][0]:units[j][1]], set().union(*labels[i:j + 1]), any(protected[i:j + 1])))
        i = j + 1
    return atoms


def split_long(atoms: list[Atom], limit: int) -> list[Atom]:
    """Cut unprotected atoms longer than ``limit`` words into ``limit``-word windows."""
    out: list[Atom] = []
    for a in atoms:
        ws = a.text.split()
        if a.protected or len(ws) <= limit:
            out.append(a)
            continue
        for i in range(0, len(ws), limit):
            out.append(Atom(" ".join(ws[i:i + limit]), set(a.labels)))
    return out


def pack(atoms: list[Atom], next_target) -> list[Atom]:
    """Greedily join atoms into passages of about ``next_target()`` words: a passage closes at the atom
    boundary nearest its target; a short tail (under half a target) joins the previous passage."""
    chunks: list[Atom] = []
    cur: list[Atom] = []
    n = 0
    target = next_target()
    for a in atoms:
        if cur and abs(n - target) <= abs(n + a.words - target):
            chunks.append(_join(cur))
            cur, n, target = [], 0, next_target()
        cur.append(a)
        n += a.words
    if cur:
        if chunks and n < target / 2:
            chunks[-1] = _join([chunks[-1], *cur])
        else:
            chunks.append(_join(cur))
    return chunks


def _join(atoms: list[Atom]) -> Atom:
    return Atom(" ".join(a.text for a in atoms), set().union(*(a.labels for a in atoms)), any(a.protected for a in atoms))


def span_atoms(spans: list[tuple[str, set[str]]]) -> list[Atom]:
    """Atoms of a document known only by its quoted spans: one per distinct span, in order."""
    seen: dict[str, Atom] = {}
    for span, labs in spans:
        key = normalize(span)
        if not key:
            continue
        if key in seen:
            seen[key].labels |= labs
        else:
            seen[key] = Atom(" ".join(span.split()), set(labs), True)
    return list(seen.values())


def _rng(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16], 16))


# ----------------------------------------------------------------------------------------------------------
# the environment being built
# ----------------------------------------------------------------------------------------------------------

class Builder:
    def __init__(self, fmt: str, sources: list[str], chunk_words: int = DEFAULT_CHUNK_WORDS, seed: int = 0):
        self.fmt, self.sources, self.chunk_words, self.seed = fmt, sources, chunk_words, seed
        self.queries: dict[str, dict] = {}
        self.passages: list[dict] = []
        self._by_text: dict[str, int] = {}
        self.skipped: list[dict] = []
        self.unreachable: list[dict] = []
        self.notes: Counter = Counter()

    def skip(self, file, line, reason: str) -> None:
        self.skipped.append({"file": str(file), "line": line, "reason": reason})

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
        self.passages.append({"id": f"p{len(self.passages):06d}", "doc": doc, "text": text,
                              "labels": sorted(atom.labels, key=kp_order), "kind": kind})
        return len(self.passages) - 1

    def label(self, i: int, labels: set[str]) -> None:
        """Add key points to passage ``i``."""
        self.passages[i]["labels"] = sorted(set(self.passages[i]["labels"]) | labels, key=kp_order)

    def write(self, out: str | Path) -> Path:
        if not self.queries:
            raise BranchgateError(f"no usable query in {', '.join(self.sources)}; skipped: "
                                  + "; ".join(f"{s['file']}:{s['line'] or ''} {s['reason']}" for s in self.skipped[:5]))
        if not self.passages:
            raise BranchgateError(f"no passage could be built from {', '.join(self.sources)}")
        return env.save(out, fmt=self.fmt, sources=self.sources, chunk_words=self.chunk_words, seed=self.seed,
                        queries=self.queries, passages=self.passages, unreachable=self.unreachable, notes=self.notes,
                        skipped=self.skipped)


# ----------------------------------------------------------------------------------------------------------
# DeepResearchGym
# ----------------------------------------------------------------------------------------------------------

def build_drgym(sources: list[str], out: str | Path, chunk_words: int = DEFAULT_CHUNK_WORDS, seed: int = 0,
                max_queries: int | None = None, progress: bool = True) -> Path:
    """Queries with key points; passages: the ground-truth documents (full text where a trace or DocStream
    holds it, spans located and never split; else their quoted spans) and the other trace documents
    (distractors, chunked to lengths drawn from the relevant passages'), labelled by ``SpanIndex``."""
    from tqdm.auto import tqdm

    b = Builder("drgym", sources, chunk_words, seed)
    fulltext: dict[str, str] = {}  # doc key -> its longest text
    names: dict[str, str] = {}  # doc key -> the id as first written
    query_kps = []

    def add_text(doc_id: str, text: str) -> None:
        key = doc_key(doc_id)
        names.setdefault(key, doc_id.strip())
        if len(text) > len(fulltext.get(key, "")):
            fulltext[key] = text

    def pairs(spans) -> int:  # notes count (span, key point) pairs
        return sum(len(labs) for _, labs in spans)

    def warn(message: str, n: int = 1) -> None:
        if n:
            b.notes[message] += n

    for src in map(Path, sources):
        check_layout(src)
        new_ids: list[str] = []
        for qf, lineno, qid, query, docs in read_queries(src, b.skip):
            for d in docs:
                add_text(d.id, d.text)
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
            b.unreachable += [{"query": qid, "key_point": k.id, "reason": "no source span (no original point with spans)"}
                              for k in kps.points if not k.sources]
            query_kps.append(kps)
        so_dir = src / TRACE_DIR
        if so_dir.is_dir():
            wanted = set(new_ids) if max_queries is not None else None
            for a in sorted(so_dir.glob("*.a")):
                if wanted is not None and a.stem not in wanted:
                    continue
                try:
                    text = a.read_text(encoding="utf-8", errors="replace")
                except OSError as exc:
                    b.skip(a, None, f"unreadable: {exc}")
                    continue
                for d in trace_documents(text, warn):
                    add_text(d.id, d.text)
        else:
            b.notes["sources_without_Searcho1_ClueWeb22"] += 1

    index = SpanIndex(query_kps)
    names.update(index.names)  # ground-truth documents: named as in their key-point file
    # 1) ground-truth documents: full text where known (spans located, never split), else their spans
    gt_lengths: list[int] = []
    target = lambda: chunk_words  # noqa: E731
    for doc in tqdm(index.documents, desc="ground-truth docs", disable=not progress, leave=False):
        if doc in fulltext:
            found, missing = index.locate(doc, fulltext[doc])
            own = pairs(index.own_spans(doc)) - pairs(missing)
            b.notes["spans_located_in_full_text"] += own
            b.notes["spans_not_in_full_text"] += pairs(missing)
            b.notes["spans_of_other_documents_located"] += pairs((s, labs) for *s, labs in found) - own
            chunks = pack(split_long(text_atoms(fulltext[doc], found), 2 * chunk_words), target)
            if missing:
                chunks += pack(span_atoms(missing), target)
        else:
            atoms = span_atoms(index.own_spans(doc))
            b.notes["spans_from_span_only_docs"] += pairs(index.own_spans(doc))
            for a in atoms:  # a quote can hold a span of another document (or a shorter one of its own)
                a.labels |= index.labels(doc, a.text, own=False)
            chunks = pack(atoms, target)
        for c in chunks:
            b.add_passage(names[doc], c, "ground_truth")
            if c.labels:
                gt_lengths.append(c.words)
    # 2) distractors: other full texts, chunked to lengths drawn from the relevant passages' distribution;
    #    labelled where they quote another document's span (as the Search-o1 reader labels them)
    pool = sorted(gt_lengths) or [chunk_words]
    others = sorted(d for d in fulltext if d not in index.own)
    for doc in tqdm(others, desc="distractor docs", disable=not progress, leave=False):
        rng = _rng(seed, names[doc])
        draw = lambda: max(8, pool[rng.randrange(len(pool))])  # noqa: E731
        found, _ = index.locate(doc, fulltext[doc])
        b.notes["spans_of_other_documents_located"] += pairs((s, labs) for *s, labs in found)
        b.notes["distractor_docs_with_spans"] += bool(found)
        for c in pack(split_long(text_atoms(fulltext[doc], found), 2 * chunk_words), draw):
            b.add_passage(names[doc], c, "distractor")
    b.notes["full_text_docs"] = len(fulltext)
    b.notes["ground_truth_docs"] = len(index.own)
    b.notes["ground_truth_docs_with_full_text"] = len(set(index.own) & set(fulltext))
    return b.write(out)


# ----------------------------------------------------------------------------------------------------------
# MuSiQue
# ----------------------------------------------------------------------------------------------------------

def build_musique(sources: list[str], out: str | Path, seed: int = 0, max_queries: int | None = None,
                  question_ids: list[str] | None = None) -> Path:
    """Questions with ``paragraphs`` (``is_supporting``) and ``question_decomposition``; one key point per
    decomposition step, covered by its supporting paragraph. Passages: the ``*_corpus.json`` files when
    present (and no subset is asked for), else the questions' own paragraphs."""
    b = Builder("musique", sources, 0, seed)
    corpus: list[tuple[str, str]] = []
    questions: list[tuple[Path, int, dict]] = []
    for src in map(Path, sources):
        if not src.is_dir():
            raise InputError("not a directory", str(src))
        files = sorted(src.glob("*.json"))
        if not files:
            raise InputError("no *.json file (expected MuSiQue questions, e.g. musique_train.json, and optionally "
                             "*_corpus.json)", str(src))
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
    if question_ids is not None:
        wanted = set(question_ids)
        questions = [t for t in questions if isinstance(t[2], dict) and str(t[2].get("id")) in wanted]
    if max_queries is not None:
        questions = questions[:max_queries]
    subset = question_ids is not None or max_queries is not None

    def passage(title: str, text: str) -> int | None:
        return b.add_passage(title, Atom(f"{title}\n{text}".strip()), "corpus")

    if corpus and not subset:
        for title, text in corpus:
            passage(title, text)
    for f, i, q in questions:
        where = f"[{i}]"
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("paragraphs"), list):
            b.skip(f, None, f"{where}: needs 'question' and 'paragraphs'")
            continue
        qid = str(q.get("id", f"{f.stem}-{i}"))
        if qid in b.queries:
            b.skip(f, None, f"{where}: duplicate question id {qid}")
            continue
        paras = q["paragraphs"]
        idx_of = {}
        for j, p in enumerate(paras):
            if isinstance(p, dict) and isinstance(p.get("paragraph_text"), str):
                idx_of[p.get("idx", j)] = passage(str(p.get("title", "")), p["paragraph_text"])
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
                pi = passage(str(p.get("title", "")), str(p.get("paragraph_text", "")))
                if pi is None:
                    continue
                b.label(pi, {kid})
        if not kps:
            b.skip(f, None, f"{where}: question {qid} has no decomposition and no supporting paragraph")
            continue
        b.queries[qid] = {"id": qid, "query": q["question"].strip(), "key_points": kps,
                          "meta": {"answer": q.get("answer"), "decomposition": [s.get("question") for s in steps]}}
    return b.write(out)


OUTPUT_KIND = "env build"  # the command named in the environment folder's mark (``fileio.check_output_dir``)


def build(fmt: str, sources: list[str], out: str | Path, **kw) -> Path:
    """Build the ``fmt`` environment of ``sources`` at ``out`` (refused before reading if ``out`` overlaps a
    source, is a file, or is a folder with files no ``env build`` wrote)."""
    if fmt not in ("drgym", "musique"):
        raise BranchgateError(f"unknown environment format {fmt!r}; one of {', '.join(FORMATS)}")
    check_output_dir(out, sources, OUTPUT_KIND)
    if fmt == "drgym":
        path = build_drgym(sources, out, **kw)
    else:
        kw.pop("chunk_words", None)
        kw.pop("progress", None)
        path = build_musique(sources, out, **kw)
    mark_output_dir(path, OUTPUT_KIND)
    return path
