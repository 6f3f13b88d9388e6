"""The checks an export must pass, and the decisions they run on.

- the torch text tower reproduces the encoder's own embeddings (what training used);
- the fp32 graph, through the Gate, matches the torch reference (``torch_ref``) in p_keep;
- on a decision dataset, the fp32 Gate matches the training path itself — rows grouped by
  ``data.decision_batches.build_decisions``, embedded by the encoder, scored by ``training.evaluate.predict``, as
  ``branchgate evaluate`` scores them — in p_keep and AUROC;
- the int8 graph's AUROC stays within a tolerance of the fp32 graph's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from branchgate.data.dataset_schema import DECISION_COLUMNS
from branchgate.data.decision_batches import TextTable, build_decisions
from branchgate.errors import BranchgateError, InputError
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_decision, decision_texts
from branchgate.training.metrics import safe_auroc


@dataclass
class ParityDecisions:
    """Decisions ``[(DecisionState, candidate_texts, labels)]``; from a dataset, also its grouped split."""

    items: list
    note: str
    dset: object = None  # data.decision_batches.DecisionSet of the split, when read from a dataset
    texts: object = None  # its data.decision_batches.TextTable


def load_decisions(dataset: str | Path | None, split: str = "test", max_decisions: int = 200) -> ParityDecisions:
    """The first ``max_decisions`` decision points of a dataset's split (grouped and ordered as training
    groups them), or the built-in sample decisions when no dataset is given."""
    if dataset is None:
        from branchgate.export.samples import sample_decisions

        items = [(*as_decision(s, cands), [-1] * len(cands)) for s, cands in sample_decisions()]
        return ParityDecisions(items[:max_decisions], "built-in sample decisions (no labels)")
    try:
        import datasets
    except ImportError:
        raise BranchgateError("a parity dataset needs the train extra (pip install 'branchgate[train]')") from None

    path = Path(dataset)
    if not path.exists():
        raise InputError("no such dataset directory", str(path))
    try:
        data = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"not a saved decision dataset ({exc})", str(path)) from None
    if isinstance(data, datasets.DatasetDict):
        chosen = next((s for s in (split, "validation", "train") if s in data and len(data[s])), None)
        if chosen is None:
            raise InputError("the dataset has no rows to check parity on", str(path))
        note = f"{path} split {chosen}" + ("" if chosen == split else f" ({split!r} is empty or missing)")
        data = data[chosen]
    else:
        note = str(path)
    missing = [c for c in DECISION_COLUMNS if c not in data.column_names]
    if missing:
        raise InputError(f"dataset lacks columns {missing}", str(path))
    from branchgate.training.evaluate import dataset_decisions

    texts = TextTable()
    dset = build_decisions(str(split), data, texts)
    labels = data.select_columns(["label"])[:]["label"]
    items = [
        (state, cands, [int(labels[i]) for i in rows])
        for state, cands, rows in dataset_decisions(data, dset, max_decisions)
    ]
    return ParityDecisions(items, f"{note}: {len(items)} of {len(dset)} decisions", dset, texts)


def training_scores(net, encoder, decisions: ParityDecisions) -> list[np.ndarray]:
    """p_keep of each parity decision as the training path computes it (``branchgate evaluate``)."""
    import torch

    from branchgate.training.evaluate import predict

    dset, n = decisions.dset, len(decisions.items)
    # embed only the texts of the parity decisions (the split's others are left zero; their scores are unused)
    used = np.unique(
        np.concatenate(
            [
                dset.root[:n],
                dset.frame[:n],
                dset.goal[:n],
                dset.ret_ids[: dset.ret_ptr[n]],
                dset.cand_ids[: dset.cand_ptr[n]],
            ]
        )
    )
    used = used[used > 0]
    table = np.zeros((len(decisions.texts), int(encoder.dim)), np.float32)
    if len(used):
        table[used] = encoder.encode([decisions.texts.texts[i] for i in used])
    p, _ = predict(net, dset, torch.from_numpy(table))
    return [p[dset.row[dset.cand_ptr[d] : dset.cand_ptr[d + 1]]] for d in range(n)]


def run_gate(path: Path, decisions: ParityDecisions) -> list[tuple[np.ndarray, np.ndarray]]:
    gate = Gate.load(path, threads=2)  # as on a multi-core machine: text groups (one thread each), then the head
    return [gate.predict(s, c) for s, c, _ in decisions.items]


def tower_vs_encoder(reference, encoder, decisions: ParityDecisions, limit: int = 64) -> float:
    """Max |Δ| between the torch text tower's embeddings (which the graph reproduces) and the encoder's own
    ``encode`` (which training used) on up to ``limit`` non-empty texts of the parity decisions."""
    texts = [t.strip() for state, cands, _ in decisions.items for t in decision_texts(state, cands)]
    texts = list(dict.fromkeys(t for t in texts if t))[:limit]
    return max_diff([reference.embed(texts)], [encoder.encode(texts)]) if texts else 0.0


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Max |a − b| over the pairs of arrays; inf where either holds a NaN (so no tolerance passes it)."""
    diffs = [
        float(np.nan_to_num(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))), nan=np.inf))
        for x, y in zip(a, b)
        if len(x)
    ]
    return max(diffs) if diffs else 0.0


def auroc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """AUROC over rows labelled 0/1 (other labels ignored); None without both classes."""
    labels = np.asarray(labels)
    keep = (labels == 0) | (labels == 1)
    return safe_auroc(labels[keep], np.asarray(scores, np.float64)[keep])
