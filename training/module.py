"""LightningModule: multitask training of the ValueNet on batches of decision points.

Loss = w_bce · BCE(keep logit, y) with positive-class weight (class balancing; ``pos_weight: null`` =
n_neg / n_pos on train) over rows with label != -1, plus w_reg · Huber(ĝ, g) on standardised utility over
rows with a finite g. Validation logs ``val_auroc`` (early stopping / checkpoint selection), ``val_auroc_deep``
(the rows below the root frame, depth ≥ 1, which the root frame's easy positives do not dominate: a diagnostic;
as the monitor it chose the same epochs, docs/research/checkpoint-monitor.md) and ``val_loss``.
"""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F

from branchgate.data.dataset_schema import dataset_stage
from branchgate.models.value_model import ValueNet
from branchgate.training.checkpoint import checkpoint_entry, make_meta, train_feature_range
from branchgate.training.init_from import union_range
from branchgate.training.metrics import safe_auroc

log = logging.getLogger(__name__)


class ControllerModule(L.LightningModule):
    def __init__(
        self,
        hidden: int = 128,
        dropout: float = 0.1,
        lr: float = 2e-3,
        weight_decay: float = 1e-4,
        w_bce: float = 1.0,
        w_reg: float = 0.5,
        huber_delta: float = 1.0,
        pos_weight: float | None = None,
        mmr_lambda: float = 0.35,
        w_rank: float = 0.0,
        towers: str = "full",
        order: bool = True,
    ):
        """
        Args:
            hidden: width of the towers and the MLP.
            dropout: dropout on tower inputs and MLP layers.
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay.
            w_bce: weight of the keep (BCE) loss.
            w_reg: weight of the utility (Huber) loss.
            huber_delta: Huber transition point, in standard deviations of train utility.
            pos_weight: BCE weight of positive rows; null = n_neg / n_pos on train (class balancing).
            mmr_lambda: relevance weight of the in-graph MMR-like features.
            w_rank: weight of the listwise loss per decision point (softmax cross-entropy of the keep logits
                against the decision's positive candidates); it targets top-1 accuracy directly.
            towers: the text the network sees besides the scalar features: full | interaction | none
                (models/value_model.py).
            order: whether a candidate's position in its list is an input; false makes every decision's scores
                independent of the order its candidates are listed in.
        """
        super().__init__()
        self.save_hyperparameters()
        self.net: ValueNet | None = None
        self.meta: dict = {}
        self.tau: float | None = None
        self._pos_weight = 1.0
        self._val: list[tuple[np.ndarray, np.ndarray]] = []
        self._scalars: dict[str, torch.Tensor] = {}  # split → [rows, S] scalar features (see split_scalars)
        self.started = False  # True when ``net`` came from --init-from: keep its standardisation (init_from.py)
        self.start_note: dict = {}  # what it started from and what stayed frozen (recorded in the controller's meta)

    # -- construction ------------------------------------------------------------------------------------
    def build(self, dim: int) -> ValueNet:
        hp = self.hparams
        self.net = ValueNet(
            dim,
            hidden=hp.hidden,
            dropout=hp.dropout,
            mmr_lambda=hp.mmr_lambda,
            towers=hp.get("towers", "full"),
            order=hp.get("order", True),
        )
        return self.net

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        if dm is None:
            return
        if self.net is None:
            self.build(dm.dim)
        stats = dm.train_stats()
        self._pos_weight = (
            float(self.hparams.pos_weight) if self.hparams.pos_weight is not None else stats["pos_weight"]
        )
        if stage == "fit":  # clamp structured features to the train split's range (before any scalars are computed)
            rng = train_feature_range(dm.sets["train"].features)
            if self.started:
                union_range(self.net, rng)
            elif rng is not None:
                self.net.set_feature_range([v[0] for v in rng.values()], [v[1] for v in rng.values()])
        self.meta = make_meta(
            dm.encoder,
            tau=self.tau,
            data_sha256=dm.data_sha256(),
            feature_range=self.net.feature_range(),
            stage=dataset_stage(dm.manifest),
            dataset_encoder=dm.manifest.get("encoder"),
            label_kind=dm.manifest.get("label_kind"),
            label_threshold=dm.manifest.get("label_threshold"),
            teacher=dm.manifest.get("teacher"),
            dataset_schema_version=dm.manifest.get("schema_version"),
            train_stats=stats,
            **({"init_from": self.start_note} if self.started else {}),
        )
        if stage == "fit":
            self._scalars = {
                split: split_scalars(self.net, dm.sets[split], dm.table) for split in ("train", "validation")
            }
            if not self.started:  # a started net keeps the standardisation its weights were fitted to
                fit_standardisation(self.net, self._scalars["train"], stats)
            log.info(
                "train: %d positive / %d negative labelled rows; BCE pos_weight %.3f",
                stats["n_pos"],
                stats["n_neg"],
                self._pos_weight,
            )

    # -- training ----------------------------------------------------------------------------------------
    def _heads(self, batch, split: str):
        rows = batch["rows"].clamp(min=0)  # padding (-1) reads row 0; padded outputs are masked out anyway
        return self.net.raw_heads(
            batch["root"],
            batch["frame"],
            batch["goal"],
            batch["retained"],
            batch["cand"],
            batch["features"],
            scalars=self._scalars[split][rows],
        )

    def _loss(self, batch, logit, z):
        label, util = batch["label"], batch["utility"]
        lab = label >= 0
        terms = logit.sum() * 0.0
        bce = reg = None
        if lab.any():
            y = label[lab].to(logit.dtype)
            pw = torch.tensor(self._pos_weight, dtype=logit.dtype)
            bce = F.binary_cross_entropy_with_logits(logit[lab], y, pos_weight=pw)
            terms = terms + self.hparams.w_bce * bce
        fin = torch.isfinite(util) & batch["mask"]
        if fin.any() and self.hparams.w_reg > 0:
            target = (util[fin] - self.net.utility_mean) / self.net.utility_std
            reg = F.huber_loss(z[fin], target, delta=self.hparams.huber_delta)
            terms = terms + self.hparams.w_reg * reg
        if self.hparams.w_rank > 0:
            rank = listwise_loss(logit, label, batch["mask"])
            if rank is not None:
                terms = terms + self.hparams.w_rank * rank
        return terms, bce, reg

    def training_step(self, batch, batch_idx):
        logit, z = self._heads(batch, "train")
        loss, bce, reg = self._loss(batch, logit, z)
        n = int(batch["mask"].sum())
        self.log("train_loss", loss, prog_bar=True, batch_size=n)
        if bce is not None:
            self.log("train_bce", bce, batch_size=n)
        if reg is not None:
            self.log("train_huber", reg, batch_size=n)
        return loss

    def validation_step(self, batch, batch_idx):
        logit, z = self._heads(batch, "validation")
        loss, _, _ = self._loss(batch, logit, z)
        self.log("val_loss", loss, prog_bar=True, batch_size=int(batch["mask"].sum()), sync_dist=True)
        lab = batch["label"] >= 0
        self._val.append(
            (
                torch.sigmoid(logit[lab]).detach().cpu().numpy(),
                batch["label"][lab].cpu().numpy(),
                batch["rows"][lab].cpu().numpy(),
                batch["features"][lab][:, 0].cpu().numpy(),
            )
        )

    def on_validation_epoch_end(self):
        p, y, rows, depth = (np.concatenate([v[i] for v in self._val]) if self._val else np.zeros(0) for i in range(4))
        self._val.clear()
        if self.trainer.world_size > 1:  # DDP: each rank saw its share of the split; score the whole split
            p, y, depth = _whole_split((p, y, depth), rows, self.trainer.world_size)
        auroc, deep = safe_auroc(y, p), safe_auroc(y[depth >= 1], p[depth >= 1])
        # every rank now holds the same values (the checkpoint's file name and early stopping depend on them)
        self.log("val_auroc", 0.5 if auroc is None else auroc, prog_bar=True, sync_dist=True)
        self.log("val_auroc_deep", 0.5 if deep is None else deep, sync_dist=True)

    def configure_optimizers(self):
        trainable = [p for p in self.net.parameters() if p.requires_grad]  # --freeze (init_from.py) fixes the rest
        return torch.optim.AdamW(trainable, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    # -- checkpoints -------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["branchgate"] = checkpoint_entry(self.net, dict(self.meta, tau=self.tau))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        entry = checkpoint.get("branchgate") or {}
        if self.net is None and entry:
            self.net = ValueNet(**entry["net"])
        if entry:
            self.meta = dict(entry["meta"])
            self.tau = self.meta.get("tau")


def _whole_split(columns: tuple[np.ndarray, ...], rows: np.ndarray, world_size: int) -> tuple[np.ndarray, ...]:
    """Every rank's validation ``columns`` (one value per row), each split row once (DistributedSampler repeats a
    few decision points to even out the ranks' shares), in row order."""
    import torch.distributed as dist

    parts = [None] * world_size
    dist.all_gather_object(parts, (*columns, rows))
    gathered = [np.concatenate([part[i] for part in parts]) for i in range(len(columns) + 1)]
    _, first = np.unique(gathered[-1], return_index=True)
    return tuple(c[first] for c in gathered[:-1])


def listwise_loss(logit: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """Mean over decisions with ≥ 1 positive and ≥ 1 negative of −Σ t·log softmax(logit), t uniform on positives."""
    valid = mask & (label >= 0)
    pos = (label == 1) & valid
    n_pos = pos.sum(1)
    use = (n_pos > 0) & (valid.sum(1) > n_pos)
    if not use.any():
        return None
    masked = logit.masked_fill(~valid, float("-inf"))
    logp = torch.log_softmax(masked[use], dim=1)
    target = pos[use].to(logit.dtype) / n_pos[use].unsqueeze(1).to(logit.dtype)
    return -(target * logp.masked_fill(~valid[use], 0.0)).sum(1).mean()


@torch.no_grad()
def split_scalars(net: ValueNet, dset, table, batch_decisions: int = 256) -> torch.Tensor:
    """``net.scalars`` of every candidate row of a ``DecisionSet`` [rows, S], in the set's row order.

    They have no parameters and the encoder is frozen, so training computes them once instead of every epoch
    (they are most of a forward pass: the DPP and GRN features invert a Gram matrix per decision)."""
    out = torch.zeros((dset.n_rows, len(net.scalar_mean)), dtype=torch.float32)
    for start in range(0, len(dset), batch_decisions):
        b = dset.batch(np.arange(start, min(start + batch_decisions, len(dset))), table)
        s = net.scalars(b["root"], b["frame"], b["goal"], b["retained"], b["cand"], b["features"])
        out[b["rows"][b["mask"]]] = s[b["mask"]].float()
    return out


@torch.no_grad()
def fit_standardisation(net: ValueNet, scalars: torch.Tensor, stats: dict) -> dict:
    """Fit the scalar-feature standardisation on the train split's ``scalars`` [rows, S] (``split_scalars``)
    and the utility scale from ``stats``."""
    v = scalars.double()
    mean = v.mean(0) if len(v) else torch.zeros(v.shape[1], dtype=torch.float64)
    std = (v * v).mean(0).sub(mean * mean).clamp(min=0).sqrt() if len(v) else torch.ones_like(mean)
    std = torch.where(std < 1e-6, torch.ones_like(std), std)  # constant features stay unscaled
    net.set_standardisation(mean.float(), std.float(), stats["utility_mean"], stats["utility_std"])
    return net.standardisation()
