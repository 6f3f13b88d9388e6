"""Chunking for environment builds (``env_build.py``): documents become sentence "atoms" (the sentences one
labelled span touches merge into one, so a span is never split), packed greedily into passages of about a
target length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from branchgate.logs_to_dataset.spans import normalize
from branchgate.pipeline.textutil import sentence_ranges


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
        atoms.append(Atom(text[units[i][0] : units[j][1]], set().union(*labels[i : j + 1]), any(protected[i : j + 1])))
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
            out.append(Atom(" ".join(ws[i : i + limit]), set(a.labels)))
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
    return Atom(
        " ".join(a.text for a in atoms), set().union(*(a.labels for a in atoms)), any(a.protected for a in atoms)
    )


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
