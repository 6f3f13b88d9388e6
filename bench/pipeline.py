"""The bench's steps in order (``run_bench``), each a cached ``Steps.run`` with the inputs it depends on."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import time
from pathlib import Path

from branchgate.bench import closed_loop, stats
from branchgate.bench.policies import points
from branchgate.bench.report import write
from branchgate.bench.steps import Steps, keeps_folder
from branchgate.fileio import atomic_write_text

SIM_KEYS = ("breadth", "depth", "oversample", "top_k")


def _sim(cfg: dict, seed: int, encoder: str) -> dict:
    return {**{k: cfg[k] for k in SIM_KEYS}, "seed": int(seed), "encoder": encoder}


def run_bench(env_path: str, train_file: str, eval_file: str, out: str | Path, cfg: dict, real: list[str] = (),
              progress: bool = False):
    """Run (or reuse) every step; returns ``(report, paths, steps)``."""
    from branchgate.bench.cli import check_disjoint, read_ids
    from branchgate.models.encoder import resolve
    from branchgate.pipeline import env as envmod

    started = time.perf_counter()
    env = envmod.load(env_path)
    train_ids, eval_ids = read_ids(env, train_file), read_ids(env, eval_file)
    check_disjoint(train_file, train_ids, eval_file, eval_ids)
    real_fp = [_manifest_hash(p) for p in real]  # a missing --real path fails before any work
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps(out)
    enc = cfg["encoder"]
    enc_id = resolve(enc).id
    seeds = [int(s) for s in cfg["seeds"]]
    boot = int(cfg["bootstrap"])
    base = {"env": env.fingerprint(), "encoder": enc_id}

    def write_ids(folder: Path, ids: list[str]) -> str:
        path = folder / "queries.txt"
        atomic_write_text(path, "\n".join(ids) + "\n")
        return str(path)

    def simulate_step(folder: Path) -> dict:
        from branchgate.pipeline.run import Config
        from branchgate.pipeline.simulate import simulate

        qf = write_ids(folder, train_ids)
        runs = 0
        for seed in seeds:
            s = simulate(env_path, Config(**_sim(cfg, seed, enc), pre="none"), folder / f"seed{seed}", queries_file=qf,
                         progress=progress)
            runs += s["n_runs"]
        return {"runs": runs, "traces": [str(folder / f"seed{s}" / "traces") for s in seeds]}

    sim = steps.run("simulate", {**base, "sim": {k: cfg[k] for k in SIM_KEYS}, "seeds": seeds, "queries": train_ids},
                    simulate_step)

    def dataset_step(folder: Path) -> dict:
        from branchgate.logs_to_dataset.build import build

        m = build(sim["traces"], folder / "dataset", encoder=enc, labels=cfg["labels"],
                  positive_rate=float(cfg["positive_rate"]), label_options=dict(cfg.get("label_options") or {}),
                  progress=progress)
        return {"dataset": str(folder / "dataset"), "n_runs": m.get("n_runs"), "n_rows": m.get("n_rows"),
                "label_kind": m.get("label_kind"), "label_threshold": m.get("label_threshold")}

    ds = steps.run("dataset", {"upstream": steps.fingerprints["simulate"], "labels": cfg["labels"],
                               "positive_rate": cfg["positive_rate"], "label_options": cfg.get("label_options"),
                               "encoder": enc_id}, dataset_step)

    def train_step(folder: Path) -> dict:
        from branchgate.training.cli import resolve_config_names
        from branchgate.training.fit import train

        argv = ["--config", cfg["train"]["config"], "--data.dataset", ds["dataset"], "--data.encoder", enc,
                "--out", str(folder / "run"), "--wandb.mode", "disabled", *map(str, cfg["train"]["overrides"] or [])]
        if not progress:
            argv.append("--trainer.enable_progress_bar=false")
        m = train(resolve_config_names(argv))
        return {"checkpoint": str(folder / "run" / "controller.safetensors"), "tau": m.get("tau"),
                "auroc": m.get("auroc"), "epochs": m.get("epochs")}

    tr = steps.run("train", {"upstream": steps.fingerprints["dataset"], "train": cfg["train"]}, train_step)

    def export_step(folder: Path) -> dict:
        from branchgate.export.controller import export_controller

        onnx = folder / "controller.onnx"
        rep = export_controller(tr["checkpoint"], onnx, int8=False, parity_dataset=ds["dataset"])
        return {"controller": str(onnx), "passed": rep.get("passed") if isinstance(rep, dict) else None}

    ex = steps.run("export", {"upstream": steps.fingerprints["train"]}, export_step)

    pts = points(cfg["policies"], ex["controller"])

    @keeps_folder
    def closed_loop_step(folder: Path) -> dict:
        from branchgate.models.encoder import Encoder

        qf = write_ids(folder, eval_ids)
        encoder = Encoder.load(enc)
        by_seed = [closed_loop.run_points(env_path, _sim(cfg, seed, enc), pts, qf, folder / f"seed{seed}",
                                          {"queries": eval_ids, "export": steps.fingerprints["export"]},
                                          encoder=encoder, progress=progress) for seed in seeds]
        runs = closed_loop.average_seeds(by_seed)
        return {"policies": closed_loop.summarize(pts, runs, boot), "gate_vs": closed_loop.gate_vs(pts, runs, boot)}

    cl = steps.run("closed_loop", {**base, "upstream": steps.fingerprints["export"], "policies": cfg["policies"],
                                   "sim": {k: cfg[k] for k in SIM_KEYS}, "seeds": seeds, "queries": eval_ids,
                                   "bootstrap": boot}, closed_loop_step)

    def offline_step(folder: Path) -> dict:
        rows = stats.controller_rows(tr["checkpoint"], ds["dataset"], ("test",))
        return {"offline": stats.scorer_metrics(rows, boot, ref="gate"),
                "offline_by_depth": stats.by_depth(rows, boot, ref="gate")}

    off = steps.run("offline", {"upstream": steps.fingerprints["train"], "bootstrap": boot}, offline_step)

    def real_step(folder: Path) -> dict:
        from branchgate.logs_to_dataset.build import build

        result = {}
        for path in real:
            name = Path(path).resolve().name
            name = name if name not in result else f"{name}-{len(result)}"
            if not (Path(path) / "manifest.json").is_file():  # agent traces: build their decision dataset first
                dest = folder / Path(path).name / "dataset"
                build([path], dest, encoder=enc, labels="auto", progress=progress)
                path = dest
            rows = stats.controller_rows(tr["checkpoint"], path, ("train", "validation", "test"))
            table = stats.scorer_metrics(rows, boot, ref="gate")
            result[name] = {
                k: {"auroc": m["auroc"], "auprc": m["auprc"], "ci95": m["ci95_auroc"],
                    **({"delta_vs_gate": m["delta_vs_gate"]} if "delta_vs_gate" in m else {})}
                for k, m in table.items()}
        return result

    rl = steps.run("real", {"upstream": steps.fingerprints["train"], "real": [str(p) for p in real],
                            "manifests": real_fp, "bootstrap": boot,
                            "encoder": enc_id}, real_step)
    report = {"policies": cl["policies"], "gate_vs": cl["gate_vs"], "offline": off["offline"],
              "offline_by_depth": off["offline_by_depth"], "real": rl,
              "labels": {"source": cfg["labels"], "kind": ds.get("label_kind"), "threshold": ds.get("label_threshold")},
              "encoder": enc_id,
              "timings": {**steps.timings, "total": round(time.perf_counter() - started, 2)},
              "queries": {"train": len(train_ids), "eval": len(eval_ids)}, "tau": tr.get("tau"),
              "steps_run": list(steps.ran), "fingerprints": dict(steps.fingerprints)}
    from branchgate.training.metrics import clean

    report = clean(report)
    return report, write(out, report), steps


def _manifest_hash(path) -> str:
    """A decision dataset's manifest, or a trace folder's file names, sizes and mtimes, hashed."""
    from branchgate.bench.steps import fingerprint

    path = Path(path)
    m = path / "manifest.json"
    if m.is_file():
        return fingerprint(json.loads(m.read_text()))
    if not path.exists():
        from branchgate.errors import InputError

        raise InputError("not found (--real takes decision datasets or trace folders)", str(path))
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return fingerprint([(str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in files])
