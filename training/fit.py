"""``branchgate train``: LightningCLI (jsonargparse) over ControllerModule + DecisionDataModule.

    branchgate train --config configs/quickstart.yaml --trainer.max_epochs=3 --model.hidden=128

Flow: fit (early stopping and checkpoint selection on val_auroc) → reload the best weights → calibrate τ
on validation → save ``OUT/controller.safetensors`` (weights, standardisation, encoder, τ: the file export,
evaluate and bench-gate take) → evaluate on test against the baselines → ``OUT/metrics.json`` + PNG plots →
print the metrics table. Lightning ``.ckpt`` files (``OUT/checkpoints``) serve only ``--ckpt_path`` resuming.
Loggers: CSV (``OUT/logs``) and Weights & Biases (offline by default; ``--wandb.mode online`` when you
have configured wandb, ``disabled`` to skip it). ``--trainer.logger false`` turns logging off.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Optional

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from branchgate.data.datamodule import DecisionDataModule
from branchgate.errors import InputError
from branchgate.fileio import atomic_write_text, check_output_dir, claim_output_dir, mark_output_dir
from branchgate.inference.inputs import as_tau
from branchgate.training.checkpoint import CONTROLLER_FILE, read_lightning_checkpoint, save_controller
from branchgate.training.evaluate import calibrate, calibrate_probabilities, evaluate, format_table
from branchgate.training.init_from import apply_start, check_start, load_start, switch_order_on
from branchgate.training.module import ControllerModule

log = logging.getLogger(__name__)


@dataclass
class Calibration:
    """How τ is chosen on the validation split (baselines use the same method; ``fixed`` → max F1 for them)."""

    method: Literal["f1", "keep_rate", "fixed"] = "f1"
    keep_rate: float | None = None  # target fraction kept, for method keep_rate
    tau: float | None = None  # the threshold, for method fixed
    # The root frame's own threshold (depth 0), stored in the controller and applied by the Gate there; None:
    # τ at every depth. A fixed value: choose it on held-out unpruned runs
    # (python3 -m research.replay_frontier --two-tau).
    root_tau: float | None = None
    probabilities: bool = True  # Platt-scale p_keep on validation first, so p_keep is a calibrated probability


@dataclass
class Wandb:
    """Weights & Biases logging."""

    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "branchgate"
    name: str | None = None


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--out",
            type=Optional[str],  # noqa: UP045 (jsonargparse reads the typing form)
            default=None,
            help="run directory for checkpoints, logs, metrics.json and plots (default runs/<config>-<time>)",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch CPU threads (the net is small: 1 avoids contention; 0 = torch's default)",
        )
        parser.add_argument(
            "--ckpt_path",
            type=Optional[str],  # noqa: UP045 (jsonargparse reads the typing form)
            default=None,
            help="resume fitting from this Lightning checkpoint",
        )
        parser.add_argument(
            "--init_from",
            type=Optional[str],  # noqa: UP045 (jsonargparse reads the typing form)
            default=None,
            help="(also --init-from) start from a trained controller: a controller.safetensors, an .onnx export "
            "(its weights read from the graph, int8 dequantised) or pretrained:pre / pretrained:read; its stage and "
            "encoder must be the dataset's. The architecture and the feature standardisation are the start's "
            "(--model.* network options are ignored). Always frozen: the sentence encoder (the text tower); "
            "also frozen per --freeze",
        )
        parser.add_argument(
            "--freeze",
            type=Literal["towers", "none", "mlp"],
            default="towers",
            help="with --init_from, what else stays fixed: towers (default) the state and candidate towers (the "
            "MLP, heads and wide path train); mlp the towers and the MLP (heads and wide path train); none nothing",
        )
        parser.add_argument(
            "--folds",
            type=int,
            default=0,
            help="K ≥ 3: K-fold by run over every split's runs (validation: the next fold), an out-of-fold report "
            "(OUT/oof.json, OUT/oof.md: per-hit and per-decision AUROC against every teacher with paired intervals "
            "over runs), then one final model on every run (OUT/controller.safetensors). Needs ≥ 2K runs with both "
            "a positive and a negative row",
        )
        parser.add_argument("--calibration", type=Calibration, default=Calibration())
        parser.add_argument("--wandb", type=Wandb, default=Wandb())
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.set_defaults(
            {"early_stopping.monitor": "val_auroc", "early_stopping.mode": "max", "early_stopping.patience": 8}
        )
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val_auroc",
                "checkpoint.mode": "max",
                "checkpoint.save_top_k": 1,
                "checkpoint.filename": "best-{epoch:03d}-{val_auroc:.4f}",
                "checkpoint.save_last": False,
            }
        )

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        if not cfg.get("out"):
            configs = cfg.get("config") or []
            stem = Path(str(configs[-1])).stem if configs else "run"
            cfg["out"] = str(Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
        out = Path(cfg["out"])

        # before Lightning creates anything in it: never a folder of the user's or one of the inputs (checked once,
        # by the first process: DDP's other ranks run this again after it has started writing there)
        if _first_process():
            check_output_dir(out, [cfg.get("data.dataset"), cfg.get("data.cache")], "train", in_place=True)
        if cfg.get("checkpoint.dirpath") is None:
            cfg["checkpoint.dirpath"] = str(out / "checkpoints")
        if cfg.get("trainer.default_root_dir") is None:
            cfg["trainer.default_root_dir"] = str(out)

    def instantiate_trainer(self, **kwargs):
        logger = self.config_init.get("trainer.logger")
        if logger is None or logger is True:
            kwargs["logger"] = make_loggers(Path(self.config["out"]), self.config_init["wandb"])
        return super().instantiate_trainer(**kwargs)


def make_loggers(out: Path, wb: Wandb) -> list:
    from lightning.pytorch.loggers import CSVLogger

    loggers = [CSVLogger(save_dir=str(out), name="logs", version="")]
    if wb.mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        loggers.append(
            WandbLogger(project=wb.project, name=wb.name or out.name, save_dir=str(out), offline=wb.mode == "offline")
        )
    return loggers


def start(model: ControllerModule, source: str, freeze: str, dm: DecisionDataModule) -> None:
    """``--init_from``: the model starts from ``source``'s net (``training.init_from``), checked against the data."""
    net, meta, how = load_start(source)
    check_start(meta, dm.manifest, dm.dataset_path, source)
    trainable = apply_start(net, freeze)
    if bool(model.hparams.get("order", True)) and not net.order:  # an input switch: --model.order decides
        switch_order_on(net, dm.sets["train"].features)
    net.order = bool(model.hparams.get("order", True))
    net.train()
    model.net, model.started = net, True
    model.start_note = {"source": source, "weights": how, "freeze": freeze, "trainable": trainable}
    n = sum(p.numel() for p in net.parameters() if p.requires_grad)
    print(f"init from {how}; frozen: the sentence encoder and {freeze}; {n} trainable weights")


def train(argv: list[str] | None = None) -> dict:
    """Run the whole training command; returns the metrics dict."""
    import torch

    logging.getLogger("lightning.pytorch").propagate = False  # Lightning prints its own INFO lines
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")

    cli = TrainCLI(
        ControllerModule,
        DecisionDataModule,
        run=False,
        args=argv,
        seed_everything_default=0,
        save_config_callback=None,
        auto_configure_optimizers=False,
        trainer_defaults={"accelerator": "cpu", "devices": 1, "deterministic": True, "log_every_n_steps": 5},
        parser_kwargs={"prog": "branchgate train", "description": __doc__.split("\n\n")[0], "default_env": False},
    )
    if cli.config.get("folds"):
        from branchgate.training.folds import run_folds

        return run_folds(cli, list(argv or []), train)
    for key in ("max_epochs", "max_steps"):
        if cli.config.get(f"trainer.{key}") == 0:
            raise InputError(
                "must be ≥ 1 (or -1: no limit); 0 would train nothing and write an untrained controller",
                f"--trainer.{key}",
            )
    if cli.config.get("threads"):
        torch.set_num_threads(int(cli.config["threads"]))
    out = Path(cli.config["out"])
    if _first_process():
        claim_output_dir(out, "train")  # open until mark_output_dir below lists what this run wrote
        atomic_write_text(out / "config.yaml", cli.parser.dump(cli.config, skip_none=False))
    trainer, model, dm = cli.trainer, cli.model, cli.datamodule
    dm.setup("fit")  # dataset, encoder and embedding errors surface here, before Lightning starts
    if cli.config.get("init_from"):
        start(model, cli.config["init_from"], cli.config.get("freeze") or "towers", dm)
    calib = cli.config_init["calibration"]
    if calib.root_tau is not None:
        as_tau(calib.root_tau, "--calibration.root_tau")
    started = time.perf_counter()
    trainer.fit(model, datamodule=dm, ckpt_path=cli.config.get("ckpt_path"))
    fit_s = time.perf_counter() - started
    if trainer.interrupted:
        raise KeyboardInterrupt
    if trainer.global_step == 0:
        raise InputError(
            "no training step ran (check --trainer.max_epochs / max_steps / limit_train_batches and the "
            "train split); no controller written",
            str(out),
        )
    if trainer.global_rank != 0:  # DDP: the other ranks only trained; rank 0 writes the controller and metrics
        return {}
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if best:
        model.load_state_dict(read_lightning_checkpoint(best)["state_dict"])  # weights_only=True: no unpickling
        log.info("best checkpoint %s (val_auroc %.4f)", best, float(trainer.checkpoint_callback.best_model_score or 0))
    model.net.eval()
    platt = calibrate_probabilities(model.net, dm) if calib.probabilities else None
    tau = calibrate(model.net, dm, calib.method, calib.keep_rate, calib.tau)
    model.tau = tau
    model.meta.update(tau=tau, calibration=dict(asdict(calib), platt=platt))
    final = save_controller(out / CONTROLLER_FILE, model.net, model.meta)
    metrics = evaluate(
        model.net,
        model.meta,
        dm,
        out,
        tau,
        model.meta["calibration"],
        seed=int(cli.config.get("seed_everything") or 0),
        extra={
            "checkpoint": str(final),
            "best_checkpoint": best or None,
            "epochs": int(trainer.current_epoch),
            "fit_seconds": round(fit_s, 2),
            "val_auroc_best": float(trainer.checkpoint_callback.best_model_score)
            if trainer.checkpoint_callback and trainer.checkpoint_callback.best_model_score is not None
            else None,
        },
    )
    for lg in trainer.loggers:
        flat = {f"test/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        flat.update(
            {
                f"test/{b}/{k}": v
                for b, m in metrics["baselines"].items()
                for k, v in m.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
        lg.log_metrics(flat, step=trainer.global_step)
        lg.finalize("success")
    print(format_table(metrics))
    print(
        f"encoder {metrics['encoder']}; tau {tau:.4f} ({calib.method}); embedding cache "
        f"hits {dm.cache_stats.get('hits')} misses {dm.cache_stats.get('misses')}"
    )
    mark_output_dir(out, "train")
    print(f"wrote {final}, {out / 'metrics.json'} and plots in {out}")
    return metrics


def _first_process() -> bool:
    """Whether this is the process a user started (DDP starts the other ranks with LOCAL_RANK set above 0)."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"
