"""Embedding cache reuse: each distinct text is encoded once across calls, instances and datasets."""

from __future__ import annotations

import numpy as np

from branchgate.data.embedding_cache import EmbeddingCache
from branchgate.models.encoder import LazyEncoder, resolve


class Counting:
    """The real encoder, counting the texts it is asked to encode."""

    def __init__(self, encoder, id=None):
        self.encoder, self.id, self.dim, self.calls = encoder, id or encoder.id, encoder.dim, []

    def encode(self, texts, **kwargs):
        self.calls.append(list(texts))
        return self.encoder.encode(texts, **kwargs)


def test_each_text_encoded_once_across_instances(encoder, tmp_path):
    path = tmp_path / "emb.sqlite"
    enc = Counting(encoder)
    cache = EmbeddingCache(enc, path)
    texts = ["effects of coffee on sleep", "history of wind turbines", "effects of coffee on sleep"]
    first = cache.get(texts)
    assert enc.calls == [["effects of coffee on sleep", "history of wind turbines"]]
    assert (cache.hits, cache.misses) == (0, 2)
    np.testing.assert_allclose(first[0], first[2])
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    cache.close()

    again = EmbeddingCache(enc, path)  # a new run over the same file
    second = again.get(["history of wind turbines", "a brand new text"])
    assert enc.calls[1:] == [["a brand new text"]]
    assert (again.hits, again.misses) == (1, 1)
    np.testing.assert_allclose(second[0], first[1])
    assert again.stats()["encoder"] == encoder.id
    again.close()


def test_cache_is_keyed_by_encoder_id(encoder, tmp_path):
    path = tmp_path / "emb.sqlite"
    EmbeddingCache(Counting(encoder), path).get(["same text"])
    other = Counting(encoder, id="another-encoder")
    cache = EmbeddingCache(other, path)
    cache.get(["same text"])
    assert cache.misses == 1 and other.calls == [["same text"]]


def test_lazy_encoder_reads_config_without_loading(encoder, tmp_path):
    lazy = LazyEncoder(resolve("packaged"))
    assert lazy.dim == encoder.dim and lazy.max_length == encoder.max_length
    assert not lazy.loaded
    EmbeddingCache(encoder, tmp_path / "e.sqlite").get(["warm text"])
    cache = EmbeddingCache(lazy, tmp_path / "e.sqlite")
    cache.get(["warm text"])
    assert not lazy.loaded and cache.hits == 1  # a warm cache never loads the weights
