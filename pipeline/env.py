"""Local retrieval environments built from real benchmark data: build, save, load, manifest.

An environment folder holds
- ``queries.jsonl``     one query per line: ``id, query, key_points [{id, text}], reachable [ids], meta``
- ``passages.jsonl.gz`` one passage per line: ``id, doc, text, labels`` (key-point ids it covers)
- ``stats.json.gz``     document frequencies of content words (the offline generator's IDF)
- ``bm25/``             the bm25s index (built once; rebuilt in memory when absent, e.g. the bundled sample)
- ``dense/``            optional cached passage embeddings per encoder
- ``manifest.json``     counts, passage-length distributions (relevant vs other), reachable KPR per query,
                        unreachable key points, skipped records.

Formats: ``drgym`` (the upstream DeepResearchGym layout) and ``musique`` (the MuSiQue JSON format).
Key-point ids are ``<query id>#<point number>``, unique across queries, because all queries share one
corpus (a passage can cover key points of several queries).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.errors import BranchgateError, InputError
from branchgate.fileio import atomic_dir, atomic_write_json
from branchgate.pipeline import retrieve
from branchgate.pipeline.textutil import content_words, normalize, normalize_with_map, sentence_ranges

log = logging.getLogger(__name__)

FORMATS = ("drgym", "musique")
DEFAULT_CHUNK_WORDS = 120
ENV_VERSION = 1


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


def find_span(norm_doc: str, span: str) -> tuple[int, int] | None:
    """Normalised position of ``span`` in a normalised document: exact, else its ellipsis pieces, else
    its first and last eight words within a window."""
    ns = normalize(span)
    if not ns:
        return None
    i = norm_doc.find(ns)
    if i >= 0:
        return i, i + len(ns)
    pieces = [normalize(p) for p in re.split(r"\.\.\.|\u2026|\[\.\.\.\]", span)]
    pieces = [p for p in pieces if len(p.split()) >= 4]
    if len(pieces) > 1:
        locs = [(norm_doc.find(p), len(p)) for p in pieces]
        if all(s >= 0 for s, _ in locs):
            return min(s for s, _ in locs), max(s + ln for s, ln in locs)
    ws = ns.split()
    if len(ws) >= 12:
        head, tail = " ".join(ws[:8]), " ".join(ws[-8:])
        s = norm_doc.find(head)
        if s >= 0:
            e = norm_doc.find(tail, s)
            if e >= 0 and e + len(tail) - s <= 2 * len(ns):
                return s, e + len(tail)
    return None


def match_spans(text: str, spans: list[tuple[str, set[str]]]) -> tuple[list[tuple[int, int, set[str]]], list[tuple[str, set[str]]]]:
    """Locate spans in the original text: (matched character ranges with labels, unmatched spans)."""
    norm, index = normalize_with_map(text)
    found, missing = [], []
    for span, labs in spans:
        loc = find_span(norm, span)
        if loc is None:
            missing.append((span, labs))
        else:
            s, e = loc
            found.append((index[s], index[e - 1] + 1, labs))
    return found, missing


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
            self.passages[i]["labels"] = sorted(set(self.passages[i]["labels"]) | atom.labels)
            self.notes["duplicate_passages_merged"] += 1
            return i
        self._by_text[key] = len(self.passages)
        self.passages.append({"id": f"p{len(self.passages):06d}", "doc": doc, "text": text,
                              "labels": sorted(atom.labels), "kind": kind})
        return len(self.passages) - 1

    def write(self, out: str | Path) -> Path:
        if not self.queries:
            raise BranchgateError(f"no usable query in {', '.join(self.sources)}; skipped: "
                                  + "; ".join(f"{s['file']}:{s['line'] or ''} {s['reason']}" for s in self.skipped[:5]))
        if not self.passages:
            raise BranchgateError(f"no passage could be built from {', '.join(self.sources)}")
        covered = {kp for p in self.passages for kp in p["labels"]}
        per_query = {}
        for qid, q in self.queries.items():
            kps = [k["id"] for k in q["key_points"]]
            q["reachable"] = [k for k in kps if k in covered]
            per_query[qid] = round(len(q["reachable"]) / len(kps), 4) if kps else 0.0
            for k in q["key_points"]:
                if k["id"] not in covered and not any(u["key_point"] == k["id"] for u in self.unreachable):
                    self.unreachable.append({"query": qid, "key_point": k["id"], "reason": "no passage contains any of its spans"})
        lens_rel = [len(p["text"].split()) for p in self.passages if p["labels"]]
        lens_oth = [len(p["text"].split()) for p in self.passages if not p["labels"]]
        vals = list(per_query.values())
        manifest = {
            "env_version": ENV_VERSION,
            "format": self.fmt,
            "sources": [str(Path(s).resolve()) for s in self.sources],
            "created_by": f"branchgate {__version__}",
            "chunk_words": self.chunk_words,
            "seed": self.seed,
            "n_queries": len(self.queries),
            "n_key_points": sum(len(q["key_points"]) for q in self.queries.values()),
            "n_passages": len(self.passages),
            "n_relevant_passages": len(lens_rel),
            "passage_words": {"relevant": _dist(lens_rel), "other": _dist(lens_oth),
                              "ks_statistic": _ks(lens_rel, lens_oth)},
            "reachable_kpr": {"mean": round(float(np.mean(vals)), 4), "min": round(float(np.min(vals)), 4),
                              "n_below_1": int(sum(v < 1 for v in vals)), "per_query": per_query},
            "unreachable_key_points": {"count": len(self.unreachable), "items": self.unreachable},
            "notes": dict(sorted(self.notes.items())),
            "skipped": self.skipped,
            "retrieval": {"bm25": {**retrieve.BM25_PARAMS, "library": "bm25s", "stopwords": "branchgate.pipeline.textutil.STOPWORDS"}},
        }
        df = Counter()
        for p in self.passages:
            df.update(set(content_words(p["text"])))
        with atomic_dir(out) as tmp:
            with open(tmp / "queries.jsonl", "w", encoding="utf-8") as fh:
                for q in self.queries.values():
                    fh.write(json.dumps(q, ensure_ascii=False) + "\n")
            with gzip.open(tmp / "passages.jsonl.gz", "wt", encoding="utf-8", compresslevel=6) as fh:
                for p in self.passages:
                    fh.write(json.dumps({k: p[k] for k in ("id", "doc", "text", "labels")}, ensure_ascii=False) + "\n")
            with gzip.open(tmp / "stats.json.gz", "wt", encoding="utf-8") as fh:
                json.dump({"n": len(self.passages), "df": dict(sorted(df.items()))}, fh, ensure_ascii=False)
            retrieve.BM25Index.build([p["text"] for p in self.passages]).save(tmp / retrieve.BM25_DIR)
            atomic_write_json(tmp / "manifest.json", manifest)
        return Path(out)


def _dist(xs: list[int]) -> dict:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs)
    q = np.percentile(a, [10, 25, 50, 75, 90])
    return {"n": len(xs), "mean": round(float(a.mean()), 1), "p10": float(q[0]), "p25": float(q[1]),
            "median": float(q[2]), "p75": float(q[3]), "p90": float(q[4])}


def _ks(a: list[int], b: list[int]) -> float | None:
    """Two-sample Kolmogorov–Smirnov statistic (0 = identical length distributions)."""
    if not a or not b:
        return None
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return round(float(np.abs(fa - fb).max()), 4)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", str(path), exc.lineno) from None


def _read_jsonl(path: Path, builder: Builder):
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                builder.skip(path, lineno, f"invalid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                builder.skip(path, lineno, "not a JSON object")
                continue
            yield lineno, obj


# ----------------------------------------------------------------------------------------------------------
# DeepResearchGym
# ----------------------------------------------------------------------------------------------------------

_DOC_HEAD = re.compile(r"^Doc \d+ \(URL: (?P<url>.*?), ClueWebID: (?P<id>[^)\s]+)\)\s*$", re.M)
_RESULT = re.compile(r"<\|begin_search_result\|>(.*?)(?:<\|end_search_result\|>|\Z)", re.S)


def parse_searcho1(text: str) -> dict[str, str]:
    """ClueWeb22 documents in a Search-o1 trace's result blocks: ``{ClueWebID: text}``."""
    docs: dict[str, str] = {}
    for block in _RESULT.findall(text):
        heads = list(_DOC_HEAD.finditer(block))
        for i, m in enumerate(heads):
            end = heads[i + 1].start() if i + 1 < len(heads) else len(block)
            body = block[m.end():end].strip()
            if body and len(body) > len(docs.get(m.group("id"), "")):
                docs[m.group("id")] = body
    return docs


def _check_drgym_layout(src: Path) -> None:
    if not src.is_dir():
        raise InputError("not a directory", str(src))
    missing = [name for name in ("queries", "key_point") if not (src / name).is_dir()]
    if missing:
        raise InputError(
            f"not a DeepResearchGym folder: missing {', '.join(m + '/' for m in missing)} (expected queries/*.jsonl, "
            "key_point/<qid>.json + <qid>_aggregated.json, optional Searcho1_ClueWeb22/*.a)", str(src))
    if not list((src / "queries").glob("*.jsonl")):
        raise InputError("queries/ has no *.jsonl file", str(src))


def build_drgym(sources: list[str], out: str | Path, chunk_words: int = DEFAULT_CHUNK_WORDS, seed: int = 0,
                max_queries: int | None = None, progress: bool = True) -> Path:
    from tqdm.auto import tqdm

    b = Builder("drgym", sources, chunk_words, seed)
    fulltext: dict[str, str] = {}
    doc_spans: dict[str, list[tuple[str, set[str]]]] = {}
    gt_docs: set[str] = set()
    for src in map(Path, sources):
        _check_drgym_layout(src)
        qfiles = sorted((src / "queries").glob("*.jsonl"))
        new_ids: list[str] = []
        for qf in qfiles:
            for lineno, obj in _read_jsonl(qf, b):
                for d in obj.get("DocStream") or []:
                    if isinstance(d, dict) and d.get("CluewebID") and isinstance(d.get("CluewebDocument"), str):
                        if len(d["CluewebDocument"]) > len(fulltext.get(d["CluewebID"], "")):
                            fulltext[d["CluewebID"]] = d["CluewebDocument"]
                qid, query = obj.get("id"), obj.get("query")
                if qid is None or not isinstance(query, str) or not query.strip():
                    b.skip(qf, lineno, "needs fields 'id' and 'query'")
                    continue
                qid = str(qid)
                if qid in b.queries:
                    if b.queries[qid]["query"] != query.strip():
                        b.skip(qf, lineno, f"query id {qid} repeats with a different text (kept the first)")
                    continue
                if max_queries is not None and len(b.queries) >= max_queries:
                    continue
                b.queries[qid] = {"id": qid, "query": query.strip(), "key_points": [], "meta": {"source": str(qf)}}
                new_ids.append(qid)
        kp_dir = src / "key_point"
        for qid in new_ids:
            per_doc_path, agg_path = kp_dir / f"{qid}.json", kp_dir / f"{qid}_aggregated.json"
            if not per_doc_path.exists() or not agg_path.exists():
                b.skip(agg_path if per_doc_path.exists() else per_doc_path, None, f"query {qid}: key-point file missing")
                del b.queries[qid]
                continue
            try:
                per_doc, agg = _read_json(per_doc_path), _read_json(agg_path)
                kps = _drgym_key_points(qid, per_doc, agg, per_doc_path, agg_path, b)
            except InputError as exc:
                b.skip(exc.file, exc.line, exc.reason)
                del b.queries[qid]
                continue
            if not kps:
                b.skip(agg_path, None, f"query {qid}: no aggregated key points")
                del b.queries[qid]
                continue
            b.queries[qid]["key_points"] = [{"id": k["id"], "text": k["text"]} for k in kps]
            for k in kps:
                for doc, span, labs in k["spans"]:
                    doc_spans.setdefault(doc, []).append((span, labs))
                    gt_docs.add(doc)
        so_dir = src / "Searcho1_ClueWeb22"
        if so_dir.is_dir():
            wanted = set(new_ids) if max_queries is not None else None
            for a in sorted(so_dir.glob("*.a")):
                if wanted is not None and a.stem not in wanted:
                    continue
                try:
                    docs = parse_searcho1(a.read_text(encoding="utf-8", errors="replace"))
                except OSError as exc:
                    b.skip(a, None, f"unreadable: {exc}")
                    continue
                for did, text in docs.items():
                    if len(text) > len(fulltext.get(did, "")):
                        fulltext[did] = text
        else:
            b.notes["sources_without_Searcho1_ClueWeb22"] += 1

    # 1) ground-truth documents: full text where known (spans located, never split), else their spans
    gt_lengths: list[int] = []
    target = lambda: chunk_words  # noqa: E731
    for doc in tqdm(sorted(gt_docs), desc="ground-truth docs", disable=not progress, leave=False):
        spans = doc_spans[doc]
        atoms: list[Atom] = []
        if doc in fulltext:
            found, missing = match_spans(fulltext[doc], spans)
            b.notes["spans_located_in_full_text"] += len(found)
            b.notes["spans_not_in_full_text"] += len(missing)
            atoms = split_long(text_atoms(fulltext[doc], found), 2 * chunk_words)
            chunks = pack(atoms, target)
            if missing:
                chunks += pack(span_atoms(missing), target)
        else:
            b.notes["spans_from_span_only_docs"] += len(spans)
            chunks = pack(span_atoms(spans), target)
        for c in chunks:
            b.add_passage(doc, c, "ground_truth")
            if c.labels:
                gt_lengths.append(c.words)
    # 2) distractors: other full texts, chunked to lengths drawn from the relevant passages' distribution
    pool = sorted(gt_lengths) or [chunk_words]
    others = sorted(d for d in fulltext if d not in gt_docs)
    for doc in tqdm(others, desc="distractor docs", disable=not progress, leave=False):
        rng = _rng(seed, doc)
        draw = lambda: max(8, pool[rng.randrange(len(pool))])  # noqa: E731
        for c in pack(split_long(text_atoms(fulltext[doc], []), 2 * chunk_words), draw):
            b.add_passage(doc, c, "distractor")
    b.notes["full_text_docs"] = len(fulltext)
    b.notes["ground_truth_docs"] = len(gt_docs)
    b.notes["ground_truth_docs_with_full_text"] = len(gt_docs & set(fulltext))
    return b.write(out)


def _drgym_key_points(qid, per_doc, agg, per_doc_path, agg_path, b: Builder) -> list[dict]:
    """Aggregated key points with the spans (doc, text, {kp id}) of the per-document points they merge.

    Per-document points are numbered globally in file order (documents in order, points in order);
    ``original_point_number`` refers to that numbering.
    """
    if not isinstance(per_doc, dict) or not isinstance(per_doc.get("key_points"), dict):
        raise InputError("field 'key_points' must be an object {doc id: [points]}", str(per_doc_path))
    if not isinstance(agg, dict) or not isinstance(agg.get("key_points"), list):
        raise InputError("field 'key_points' must be a list", str(agg_path))
    originals: list[tuple[str, list[str]]] = []
    for doc, points in per_doc["key_points"].items():
        doc_id = f"null:{qid}" if doc in (None, "", "null", "None") else str(doc)
        for p in points or []:
            spans = [s for s in (p.get("spans") or []) if isinstance(s, str) and s.strip()] if isinstance(p, dict) else []
            originals.append((doc_id, spans))
    out = []
    for i, k in enumerate(agg["key_points"]):
        if not isinstance(k, dict) or not isinstance(k.get("point_content"), str):
            b.skip(agg_path, None, f"key_points[{i}]: needs 'point_content'")
            continue
        kid = f"{qid}#{k.get('point_number', i + 1)}"
        spans = []
        for n in k.get("original_point_number") or []:
            if not isinstance(n, int) or not 1 <= n <= len(originals):
                b.skip(agg_path, None, f"key_points[{i}].original_point_number: {n!r} outside 1..{len(originals)}")
                continue
            doc, texts = originals[n - 1]
            spans += [(doc, s, {kid}) for s in texts]
        if not spans:
            b.unreachable.append({"query": qid, "key_point": kid, "reason": "no source span (no original point with spans)"})
        out.append({"id": kid, "text": k["point_content"].strip(), "spans": spans})
    return out


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
            data = _read_json(f)
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
            b.passages[pi]["labels"] = sorted(set(b.passages[pi]["labels"]) | {kid})
        if not kps:  # no decomposition: each supporting paragraph is a key point
            for n, p in enumerate([p for p in paras if isinstance(p, dict) and p.get("is_supporting")], 1):
                kid = f"{qid}#{n}"
                kps.append({"id": kid, "text": p.get("title", "")})
                pi = passage(str(p.get("title", "")), str(p.get("paragraph_text", "")))
                if pi is None:
                    continue
                b.passages[pi]["labels"] = sorted(set(b.passages[pi]["labels"]) | {kid})
        if not kps:
            b.skip(f, None, f"{where}: question {qid} has no decomposition and no supporting paragraph")
            continue
        b.queries[qid] = {"id": qid, "query": q["question"].strip(), "key_points": kps,
                          "meta": {"answer": q.get("answer"), "decomposition": [s.get("question") for s in steps]}}
    return b.write(out)


def build(fmt: str, sources: list[str], out: str | Path, **kw) -> Path:
    if fmt == "drgym":
        return build_drgym(sources, out, **kw)
    if fmt == "musique":
        kw.pop("chunk_words", None)
        kw.pop("progress", None)
        return build_musique(sources, out, **kw)
    raise BranchgateError(f"unknown environment format {fmt!r}; one of {', '.join(FORMATS)}")


# ----------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Query:
    id: str
    query: str
    key_points: list[dict]
    reachable: list[str]
    meta: dict

    @property
    def kp_ids(self) -> list[str]:
        return [k["id"] for k in self.key_points]


class Env:
    """A loaded environment: queries, passages with labels, BM25 index, word statistics."""

    def __init__(self, path: Path, manifest: dict, queries: list[Query], passages: list[dict], df: dict, n_docs: int,
                 bm25: retrieve.BM25Index):
        self.path, self.manifest, self.queries = path, manifest, queries
        self.query_by_id = {q.id: q for q in queries}
        self.ids = [p["id"] for p in passages]
        self.texts = [p["text"] for p in passages]
        self.docs = [p["doc"] for p in passages]
        self.labels = [p["labels"] for p in passages]
        self.index_of = {pid: i for i, pid in enumerate(self.ids)}
        self.df, self.n_docs = df, n_docs
        self.bm25 = bm25
        self._dense: dict[str, retrieve.DenseIndex] = {}
        self.name = manifest.get("name") or path.name

    def idf(self, word: str) -> float:
        return math.log((self.n_docs + 1) / (self.df.get(word, 0) + 0.5))

    def dense(self, encoder_id: str) -> retrieve.DenseIndex:
        if encoder_id not in self._dense:
            self._dense[encoder_id] = retrieve.DenseIndex.load(self.path, encoder_id, len(self.ids))
        return self._dense[encoder_id]

    def fingerprint(self) -> str:
        """Identity of the environment's content (manifest hash): recorded in every trace's config."""
        text = json.dumps({k: self.manifest.get(k) for k in ("format", "n_queries", "n_passages", "n_key_points",
                                                              "chunk_words", "seed", "passage_words")}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


REQUIRED = ("manifest.json", "queries.jsonl", "passages.jsonl.gz")


def load(path: str | Path) -> Env:
    """Load an environment folder; ``sample`` is the bundled MuSiQue sample."""
    if str(path) == "sample":
        from branchgate.pipeline.sample import sample_path

        path = sample_path()
    path = Path(path)
    if not path.is_dir():
        raise InputError("environment folder not found (build one with `branchgate env build`, or use --env sample)", str(path))
    missing = [n for n in REQUIRED if not (path / n).exists()]
    if missing:
        raise InputError(f"not a branchgate environment: missing {', '.join(missing)} (build it with `branchgate env build`)", str(path))
    manifest = _read_json(path / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("env_version", 0) > ENV_VERSION:
        raise InputError(f"unsupported environment version {manifest.get('env_version') if isinstance(manifest, dict) else '?'}", str(path / "manifest.json"))
    queries = []
    with open(path / "queries.jsonl", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                queries.append(Query(str(q["id"]), q["query"], q["key_points"], q.get("reachable", []), q.get("meta", {})))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise InputError(f"bad query record ({exc})", str(path / "queries.jsonl"), lineno) from None
    passages = []
    try:
        with gzip.open(path / "passages.jsonl.gz", "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                try:
                    p = json.loads(line)
                    passages.append({"id": p["id"], "doc": p.get("doc", ""), "text": p["text"], "labels": p.get("labels") or []})
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise InputError(f"bad passage record ({exc})", str(path / "passages.jsonl.gz"), lineno) from None
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read ({exc})", str(path / "passages.jsonl.gz")) from None
    if not queries or not passages:
        raise InputError("environment has no queries or no passages", str(path))
    stats_path = path / "stats.json.gz"
    if stats_path.exists():
        with gzip.open(stats_path, "rt", encoding="utf-8") as fh:
            stats = json.load(fh)
        df, n_docs = stats["df"], int(stats["n"])
    else:
        df = Counter()
        for p in passages:
            df.update(set(content_words(p["text"])))
        df, n_docs = dict(df), len(passages)
    if (path / retrieve.BM25_DIR).is_dir():
        bm25 = retrieve.BM25Index.load(path / retrieve.BM25_DIR, len(passages))
    else:  # the bundled sample ships without its index: building it takes milliseconds
        bm25 = retrieve.BM25Index.build([p["text"] for p in passages])
    return Env(path, manifest, queries, passages, df, n_docs, bm25)
