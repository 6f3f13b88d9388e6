"""The torch module that is exported as the controller graph (torch side; never imported by the Gate).

One decision per call. Texts are either new (token ids, encoded here) or already embedded (rows of
``cached_emb``); index inputs pick rows of ``all = concat(encode(new), cached_emb, zeros[1, D])`` —
the last row is the zero vector used for empty texts and for "nothing retained".

Inputs (graph_io_version 1):
  input_ids[N, L] int64, attention_mask[N, L] int64   texts not in the Gate's cache (N ≥ 1)
  cached_emb[M, D] float32                            texts already embedded (M ≥ 0)
  root_idx[1], frame_idx[1], goal_idx[1], retained_idx[R ≥ 1], cand_idx[K] int64
  features[K, F] float32                              raw FEATURE_NAMES, in order
Outputs: p_keep[K], utility[K], text_emb[N, D] (unit-norm embeddings of the new texts, for the cache).

Export then makes the two parts skippable (``export.parts``, metadata ``parts``): N = 0 runs the head
only, K = 0 the tower only.
"""

from __future__ import annotations

import torch
from torch import nn

GRAPH_IO_VERSION = "1"
INPUT_NAMES = [
    "input_ids",
    "attention_mask",
    "cached_emb",
    "root_idx",
    "frame_idx",
    "goal_idx",
    "retained_idx",
    "cand_idx",
    "features",
]
OUTPUT_NAMES = ["p_keep", "utility", "text_emb"]
DYNAMIC_AXES = {
    "input_ids": {0: "N", 1: "L"},
    "attention_mask": {0: "N", 1: "L"},
    "cached_emb": {0: "M"},
    "retained_idx": {0: "R"},
    "cand_idx": {0: "K"},
    "features": {0: "K"},
    "p_keep": {0: "K"},
    "utility": {0: "K"},
    "text_emb": {0: "N"},
}


def eager_attention(transformer: nn.Module) -> str | None:
    """Switch to the plain (eager) attention path, whose masking exports exactly (the SDPA path's does not);
    returns the previous implementation for ``set_attention``."""
    config = getattr(transformer, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    set_attention(transformer, "eager")
    return previous


def set_attention(transformer: nn.Module, implementation: str | None) -> None:
    if implementation is None:
        return
    setter = getattr(transformer, "set_attn_implementation", None)
    if setter is not None:
        try:
            setter(implementation)
            return
        except Exception:  # older transformers: fall through to the config attribute
            pass
    config = getattr(transformer, "config", None)
    if config is not None:
        config._attn_implementation = implementation


class ControllerGraph(nn.Module):
    """Text tower + row gathers + ValueNet → (p_keep, utility, text_emb) for one decision."""

    def __init__(self, tower: nn.Module, net: nn.Module):
        super().__init__()
        self.tower = tower
        self.net = net

    def forward(
        self, input_ids, attention_mask, cached_emb, root_idx, frame_idx, goal_idx, retained_idx, cand_idx, features
    ):
        new = self.tower(input_ids, attention_mask)
        zero = new.new_zeros((1, self.net.dim))  # a constant: the row must exist when N = 0
        rows = torch.cat([new, cached_emb.to(new.dtype), zero], dim=0)
        root = rows.index_select(0, root_idx)[0]
        frame = rows.index_select(0, frame_idx)[0]
        goal = rows.index_select(0, goal_idx)[0]
        retained = rows.index_select(0, retained_idx)
        cand = rows.index_select(0, cand_idx)
        logit, utility = self.net(root, frame, goal, retained, cand, features)
        return torch.sigmoid(logit), utility, new
