"""Small text helpers shared by the environment builder and the offline generator (stdlib only).

The text normalisation of span matching (``normalize``, ``normalize_with_map``) and the typographic ``fold``
used here are ``logs_to_dataset/drgym.py``'s, shared with the Search-o1 reader.
"""

from __future__ import annotations

import re

from branchgate.logs_to_dataset.spans import fold

STOPWORDS = frozenset(
    """
a about above after again against all also am an and any are aren't as at be because been before being
below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during
each etc few for from further had hadn't has hasn't have haven't having he her here hers herself him himself
his how however i if in into is isn't it it's its itself just let's like may me might more most much must
mustn't my myself no nor not now of off on once one only or other ought our ours ourselves out over own
per same shall she should shouldn't since so some such than that that's the their theirs them themselves
then there there's these they this those though through thus to too under until up upon us very via was
wasn't we were weren't what what's when where which while who whom whose why will with within without
won't would wouldn't yet you your yours yourself yourselves s t d ll m re ve also get got many make
made use used using well even still based way ways new one two three first second within among
""".split()
)

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters/digits, inner apostrophes and hyphens kept)."""
    return [w.strip("'-").lower() for w in _WORD.findall(fold(text)) if w.strip("'-")]


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOPWORDS and len(w) > 1]


_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n+")


def sentence_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of sentences/lines (non-empty, whitespace trimmed)."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for m in _SENT.finditer(text):
        ranges.append((start, m.start()))
        start = m.end()
    ranges.append((start, len(text)))
    out = []
    for s, e in ranges:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_ranges(text)]


def word_count(text: str) -> int:
    return len(text.split())
