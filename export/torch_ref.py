"""The torch reference for a decision: the checkpoint's encoder + ValueNet, as training computes it.

Used by the export parity check and by ``bench-gate``. Embeddings come from the encoder's own tokenizer
and transformer (the same path as ``Encoder.encode``); empty texts are zero vectors; the structured
features come from ``branchgate.features.structured_features``, as for the Gate and training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from branchgate.features import structured_features
from branchgate.inference.inputs import DecisionState, decision_texts


class TorchController:
    def __init__(self, net, encoder, cache: bool = False):
        self.net = net.eval()
        self.encoder = encoder
        self.tower = encoder.torch_module().eval()
        self.dim = int(encoder.dim)
        self.use_cache = cache
        self._cache: dict[str, np.ndarray] = {}

    def clear_cache(self) -> None:
        self._cache.clear()

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 rows of the stripped texts; "" (or whitespace) → zero row. Cached only when
        ``cache=True``."""
        texts = [(t or "").strip() for t in texts]  # as training's text table does
        out = np.zeros((len(texts), self.dim), np.float32)
        todo = []
        for i, t in enumerate(texts):
            if not t:
                continue
            if self.use_cache and t in self._cache:
                out[i] = self._cache[t]
            else:
                todo.append(i)
        if todo:
            uniq = list(dict.fromkeys(texts[i] for i in todo))
            feats = self.encoder.features(uniq)
            emb = self.tower(feats["input_ids"], feats["attention_mask"]).float().numpy()
            pos = {t: j for j, t in enumerate(uniq)}
            for i in todo:
                out[i] = emb[pos[texts[i]]]
            if self.use_cache:
                self._cache.update(zip(uniq, emb))
        return out

    @torch.inference_mode()
    def predict(self, state: DecisionState, candidate_texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        k = len(candidate_texts)
        if k == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        emb = torch.from_numpy(self.embed(decision_texts(state, candidate_texts)))
        n_ret = len(state.retained or [])
        ret = emb[3 : 3 + n_ret] if n_ret else torch.zeros(1, self.dim)
        feats = torch.from_numpy(structured_features(state.depth or 0, k, n_ret))
        logit, util = self.net(emb[0], emb[1], emb[2], ret, emb[3 + n_ret :], feats)
        return torch.sigmoid(logit).numpy().astype(np.float32), util.numpy().astype(np.float32)
