"""The Gate's text side (``GateTexts``, a mixin of ``gate.Gate``): cleaning texts, tokenising them
(``padded_tokens``), encoding them with the graph's text tower (length buckets, text groups) and the LRU cache
of their embeddings.

It uses the attributes ``Gate.__init__`` sets: ``session``, ``parts``, ``text_groups`` and ``_pool``,
``tokenizer``, ``_wordpiece``, ``pad_id``, ``dim``, ``bucketing``, ``cache_size``, ``_cache``, ``_lock`` and
``_max_chars``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from branchgate.features import structured_features
from branchgate.inference.schedule import balanced_groups, length_buckets

CHARS_PER_TOKEN_LIMIT = 64  # texts are cut to max_length * this many characters before tokenising
BUCKET_OVERHEAD_TOKENS = 16  # one extra graph run costs about as much as this many padded tokens


class GateTexts:
    """Texts → embeddings for the Gate, cached (a mixin: ``gate.Gate`` is the class)."""

    def embed(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit-norm embeddings of ``texts`` (zero rows for empty texts), computed by the graph and cached."""
        texts = [self._clean(t) for t in texts]
        new, cached, rows = self._plan(texts)
        fresh = np.zeros((len(new), self.dim), np.float32)
        if new and not self.bucketing:
            order = np.argsort([len(t) for t in new], kind="stable")  # similar lengths share a batch
            for start in range(0, len(new), batch_size):
                chunk = order[start : start + batch_size]
                fresh[chunk] = self._encode([new[i] for i in chunk])
        elif new:
            tokens = self._tokens(new)
            lengths = tokens["attention_mask"].sum(1)
            order = np.argsort(lengths, kind="stable")
            for start in range(0, len(new), batch_size):
                chunk = order[start : start + batch_size]
                for g in length_buckets(lengths[chunk], BUCKET_OVERHEAD_TOKENS):
                    idx = chunk[g]
                    fresh[idx] = self._encode_rows(tokens, idx, lengths)
        if new:
            self._remember(new, fresh)
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, row in enumerate(rows):
            if row is not None:
                out[i] = fresh[row[1]] if row[0] == "new" else cached[row[1]]
        return out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    @property
    def cache_len(self) -> int:
        return len(self._cache)

    # -- internals -------------------------------------------------------------------------------------
    def _clean(self, text) -> str:
        """Texts are stripped (as in training); empty ones become "" (→ zero row); long texts are cut;
        unencodable characters are replaced."""
        if text is None:
            return ""
        text = str(text).strip()
        if not text:
            return ""
        if len(text) > self._max_chars:
            text = text[: self._max_chars]
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from a bad JSON escape
            text = text.encode("utf-8", "replace").decode("utf-8")
        return text

    def _plan(self, texts: Sequence[str]):
        """Split texts into new (to encode) and cached rows; rows[i] = None (empty) | ("new", j) | ("cached", j)."""
        new: list[str] = []
        new_pos: dict[str, int] = {}
        cached: list[np.ndarray] = []
        cached_pos: dict[str, int] = {}
        rows = []
        with self._lock:
            for t in texts:
                if not t:
                    rows.append(None)
                elif t in new_pos:
                    rows.append(("new", new_pos[t]))
                elif t in cached_pos:
                    rows.append(("cached", cached_pos[t]))
                else:
                    vec = self._cache.get(t)
                    if vec is not None:
                        self._cache.move_to_end(t)
                        cached_pos[t] = len(cached)
                        cached.append(vec)
                        rows.append(("cached", cached_pos[t]))
                    else:
                        new_pos[t] = len(new)
                        new.append(t)
                        rows.append(("new", new_pos[t]))
        return new, cached, rows

    def _encode_rows(self, tokens: dict[str, np.ndarray], idx: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Embeddings of the tokenised rows ``idx`` (cut to their longest; padding is on the right)."""
        width = int(lengths[idx].max())
        k = 0 if self.parts else 1  # no candidates: a graph with parts skips its head
        feed = {
            "input_ids": tokens["input_ids"][idx, :width],
            "attention_mask": tokens["attention_mask"][idx, :width],
            "cached_emb": np.zeros((0, self.dim), np.float32),
            "root_idx": np.zeros(1, np.int64),
            "frame_idx": np.zeros(1, np.int64),
            "goal_idx": np.zeros(1, np.int64),
            "retained_idx": np.zeros(1, np.int64),
            "cand_idx": np.zeros(k, np.int64),
            "features": structured_features(0, k, 0),
        }
        return np.asarray(self.session.run(["text_emb"], feed)[0], np.float32)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts``: with text groups, in groups of about equal token counts encoded at once
        (one from this thread, the others from the pool's); else in one run."""
        tokens = self._tokens(texts)
        lengths = tokens["attention_mask"].sum(1)
        n = min(self.text_groups, len(texts))
        if n < 2:
            return self._encode_rows(tokens, np.arange(len(texts)), lengths)
        groups = balanced_groups(lengths, n)
        jobs = [self._pool.submit(self._encode_rows, tokens, g, lengths) for g in groups[1:]]
        out = np.empty((len(texts), self.dim), np.float32)
        out[groups[0]] = self._encode_rows(tokens, groups[0], lengths)
        for g, job in zip(groups[1:], jobs):
            out[g] = job.result()
        return out

    def _encode_short_first(self, new, cached, rows, tokens):
        """Texts of very different lengths: encode the shorter groups first (less padding), so the decision
        run itself encodes only the longest group. Returns the re-planned (new, cached, rows, tokens)."""
        lengths = tokens["attention_mask"].sum(1)
        groups = length_buckets(lengths, BUCKET_OVERHEAD_TOKENS)
        if len(groups) == 1:
            return new, cached, rows, tokens
        cached = list(cached)
        moved: dict[int, int] = {}
        for g in groups[:-1]:
            emb = self._encode_rows(tokens, g, lengths)
            self._remember([new[j] for j in g], emb)
            for p, j in enumerate(g):
                moved[int(j)] = len(cached)
                cached.append(emb[p])
        final = groups[-1]
        pos = {int(j): p for p, j in enumerate(final)}
        rows = [
            r if r is None or r[0] == "cached" else (("new", pos[r[1]]) if r[1] in pos else ("cached", moved[r[1]]))
            for r in rows
        ]
        width = int(lengths[final].max())
        tokens = {
            "input_ids": tokens["input_ids"][final, :width],
            "attention_mask": tokens["attention_mask"][final, :width],
        }
        return [new[j] for j in final], cached, rows, tokens

    def _tokens(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Token ids padded on the right to the longest text, and the attention mask. The graph needs at
        least one text to encode: an all-cached decision feeds an empty dummy."""
        return padded_tokens(list(texts) if texts else [""], self.tokenizer, self._wordpiece, self.pad_id)

    def _remember(self, texts: Sequence[str], emb: np.ndarray) -> None:
        if not texts or self.cache_size <= 0:
            return
        with self._lock:
            for t, vec in zip(texts, emb):
                self._cache[t] = np.array(vec, dtype=np.float32, copy=True)
                self._cache.move_to_end(t)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


def padded_tokens(texts: Sequence[str], tokenizer, wordpiece, pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids`` / ``attention_mask`` [N, longest] of ``texts`` (N ≥ 1), padded on the right with ``pad_id``:
    plain ASCII through ``wordpiece`` (``checked_wordpiece``, or None), the rest through ``tokenizer``.
    The Gate's tokenising, and the dataset build's ONNX encoder's (``export.onnx_encoder``)."""
    rows = [wordpiece.ids(t) for t in texts] if wordpiece is not None else [None] * len(texts)
    slow = [i for i, r in enumerate(rows) if r is None]
    if slow:  # encode_batch_fast (tokenizers ≥ 0.21) skips character offsets the Gate never reads
        encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
        for i, enc in zip(slow, encode([texts[i] for i in slow])):
            rows[i] = enc.ids
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    real = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.full(real.shape, pad_id, np.int64)
    ids[real] = np.fromiter(chain.from_iterable(rows), np.int64, int(lengths.sum()))
    return {"input_ids": ids, "attention_mask": real.astype(np.int64)}
