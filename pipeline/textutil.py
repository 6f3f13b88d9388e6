"""Small text helpers shared by the environment builder and the offline generator (stdlib only).

``normalize_with_map`` is what span matching uses: NFKC, lower case, typographic quotes/dashes folded,
every run of non-alphanumerics collapsed to one space — with a map back to original character offsets
so a matched span can be protected from chunk boundaries in the original text.
"""

from __future__ import annotations

import re
import unicodedata

STOPWORDS = frozenset("""
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
""".split())

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_FOLD = {"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u201c": '"', "\u201d": '"',
         "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00a0": " "}


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters/digits, inner apostrophes and hyphens kept)."""
    return [w.strip("'-").lower() for w in _WORD.findall(fold(text)) if w.strip("'-")]


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOPWORDS and len(w) > 1]


def fold(text: str) -> str:
    return "".join(_FOLD.get(c, c) for c in text)


def normalize_with_map(text: str) -> tuple[str, list[int]]:
    """Normalised text and, per normalised character, the index of the original character it came from."""
    out: list[str] = []
    index: list[int] = []
    for i, ch in enumerate(text):
        piece = unicodedata.normalize("NFKC", _FOLD.get(ch, ch)).lower()
        for c in piece:
            if c.isalnum():
                out.append(c)
                index.append(i)
            elif out and out[-1] != " ":
                out.append(" ")
                index.append(i)
    while out and out[-1] == " ":
        out.pop()
        index.pop()
    return "".join(out), index


def normalize(text: str) -> str:
    return normalize_with_map(text)[0]


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
