"""Shared helpers for the inference tests (no tests here): a small trained controller, exported once.

The controller is the real ValueNet on the real packaged encoder, trained for a few seconds on the
built-in sample decisions with a simple labelling rule, so p_keep spreads and AUROC means something.
The export (fp32 + int8 + tokenizer + card) is done once per test session and shared by every file.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

_TMP: list[Path] = []


def tmp_root() -> Path:
    if not _TMP:
        path = Path(tempfile.mkdtemp(prefix="branchgate-inference-tests-"))
        atexit.register(shutil.rmtree, path, True)
        _TMP.append(path)
    return _TMP[0]


def labelled_decisions():
    """The sample decisions with labels: off-topic tail candidates are 0, the rest 1."""
    from branchgate.export.samples import sample_decisions

    out = []
    for state, cands in sample_decisions():
        n_bad = 2 if state["depth"] == 0 else 3
        out.append((state, cands, [1] * (len(cands) - n_bad) + [0] * n_bad))
    return out


@functools.cache
def trained_controller(encoder):
    """(ValueNet in eval mode, checkpoint meta) trained briefly on ``labelled_decisions``."""
    from branchgate.export.controller import torch_threads

    with torch_threads(1):  # small work: one thread is fastest, and robust on a shared machine
        return _train(encoder)


def _train(encoder):
    import torch

    from branchgate.export.torch_ref import TorchController
    from branchgate.features import structured_features
    from branchgate.inference.inputs import as_decision
    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import make_meta, train_feature_range

    torch.manual_seed(0)
    net = ValueNet(encoder.dim, hidden=32, dropout=0.0)
    ref = TorchController(net, encoder, cache=True)
    batches = []
    varied = []  # also sub-lists, so the structured features (K, order) vary as in real data
    for state, cands, labels in labelled_decisions():
        varied.append((state, cands, labels))
        for pick in ([0, len(cands) - 1], [0, 1, 2, len(cands) - 2, len(cands) - 1], [3]):
            varied.append((state, [cands[i] for i in pick], [labels[i] for i in pick]))
    for state, cands, labels in varied:
        s, texts = as_decision(state, cands)
        emb = torch.from_numpy(ref.embed([s.root_query, s.frame_query, s.parent_goal, *s.retained, *texts]))
        r = len(s.retained)
        ret = emb[3 : 3 + r] if r else torch.zeros(1, encoder.dim)
        feats = torch.from_numpy(structured_features(s.depth, len(texts), r))
        batches.append((emb[0], emb[1], emb[2], ret, emb[3 + r :], feats, torch.tensor(labels, dtype=torch.float32)))
    train_range = train_feature_range(torch.cat([b[5] for b in batches]).numpy())  # as training/module.py does
    net.set_feature_range([v[0] for v in train_range.values()], [v[1] for v in train_range.values()])
    with torch.no_grad():
        scal = torch.cat(
            [net.scalars(b[0][None], b[1][None], b[2][None], b[3][None], b[4][None], b[5][None])[0] for b in batches]
        )
        net.set_standardisation(scal.mean(0), scal.std(0), 0.0, 1.0)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(15):
        for b in batches:
            logit, util = net(*b[:6])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, b[6]) + 0.1 * ((util - b[6]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    meta = make_meta(encoder, tau=0.5, data_sha256="0" * 64, feature_range=train_range)
    return net, meta


def write_dataset(path: Path, encoder_id: str = "") -> Path:
    """A decision dataset (the ``data.dataset_schema`` contract, with a manifest) holding the labelled sample decisions
    in every split."""
    import datasets

    from branchgate.data.dataset_schema import DATASET_SCHEMA_VERSION, SPLITS, features
    from branchgate.fileio import atomic_write_json
    from branchgate.inference.inputs import as_state

    rows = []
    for d, (state, cands, labels) in enumerate(labelled_decisions()):
        s = as_state(state)
        for i, (c, y) in enumerate(zip(cands, labels)):
            rows.append(
                {
                    "run_id": f"run{d // 2}",
                    "frame_id": f"f{d % 2}",
                    "candidate_id": f"c{i}",
                    "root_query": s.root_query,
                    "frame_query": s.frame_query,
                    "parent_goal": s.parent_goal,
                    "retained": list(s.retained),
                    "query": c["query"],
                    "goal": c["goal"],
                    "depth": s.depth,
                    "order": i,
                    "n_candidates": len(cands),
                    "n_retained": len(s.retained),
                    "expanded": True,
                    "utility": float(y),
                    "label": y,
                    "label_source": "realized",
                    "utility_kind": "keypoints",
                }
            )
    ds = datasets.Dataset.from_list(rows, features=features([]))
    datasets.DatasetDict({name: ds for name in SPLITS}).save_to_disk(str(path))
    atomic_write_json(
        Path(path) / "manifest.json",
        {
            "schema_version": DATASET_SCHEMA_VERSION,
            "encoder": encoder_id,
            "label_kind": "keypoints",
            "n_runs": {"total": len(rows)},
        },
    )
    return path


@functools.cache
def exported(encoder) -> dict:
    """Export the trained controller once (checkpoint → fp32 + int8 ONNX, parity on the dataset)."""
    from branchgate.export.controller import export_controller
    from branchgate.training.checkpoint import save_controller

    root = tmp_root() / "exported"
    net, meta = trained_controller(encoder)
    ckpt = save_controller(root / "controller.safetensors", net, meta)
    dataset = write_dataset(root / "dataset", encoder.id)
    report = export_controller(
        ckpt, root / "out" / "controller.onnx", int8=True, parity_dataset=dataset, encoder=encoder
    )
    report["checkpoint"] = str(ckpt)
    report["dataset"] = str(dataset)
    return report


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if len(a) else 0.0


def spy_runs(gate) -> list[tuple[int, ...]]:
    """Wrap ``gate``'s onnxruntime session; the returned list collects the ``input_ids`` shape of every run."""
    shapes: list[tuple[int, ...]] = []
    real = gate.session

    class Spy:
        def run(self, outputs, feed):
            shapes.append(tuple(feed["input_ids"].shape))
            return real.run(outputs, feed)

    gate.session = Spy()
    return shapes


def relabelled(model, folder, props: dict[str, str]) -> Path:
    """A copy of the exported ``model`` (with its tokenizer) in ``folder`` whose metadata is ``props``."""
    from branchgate.export.onnx_metadata import write_metadata

    out = Path(folder) / "controller.onnx"
    write_metadata(Path(model), out, props)
    tokenizer = Path(model).with_name("controller.tokenizer.json")
    out.with_name(tokenizer.name).write_bytes(tokenizer.read_bytes())
    return out


@functools.cache
def exported_read(encoder) -> dict:
    """The same small controller exported as a read controller: its checkpoint rewritten with metadata ``stage`` =
    ``read`` (the graph is the same; only the Gate maps its inputs differently), exported fp32 only."""
    from branchgate.export.controller import export_controller
    from branchgate.training.checkpoint import load_controller, save_controller

    net, meta = load_controller(exported(encoder)["checkpoint"])
    root = tmp_root() / "exported_read"
    ckpt = save_controller(root / "controller.safetensors", net, {**meta, "stage": "read"})
    report = export_controller(ckpt, root / "out" / "controller.onnx", int8=False, encoder=encoder, max_decisions=4)
    report["checkpoint"] = str(ckpt)
    return report


def runs_in_every_split(prefix: str, n_train: int = 2) -> list[str]:
    """Run ids that ``split_of`` sends to validation, to test and (``n_train`` of them) to train, in that order:
    a dataset built from one run each trains (it needs every split)."""
    from branchgate.data.dataset_schema import split_of

    ids = [f"{prefix}-{i}" for i in range(200)]
    return [next(r for r in ids if split_of(r) == s) for s in ("validation", "test")] + [
        r for r in ids if split_of(r) == "train"
    ][:n_train]


def read_controller_from(traces: Path, root: Path, labels: str = "citations") -> Path:
    """The read controller a user gets from a hook's traces: ``dataset build --stage read``, ``train`` (the
    quickstart config, 2 epochs) and ``export``, through the CLI; returns the ONNX file."""
    import json

    from branchgate.cli import main

    ds, cache, run = root / "read_ds", root / "emb.sqlite", root / "read_run"
    argv = ["dataset", "build", "--traces", str(traces), "--out", str(ds), "--stage", "read", "--labels", labels]
    assert main([*argv, "--cache", str(cache), "--no-progress"]) == 0
    manifest = json.loads((ds / "manifest.json").read_text())
    assert manifest["stage"] == "read" and all(manifest["n_decisions"][s] > 0 for s in ("train", "validation", "test"))
    argv = ["train", "--config", "quickstart", "--data.dataset", str(ds), "--data.cache", str(cache), "--out", str(run)]
    argv += ["--wandb.mode", "disabled", "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"]
    assert main([*argv, "--trainer.enable_model_summary", "false"]) == 0
    out = root / "read_export" / "controller.onnx"
    assert main(["export", "--checkpoint", str(run / "controller.safetensors"), "--out", str(out)]) == 0
    return out


def untrained_controller(path: Path, max_length: int = 256) -> Path:
    """A small controller file on the packaged encoder (untrained: evaluate and export only need it to load)."""
    import torch

    from branchgate.models.encoder import resolve
    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import make_meta, save_controller

    torch.manual_seed(0)
    meta = make_meta(resolve("packaged"), tau=0.5, data_sha256="test", dim=384, max_length=max_length)
    return save_controller(path, ValueNet(384, hidden=8, dropout=0.0).eval(), meta)
