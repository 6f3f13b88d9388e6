"""A BERT text tower that runs its dense layers on real tokens only (torch side of the export).

The Gate encodes a batch of texts padded to the longest one. A plain BERT forward pays for every padded
position in every dense layer (Q/K/V, attention output, both feed-forward layers): a fifth to a half of
the work on typical decisions. This module computes exactly the same embeddings as
``models.text_tower.TextTower`` over the same ``BertModel`` weights, but packs the valid tokens into one
``[T, D]`` matrix for the dense layers, layer norms and GELU, and gathers them into the padded
``[N, H, L, d]`` layout only inside attention (through indices computed once per call, so no transposes).
With CLS pooling (bge-small) the last layer runs its queries, attention output and feed-forward for each
text's first token only, the only rows pooling reads.

Inputs and output are those of ``TextTower``: ``(input_ids[N, L], attention_mask[N, L]) → [N, D]`` unit
rows. Used by ``inference.export`` when the encoder is a BERT model with absolute positions; other
encoders export through ``TextTower``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Attention softmax as (e @ (v * key_mask)) / (e @ key_mask) with e = exp(min(s, cap)): no per-row max over
# tiny rows, no huge negative mask values (exp of -3.4e38 takes onnxruntime's slow path, 15x slower), and no
# per-layer broadcast multiply of the [N, heads, L, L] weights (onnxruntime broadcasts short rows slowly).
# The cap keeps exp from overflowing even summed over 512 keys; real BERT attention logits stay far below it,
# so the result equals softmax.
SCORE_CAP = 80.0


def supports(transformer: nn.Module) -> bool:
    """True when ``transformer`` is a BERT encoder this tower reproduces exactly."""
    config = getattr(transformer, "config", None)
    layers = getattr(getattr(transformer, "encoder", None), "layer", None)
    return (
        config is not None
        and layers is not None
        and hasattr(transformer, "embeddings")
        and getattr(config, "model_type", "") == "bert"
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        and getattr(config, "hidden_act", "") == "gelu"
        and all(hasattr(layer, "attention") and hasattr(layer.attention, "self") for layer in layers)
    )


class PackedBertTower(nn.Module):
    def __init__(self, transformer: nn.Module, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"unknown pooling {pooling!r}")
        if not supports(transformer):
            raise ValueError("PackedBertTower needs a BERT encoder with absolute positions and exact GELU")
        config = transformer.config
        self.transformer = transformer
        self.pooling = pooling
        self.heads = int(config.num_attention_heads)
        self.dim = int(config.hidden_size)
        self.head_dim = self.dim // self.heads
        self.eps = float(config.layer_norm_eps)
        # Dense weights transposed once, Q/K/V side by side: one [D, 3D] matmul per layer.
        for i, layer in enumerate(transformer.encoder.layer):
            att = layer.attention.self
            self.register_buffer(
                f"qkv_w{i}", torch.cat([att.query.weight, att.key.weight, att.value.weight]).t().contiguous()
            )
            self.register_buffer(f"qkv_b{i}", torch.cat([att.query.bias, att.key.bias, att.value.bias]).contiguous())
            self.register_buffer(f"out_w{i}", layer.attention.output.dense.weight.t().contiguous())
            self.register_buffer(f"ffn_in_w{i}", layer.intermediate.dense.weight.t().contiguous())
            self.register_buffer(f"ffn_out_w{i}", layer.output.dense.weight.t().contiguous())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        n, length = input_ids.shape
        heads, head_dim, dim = self.heads, self.head_dim, self.dim
        valid = attention_mask.reshape(-1) > 0
        flat = torch.nonzero(valid).reshape(-1)  # [T] positions of real tokens in the padded N*L grid
        t = flat.shape[0]
        packed_row = torch.cumsum(valid.to(torch.int64), 0) - 1  # packed row of each real padded position
        text, pos = flat // length, flat % length
        # Attention reads Q (s=0), K (1), V (2) of head h for padded position (n, l) from row
        # packed_row*3*heads + s*heads + h of the QKV output viewed as [T*3*heads, head_dim]. Padding points at
        # row 0 of some token: its keys are masked out and its queries are never read back.
        src = torch.where(valid, packed_row, torch.zeros_like(packed_row))
        s3 = torch.arange(3, device=input_ids.device).reshape(3, 1, 1, 1) * heads
        hh = torch.arange(heads, device=input_ids.device).reshape(1, 1, heads, 1)
        to_padded = src.reshape(1, n, 1, length) * (3 * heads) + s3 + hh  # [3, N, heads, L]
        # Row of (n, h, l) in the attention output viewed as [N*heads*L, head_dim], for each real token.
        to_packed = (text.unsqueeze(1) * heads + torch.arange(heads, device=input_ids.device)) * length + pos.unsqueeze(
            1
        )
        key_col = attention_mask.to(torch.float32).reshape(n, 1, length, 1)  # 1 = real key, 0 = padding
        # Values of padding keys are zeroed by a same-shape multiply (the mask expanded once per call).
        value_mask = key_col.expand(n, heads, length, head_dim).contiguous()

        emb = self.transformer.embeddings
        x = (
            emb.word_embeddings(input_ids.reshape(-1)[flat])
            + emb.position_embeddings(pos)
            + emb.token_type_embeddings.weight[0]
        )
        x = F.layer_norm(x, (dim,), emb.LayerNorm.weight, emb.LayerNorm.bias, self.eps)
        scale = 1.0 / math.sqrt(head_dim)
        layers = self.transformer.encoder.layer
        for i, layer in enumerate(layers):
            # CLS pooling reads only each text's first token after the last layer, so that layer's queries,
            # attention output and feed-forward run for those N rows only (keys and values for all tokens).
            cls_only = self.pooling == "cls" and i == len(layers) - 1
            qkv = torch.matmul(x, getattr(self, f"qkv_w{i}")) + getattr(self, f"qkv_b{i}")  # [T, 3D]
            rows = qkv.reshape(-1, head_dim)
            q = rows[to_padded[0][:, :, :1] if cls_only else to_padded[0]]  # [N, heads, L or 1, head_dim]
            k, v = rows[to_padded[1]], rows[to_padded[2]]  # each [N, heads, L, head_dim]
            weights = torch.exp(
                (torch.matmul(q, k.transpose(-1, -2)) * scale).clamp(max=SCORE_CAP)
            )  # [N, heads, L|1, L]
            ctx = torch.matmul(weights, v * value_mask) / torch.matmul(weights, key_col)  # sums over real keys only
            if cls_only:
                ctx, x = ctx.reshape(n, dim), x[src.reshape(n, length)[:, 0]]
            else:
                ctx = ctx.reshape(-1, head_dim)[to_packed].reshape(t, dim)
            out = layer.attention.output
            x = F.layer_norm(
                torch.matmul(ctx, getattr(self, f"out_w{i}")) + out.dense.bias + x,
                (dim,),
                out.LayerNorm.weight,
                out.LayerNorm.bias,
                self.eps,
            )
            hidden = F.gelu(torch.matmul(x, getattr(self, f"ffn_in_w{i}")) + layer.intermediate.dense.bias)
            out = layer.output
            x = F.layer_norm(
                torch.matmul(hidden, getattr(self, f"ffn_out_w{i}")) + out.dense.bias + x,
                (dim,),
                out.LayerNorm.weight,
                out.LayerNorm.bias,
                self.eps,
            )
        if self.pooling == "cls":  # x holds each text's first token; a text without tokens gives a zero row
            return F.normalize(x * attention_mask[:, :1].to(x.dtype), p=2.0, dim=-1)
        rows = torch.cat([x, torch.zeros_like(x[:1])])  # + a zero row for padding
        slot = torch.where(valid, packed_row, torch.zeros_like(packed_row) + t).reshape(n, length)
        counts = attention_mask.sum(1, keepdim=True).to(x.dtype).clamp(min=1e-9)
        return F.normalize(rows[slot].sum(1) / counts, p=2.0, dim=-1)
