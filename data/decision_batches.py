"""Decision datasets on disk → decision points over cached embeddings, ready for batching.

A split's rows (one per candidate) are grouped by ``(run_id, frame_id)`` into decision points. Every
text is mapped to an id into one embedding table shared by all splits; id 0 is the empty text and its
vector is zero (training and Gate alike). Batches are padded: K candidates and R retained rows per
decision, padding rows are zero vectors (the ValueNet ignores zero rows).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from branchgate.data.dataset_schema import (
    DATASET_SCHEMA_VERSION,
    DECISION_COLUMNS,
    SPLITS,
    dataset_stage,
    stage_columns,
)
from branchgate.errors import InputError, MismatchError
from branchgate.features import structured_features
from branchgate.texts import candidate_text

log = logging.getLogger(__name__)


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    file = path / "manifest.json"
    if not file.is_file():
        raise InputError(
            "decision dataset has no manifest.json (build it with `branchgate dataset build`)", file=str(file)
        )
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", file=str(file), line=exc.lineno) from None
    if not isinstance(manifest, dict) or not manifest.get("encoder"):
        raise InputError("manifest has no 'encoder' field", file=str(file))
    version = manifest.get("schema_version", DATASET_SCHEMA_VERSION)
    if not isinstance(version, int) or version > DATASET_SCHEMA_VERSION:
        raise InputError(
            f"dataset schema_version {version!r} is newer than this branchgate understands "
            f"({DATASET_SCHEMA_VERSION}); upgrade branchgate",
            file=str(file),
        )
    dataset_stage(manifest, str(file))  # "pre" when absent (schema version 1); an unknown stage is refused
    return manifest


def load_decision_dataset(path: str | Path):
    """``(DatasetDict, manifest)`` for a dataset directory, with its columns checked (those of its stage:
    ``dataset_schema.stage_columns``)."""
    import datasets

    path = Path(path)
    manifest = read_manifest(path)
    required = list(stage_columns(dataset_stage(manifest)))
    try:
        dsd = datasets.load_from_disk(str(path))
    except Exception as exc:  # FileNotFoundError or a corrupt save
        raise InputError(f"cannot load the decision dataset: {exc}", file=str(path)) from None
    for split in SPLITS:
        if split not in dsd:
            raise InputError(f"decision dataset lacks the split {split!r} (has {list(dsd)})", file=str(path))
        missing = [c for c in required if c not in dsd[split].column_names]
        if missing:
            raise InputError(f"split {split!r} lacks columns {missing}", file=str(path))
    return dsd, manifest


def check_encoder(dataset_encoder: str, model_encoder: str, where: str) -> None:
    if dataset_encoder != model_encoder:
        raise MismatchError(
            f"{where}: the dataset was built with encoder {dataset_encoder!r} but the model uses {model_encoder!r}; "
            f"train with --data.encoder {dataset_encoder!r} or rebuild the dataset with the same encoder"
        )


class TextTable:
    """Distinct texts → ids (0 = empty text)."""

    def __init__(self):
        self.ids: dict[str, int] = {"": 0}
        self.texts: list[str] = [""]

    def id(self, text: str | None) -> int:
        text = (text or "").strip()
        i = self.ids.get(text)
        if i is None:
            i = self.ids[text] = len(self.texts)
            self.texts.append(text)
        return i

    def __len__(self) -> int:
        return len(self.texts)

    def embed(self, cache, show_progress: bool = False) -> np.ndarray:
        """[len, D] float32 table via the embedding cache; row 0 is zero."""
        vecs = cache.get(self.texts[1:], show_progress=show_progress)
        dim = vecs.shape[1] if len(vecs) else int(cache.encoder.dim)
        table = np.zeros((len(self.texts), dim), dtype=np.float32)
        table[1:] = vecs
        return table


@dataclass
class DecisionSet:
    """One split grouped into decision points (CSR layout over candidate rows)."""

    split: str
    root: np.ndarray  # [Nd] text ids
    frame: np.ndarray
    goal: np.ndarray
    ret_ptr: np.ndarray  # [Nd+1]
    ret_ids: np.ndarray  # [sum R]
    cand_ptr: np.ndarray  # [Nd+1]
    cand_ids: np.ndarray  # [Nr] text ids, rows in decision order
    features: np.ndarray  # [Nr, F] float32
    label: np.ndarray  # [Nr] int8 (-1 = excluded)
    utility: np.ndarray  # [Nr] float32 (NaN = unknown)
    row: np.ndarray  # [Nr] index of the row in the split
    decision: np.ndarray  # [n_split_rows] decision index of each split row

    def __len__(self) -> int:
        return len(self.root)

    @property
    def n_rows(self) -> int:
        return len(self.cand_ids)

    def batch(self, idx, table):
        """Padded torch tensors for decisions ``idx`` gathered from the embedding ``table`` [V, D] (torch)."""
        import torch

        idx = np.asarray(idx, dtype=np.int64)
        b = len(idx)
        k_len = self.cand_ptr[idx + 1] - self.cand_ptr[idx]
        r_len = self.ret_ptr[idx + 1] - self.ret_ptr[idx]
        k_max, r_max = int(k_len.max()), max(1, int(r_len.max()))
        cand = np.zeros((b, k_max), dtype=np.int64)
        ret = np.zeros((b, r_max), dtype=np.int64)
        rows = np.full((b, k_max), -1, dtype=np.int64)
        for j, d in enumerate(idx):
            s, e = self.cand_ptr[d], self.cand_ptr[d + 1]
            rows[j, : e - s] = np.arange(s, e)
            rs, re_ = self.ret_ptr[d], self.ret_ptr[d + 1]
            ret[j, : re_ - rs] = self.ret_ids[rs:re_]
        valid = rows >= 0
        safe = np.where(valid, rows, 0)
        cand[valid] = self.cand_ids[safe[valid]]
        feats = np.where(valid[..., None], self.features[safe], 0.0).astype(np.float32)
        label = np.where(valid, self.label[safe], -1).astype(np.int64)
        util = np.where(valid, self.utility[safe], np.nan).astype(np.float32)
        t = lambda a: torch.from_numpy(a)  # noqa: E731
        return {
            "root": table[t(self.root[idx])],
            "frame": table[t(self.frame[idx])],
            "goal": table[t(self.goal[idx])],
            "retained": table[t(ret)],
            "cand": table[t(cand)],
            "features": t(feats),
            "label": t(label),
            "utility": t(util),
            "mask": t(valid),
            "rows": t(rows),
        }


def build_decisions(split_name: str, split, texts: TextTable) -> DecisionSet:
    """Group a split's rows into decision points, registering every text in ``texts``.

    A decision's candidates are taken in their ``order``; their structured features come from
    ``features.structured_features`` (the Gate's), so ``order`` is the position in that list whatever the
    stored column holds. The decision's state (root, frame query, goal, retained, depth) is its first row's in
    that order: a read dataset stores ``retained`` on that row only (``dataset_schema``), and ``n_retained`` is
    its length.
    """
    cols = split.select_columns(list(DECISION_COLUMNS))[:]
    n = len(cols["run_id"])
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(cols["run_id"], cols["frame_id"])):
        groups.setdefault(key, []).append(i)
    root, frame, goal, ret_ptr, ret_ids, cand_ptr, order_rows, feats = [], [], [], [0], [], [0], [], []
    for rows in groups.values():
        rows.sort(key=lambda i: cols["order"][i])
        first = rows[0]
        root.append(texts.id(cols["root_query"][first]))
        frame.append(texts.id(cols["frame_query"][first]))
        goal.append(texts.id(cols["parent_goal"][first]))
        retained = [texts.id(r) for r in (cols["retained"][first] or [])]
        ret_ids.extend(r for r in retained if r)
        ret_ptr.append(len(ret_ids))
        order_rows.extend(rows)
        cand_ptr.append(len(order_rows))
        feats.append(structured_features(cols["depth"][first] or 0, len(rows), len(retained)))
    order_rows = np.asarray(order_rows, dtype=np.int64)
    cand_ids = np.array(
        [texts.id(candidate_text(cols["query"][i], cols["goal"][i])) for i in order_rows], dtype=np.int64
    )
    features = np.concatenate(feats) if feats else structured_features(0, 0, 0)
    label = np.asarray(cols["label"], dtype=np.int8) if n else np.zeros(0, np.int8)
    utility = np.asarray([np.nan if u is None else u for u in cols["utility"]], dtype=np.float32)
    cand_ptr_arr = np.asarray(cand_ptr, dtype=np.int64)
    decision = np.zeros(n, dtype=np.int64)
    decision[order_rows] = np.repeat(np.arange(len(root)), np.diff(cand_ptr_arr))
    return DecisionSet(
        split=split_name,
        root=np.asarray(root, np.int64),
        frame=np.asarray(frame, np.int64),
        goal=np.asarray(goal, np.int64),
        ret_ptr=np.asarray(ret_ptr, np.int64),
        ret_ids=np.asarray(ret_ids, np.int64),
        cand_ptr=cand_ptr_arr,
        cand_ids=cand_ids,
        features=features,
        label=label[order_rows] if n else label,
        utility=utility[order_rows] if n else utility,
        row=order_rows,
        decision=decision,
    )
