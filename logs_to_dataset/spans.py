"""Normalisation and span matching for DeepResearchGym key points (core-safe, stdlib only): which key points a
document shows. Used by the Search-o1 reader and the drgym environment builder alike (``logs_to_dataset/drgym.py``
has the format itself).

**Normalisation** (``normalize_with_map``, ``normalize``): NFKC, case-folded, typographic quotes/dashes and
no-break spaces folded (``FOLD``), every run of non-alphanumerics collapsed to one space, with a map back to
original character offsets (the environment protects matched spans from chunk boundaries with it). This is
the environment's former rule with ``casefold`` (the reader's) in place of ``lower``: quotes copied by an
annotator often differ from the page in punctuation and spacing only, and the offset map is needed anyway.

**Labels of a document** (``SpanIndex.labels``; ``SpanIndex.locate`` gives the same as character ranges):
the key points quoted from that document (by its id, whether or not the quote is found in its text), plus
the key points one of whose spans, quoted from ANY other document, is located in its text and has at least
``MIN_SPAN_WORDS`` words (whitespace-separated, as written). The environment labels a document's passages
with what ``locate`` finds in them, and a passage made of each own span it could not find. Locating a span
(``find_span``): the normalised span inside the normalised text; else, for a span with ellipses, all its
pieces of at least four words; else, for a span of at least twelve words, its first and last eight words in
order within twice its length. The reader matched other documents' spans (exactly, ≥ 5 words) but the
environment did not, so a distractor page quoting a ground-truth sentence verbatim carried no label there;
the environment located only a document's own spans, with the ellipsis and head/tail rules the reader lacked.
Both halves are kept. Shorter spans of other documents are too generic to prove coverage. ``SpanIndex``
tries another document's span only when the text holds one of its word trigrams (``Needle.anchors``), which
``find`` cannot succeed without, so the index gives the same labels as trying every span.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from branchgate.logs_to_dataset.drgym import QueryKeyPoints, doc_key

MIN_SPAN_WORDS = 5
FOLD = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201a": "'",
    "\u201b": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "-",
    "\u2212": "-",
    "\u00a0": " ",
}
_FOLD_TABLE = str.maketrans(FOLD)

# ----------------------------------------------------------------------------------------------------------
# normalisation
# ----------------------------------------------------------------------------------------------------------

_NON_ASCII = re.compile(r"([^\x00-\x7f]+)")
_WORD = re.compile(r"\S+")
# ASCII: letters and digits lower-cased, anything else a space (bytes.translate: the fast, common case)
_ASCII = bytes(c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122) else 32 for c in range(256))


def fold(text: str) -> str:
    """Typographic quotes, dashes, minus and no-break space as their plain ASCII forms."""
    return text.translate(_FOLD_TABLE)


@lru_cache(maxsize=65536)
def _char_form(ch: str) -> str:
    """One non-ASCII character folded, NFKC-normalised, case-folded; non-alphanumerics as spaces."""
    return "".join(c if c.isalnum() else " " for c in unicodedata.normalize("NFKC", FOLD.get(ch, ch)).casefold())


def _spaced(text: str, with_map: bool = False) -> tuple[str, list[int] | None]:
    """Every character in its compared form (alphanumerics kept, anything else a space) and, with
    ``with_map``, the original index of every output character (None: its own index, as for ASCII text)."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII).decode("ascii"), None
    pieces = _NON_ASCII.split(text)
    if not with_map:
        pieces[::2] = [p.encode("ascii").translate(_ASCII).decode("ascii") for p in pieces[::2]]
        pieces[1::2] = ["".join(map(_char_form, p)) for p in pieces[1::2]]
        return "".join(pieces), None
    parts: list[str] = []
    src: list[int] = []
    pos = 0
    for i, piece in enumerate(pieces):
        if i % 2 == 0:  # ASCII: one character for one
            parts.append(piece.encode("ascii").translate(_ASCII).decode("ascii"))
            src.extend(range(pos, pos + len(piece)))
        else:
            for j, ch in enumerate(piece, pos):
                form = _char_form(ch)
                parts.append(form)
                src.extend([j] * len(form))
        pos += len(piece)
    return "".join(parts), src


def normalize(text: str) -> str:
    """Text as span matching compares it: per character ``FOLD``, NFKC and casefold; the runs of alphanumerics
    joined by single spaces (so punctuation and spacing never matter)."""
    return " ".join(_spaced(text)[0].split())


def normalize_with_map(text: str) -> tuple[str, list[int]]:
    """``normalize(text)`` and, per normalised character, the index of the original character it came from
    (a separating space: the first character after the previous run)."""
    u, src = _spaced(text, with_map=True)
    out: list[str] = []
    index: list[int] = []
    prev = -1
    for m in _WORD.finditer(u):
        s, e = m.span()
        if prev >= 0:
            out.append(" ")
            index.append(src[prev] if src is not None else prev)
        out.append(m.group())
        index.extend(src[s:e] if src is not None else range(s, e))
        prev = e
    return "".join(out), index


# ----------------------------------------------------------------------------------------------------------
# span matching
# ----------------------------------------------------------------------------------------------------------

_ELLIPSIS = re.compile(r"\.\.\.|\u2026|\[\.\.\.\]")


@dataclass
class Needle:
    """A span prepared for ``find``: its normalised text, ellipsis pieces and head/tail anchors."""

    norm: str
    pieces: list[str]
    head: str = ""
    tail: str = ""

    @classmethod
    def of(cls, span: str) -> Needle:
        norm = normalize(span)
        pieces = [p for p in (normalize(x) for x in _ELLIPSIS.split(span)) if len(p.split()) >= 4]
        ws = norm.split()
        head, tail = (" ".join(ws[:8]), " ".join(ws[-8:])) if len(ws) >= 12 else ("", "")
        return cls(norm, pieces if len(pieces) > 1 else [], head, tail)

    def find(self, norm_doc: str) -> tuple[int, int] | None:
        """Normalised position in a normalised document: exact, else all ellipsis pieces, else head … tail."""
        if not self.norm:
            return None
        i = norm_doc.find(self.norm)
        if i >= 0:
            return i, i + len(self.norm)
        if self.pieces:
            locs = [(norm_doc.find(p), len(p)) for p in self.pieces]
            if all(s >= 0 for s, _ in locs):
                return min(s for s, _ in locs), max(s + ln for s, ln in locs)
        if self.head:
            s = norm_doc.find(self.head)
            if s >= 0:
                e = norm_doc.find(self.tail, s)
                if e >= 0 and e + len(self.tail) - s <= 2 * len(self.norm):
                    return s, e + len(self.tail)
        return None

    def anchors(self) -> list[str]:
        """Word trigrams one of which a normalised text must hold, whole and word-aligned, for ``find`` to
        succeed; [] when there is none to rely on. A match may start or end inside a word, so a text's anchor
        is its second to fourth word (it needs five words): the exact and head/tail rules need the span's,
        the ellipsis rule its longest piece's."""
        texts = [self.norm, *([max(self.pieces, key=lambda p: p.count(" "))] if self.pieces else [])]
        out = []
        for text in texts:
            ws = text.split()
            if len(ws) < 5:
                return []
            out.append(" ".join(ws[1:4]))
        return out


def find_span(norm_doc: str, span: str) -> tuple[int, int] | None:
    """Normalised position of ``span`` (as written) in a normalised document, or None (see ``Needle.find``)."""
    return Needle.of(span).find(norm_doc)


def _trigrams(norm: str) -> set[str]:
    ws = norm.split()
    return {f"{x} {y} {z}" for x, y, z in zip(ws, ws[1:], ws[2:])}


@dataclass
class _Entry:
    span: str  # as first written
    doc: str  # doc key it was quoted from
    labels: set[str]
    cross: bool  # long enough to label other documents
    needle: Needle


class SpanIndex:
    """Every span of some queries' key points, to label documents by the rule in the module docstring."""

    def __init__(self, key_points: Iterable[QueryKeyPoints]):
        self.entries: list[_Entry] = []
        self.own: dict[str, list[int]] = {}  # doc key -> entries quoted from it
        self.names: dict[str, str] = {}
        self._by_anchor: dict[str, list[int]] = {}
        self._always: list[int] = []  # cross-document entries without an anchor: always tried
        seen: dict[tuple[str, str], int] = {}
        for q in key_points:
            for doc, name in q.names.items():
                self.names.setdefault(doc, name)
            for k in q.points:
                for doc, span in k.sources:
                    key = (doc, normalize(span))
                    if not key[1]:
                        continue
                    if key in seen:
                        self.entries[seen[key]].labels.add(k.id)
                        continue
                    seen[key] = len(self.entries)
                    needle = Needle.of(span)
                    self.entries.append(_Entry(span, doc, {k.id}, len(span.split()) >= MIN_SPAN_WORDS, needle))
                    self.own.setdefault(doc, []).append(seen[key])
        for i, e in enumerate(self.entries):
            if not e.cross:
                continue
            anchors = e.needle.anchors()
            if not anchors:
                self._always.append(i)
            for a in anchors:
                self._by_anchor.setdefault(a, []).append(i)
        self._anchors = set(self._by_anchor)

    @property
    def documents(self) -> list[str]:
        """Keys of the documents spans were quoted from (``null:<qid>`` included), sorted."""
        return sorted(self.own)

    def own_spans(self, doc_id: str) -> list[tuple[str, set[str]]]:
        """The spans quoted from a document: (span as written, key points)."""
        return [(self.entries[i].span, set(self.entries[i].labels)) for i in self.own.get(doc_key(doc_id), ())]

    def _scan(self, doc_id: str | None, text: str) -> tuple[list[tuple[int, int, int]], list[int]]:
        """(entry, start, end) of the spans located in ``normalize(text)``, and the document's own entries not
        located. Other documents' entries are tried only when long enough and one of their anchors is there."""
        key = doc_key(doc_id) if doc_id is not None else None
        own = self.own.get(key, []) if key is not None else []
        norm = normalize(text)
        cands = set(self._always)
        for g in _trigrams(norm) & self._anchors if self._anchors else ():
            cands.update(self._by_anchor[g])
        cands.difference_update(own)
        located, missing = [], []
        for i in [*own, *sorted(cands)]:
            loc = self.entries[i].needle.find(norm)
            if loc is not None:
                located.append((i, *loc))
            elif self.entries[i].doc == key:  # one of its own spans
                missing.append(i)
        return located, missing

    def locate(
        self, doc_id: str | None, text: str
    ) -> tuple[list[tuple[int, int, set[str]]], list[tuple[str, set[str]]]]:
        """Spans located in a document's text: ((start, end, key points) in ``text``'s character offsets,
        its own spans that were not located: (span, key points)). ``doc_id`` None: no own spans."""
        located, missing = self._scan(doc_id, text)
        index = normalize_with_map(text)[1] if located else []
        return (
            [(index[s], index[t - 1] + 1, set(self.entries[i].labels)) for i, s, t in located],
            [(self.entries[i].span, set(self.entries[i].labels)) for i in missing],
        )

    def labels(self, doc_id: str | None, text: str, own: bool = True) -> set[str]:
        """Key points a document covers: its own (by id; ``own=False``: only those whose span is located) and
        those of other documents' spans located in its text."""
        located, missing = self._scan(doc_id, text)
        return {k for i in [*(i for i, _, _ in located), *(missing if own else ())] for k in self.entries[i].labels}
