"""Training at scale is Lightning's: ``branchgate train --trainer.strategy=ddp --trainer.devices=2`` on CPU.

Lightning's DDP launcher re-runs the command line once per extra rank, so the run is a subprocess. Both ranks
must train (gloo); only rank 0 writes the controller, metrics.json and plots; the validation AUROC that picks
the checkpoint is the whole validation split's (gathered across ranks), i.e. what a single-device evaluation
of the saved controller computes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from branchgate.data.synthetic import warm_cache, write_synthetic_dataset


class _HashEncoder:
    """Unit vectors seeded by each text, under the packaged encoder's id: a warm cache without loading weights
    (this test is about the ranks, not what the net learns)."""

    id, dim = "sentence-transformers/all-MiniLM-L6-v2", 384

    def encode(self, texts, **_):
        out = np.stack(
            [np.random.default_rng(list(text.encode("utf-8"))[:64] or [0]).standard_normal(self.dim) for text in texts]
        ).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    ds = write_synthetic_dataset(root / "ds", n_runs=60, seed=7)
    cache = root / "emb.sqlite"
    warm_cache(ds, cache, _HashEncoder())  # warm: neither rank loads the encoder
    out = root / "run"
    cmd = [
        sys.executable,
        "-m",
        "branchgate",
        "train",
        "--config",
        "quickstart",
        "--data.dataset",
        str(ds),
        "--data.cache",
        str(cache),
        "--out",
        str(out),
        "--wandb.mode",
        "disabled",
        "--trainer.accelerator=cpu",
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        "--trainer.max_epochs=1",
        "--model.hidden",
        "16",
        "--model.lr",
        "0.003",
        "--data.batch_decisions",
        "8",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }
    for key in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(key, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return ds, cache, out, proc.stdout + proc.stderr


def test_both_ranks_train_and_rank_zero_alone_writes(ddp_run):
    _, _, out, log = ddp_run
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log, log[-2000:]
    # rank 1 finished too (the launcher returns rank 0's exit code only): before the AUROC was gathered, rank 1
    # looked for a checkpoint named after its own half's val_auroc, which rank 0 never wrote
    assert "branchgate: error" not in log and "Traceback" not in log, log[-3000:]
    # one process wrote the controller, metrics.json and plots (train() prints this after writing them)
    assert log.count("wrote ") == 1, log[-2000:]
    assert (out / "controller.safetensors").is_file() and (out / "metrics.json").is_file()
    assert len(list((out / "checkpoints").glob("*.ckpt"))) == 1
    assert not list(out.rglob("*.tmp*"))


def test_ddp_controller_loads_and_its_val_auroc_is_the_whole_splits(ddp_run):
    """The checkpoint's val_auroc equals a single-device evaluation of the saved controller on the whole
    validation split (with every rank's half instead, it would be the AUROC of rank 0's half)."""
    from branchgate.data.datamodule import DecisionDataModule
    from branchgate.training.checkpoint import load_controller
    from branchgate.training.evaluate import predict
    from branchgate.training.metrics import safe_auroc

    ds, cache, out, _ = ddp_run
    net, meta = load_controller(out / "controller.safetensors")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and 0.0 <= meta["tau"] <= 1.0 and np.isfinite(metrics["auroc"])
    dm = DecisionDataModule(str(ds), encoder="packaged", cache=str(cache), show_progress=False)
    dm.setup("fit")
    p, _ = predict(net, dm.sets["validation"], dm.table)
    y = np.asarray(dm.splits["validation"]["label"], np.int64)
    lab = y >= 0
    assert metrics["val_auroc_best"] == pytest.approx(safe_auroc(y[lab], p[lab]), abs=1e-4)
