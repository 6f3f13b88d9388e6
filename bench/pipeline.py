"""The bench's steps in order (``run_bench``), each a cached ``Steps.run`` with the inputs it depends on."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import json
import os
import time
from pathlib import Path

from branchgate.bench import closed_loop as closed_loop_mod
from branchgate.bench import stats
from branchgate.bench.closed_loop import safe_name
from branchgate.bench.policies import VARIANTS, baseline_points, gate_points, variant_family
from branchgate.bench.report import write
from branchgate.bench.steps import Steps, keeps_folder
from branchgate.errors import InputError
from branchgate.fileio import atomic_write_text, check_output_dir, is_output_of, mark_output_dir

OUTPUT_KIND = "bench"  # the command named in the output folder's mark (``fileio.check_output_dir``)
SIM_KEYS = ("breadth", "depth", "oversample", "top_k")


def _sim(cfg: dict, seed: int, encoder: str) -> dict:
    return {**{k: cfg[k] for k in SIM_KEYS}, "seed": int(seed), "encoder": encoder}


def listed(value) -> list[str]:
    """A config list given as a YAML list or a comma-separated string, each item stripped."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(s).strip() for s in items]


def train_shapes(cfg: dict) -> list[str]:
    """The config's ``train_shapes`` (the training runs' shapes: tree, chain or both), checked."""
    from branchgate.pipeline.config import SHAPES

    value = cfg.get("train_shapes") or ["tree"]
    out = listed(value)
    bad = [s for s in out if s not in SHAPES]
    if bad or len(set(out)) != len(out):
        raise InputError(f"train_shapes must list distinct shapes of {', '.join(SHAPES)}, got {value!r}", "train_shapes")
    if "chain" in out and int(cfg.get("chain_depth") or 0) < 1:
        raise InputError("chain_depth must be ≥ 1", "chain_depth")
    return out


TREE_KEYS = ("breadth", "depth", "oversample")


def train_trees(cfg: dict) -> list[dict]:
    """The config's ``train_trees``: extra tree-shaped training runs, each a mapping of ``breadth``, ``depth`` and
    ``oversample`` that overrides the top-level keys (wider or narrower sibling sets than the eval's), checked."""
    value = cfg.get("train_trees") or []
    if not isinstance(value, (list, tuple)):
        raise InputError(f"must be a list of {{breadth, depth, oversample}} mappings, got {value!r}",
                         "train_trees")
    out = []
    for i, item in enumerate(value):
        where = f"train_trees[{i}]"
        if not isinstance(item, dict) or not item:
            raise InputError(f"must be a non-empty mapping of {', '.join(TREE_KEYS)}, got {item!r}", where)
        bad = sorted(set(item) - set(TREE_KEYS))
        if bad:
            raise InputError(f"unknown keys {bad} (known: {', '.join(TREE_KEYS)})", where)
        try:
            tree = {k: (float(v) if k == "oversample" else int(v)) for k, v in item.items()}
        except (TypeError, ValueError) as e:
            raise InputError(str(e), where) from None
        if any(v < 1 for v in tree.values()):
            raise InputError(f"breadth and depth must be ≥ 1 and oversample ≥ 1, got {item!r}", where)
        out.append(tree)
    if len({json.dumps(t, sort_keys=True) for t in out}) != len(out):
        raise InputError("the same tree is listed twice", "train_trees")
    return out


def label_sources(value) -> list[str]:
    """The config's ``labels`` (one source, a comma-separated list, or a YAML list) as a list of specs."""
    from branchgate.logs_to_dataset.label_sources import parse_spec

    out = [s for s in listed(value) if s]
    if not out:
        raise InputError("no label source given", "labels")
    if len(set(out)) != len(out):
        raise InputError(f"a label source is listed twice in {out}", "labels")
    for spec in out:
        parse_spec(spec)  # an unknown source fails before any work
    return out


def gate_family(index: int, source: str) -> str:
    """The gate trained on the first label source is ``gate``; the others are ``gate[SOURCE]``."""
    return "gate" if index == 0 else f"gate[{source}]"


def run_bench(env_path: str, train_file: str, eval_file: str, out: str | Path, cfg: dict, real: list[str] = (),
              progress: bool = False, command: str | None = None):
    """Run (or reuse) every step; returns ``(report, paths, steps)`` (``command``, the invocation, is recorded)."""
    from branchgate.bench.cli import check_disjoint, read_ids
    from branchgate.models.encoder import resolve
    from branchgate.pipeline import env as envmod

    started = time.perf_counter()
    sources = label_sources(cfg["labels"])
    shapes = train_shapes(cfg)  # fails before any work
    trees = train_trees(cfg)
    env = envmod.load(env_path)
    train_ids, eval_ids = read_ids(env, train_file), read_ids(env, eval_file)
    check_disjoint(train_file, train_ids, eval_file, eval_ids)
    real_fp = [_manifest_hash(p) for p in real]  # a missing --real path fails before any work
    out = check_output_dir(out, [env.path, train_file, eval_file, *_outside_own_output(real, out)], OUTPUT_KIND,
                           in_place=True)
    out.mkdir(parents=True, exist_ok=True)
    mark_output_dir(out, OUTPUT_KIND)
    steps = Steps(out)
    enc = cfg["encoder"]
    enc_id = resolve(enc).id
    seeds = [int(s) for s in cfg["seeds"]]
    train_seeds = [int(s) for s in (cfg["seeds"] if cfg.get("train_seeds") is None else cfg["train_seeds"])]
    if not seeds or not train_seeds:
        raise InputError("seeds and train_seeds need at least one seed each", "bench config")
    from branchgate.logs_to_dataset.decisions import check_split_by

    cfg = {**cfg, "split_by": check_split_by(str(cfg.get("split_by") or "run"))}  # fails before any work
    boot = int(cfg["bootstrap"])
    workers = max(1, int(cfg.get("workers") or os.cpu_count() or 1))
    sim_cfg = {k: cfg[k] for k in SIM_KEYS}
    base = {"env": env.fingerprint(), "encoder": enc_id}

    def write_ids(folder: Path, ids: list[str]) -> str:
        path = folder / "queries.txt"
        atomic_write_text(path, "\n".join(ids) + "\n")
        return str(path)

    def simulate_step(folder: Path) -> dict:
        from branchgate.pipeline.config import Config
        from branchgate.pipeline.simulate import simulate

        qf = write_ids(folder, train_ids)
        # (folder, settings over the top-level ones) of each kind of training run: the shapes, then train_trees
        kinds = [(folder, {}) if shape == "tree" else (folder / shape, {"shape": shape, "depth": int(cfg["chain_depth"])})
                 for shape in shapes] + [(folder / f"tree{i}", tree) for i, tree in enumerate(trees)]
        runs, traces = 0, []
        for sub, extra in kinds:
            for seed in train_seeds:
                s = simulate(env_path, Config(**{**_sim(cfg, seed, enc), **extra}, pre="none"), sub / f"seed{seed}",
                             queries_file=qf, progress=progress, workers=workers)
                runs += s["n_runs"]
                traces.append(str(sub / f"seed{seed}" / "traces"))
        return {"runs": runs, "traces": traces}

    shape_inputs = {} if shapes == ["tree"] else {"shapes": shapes, "chain_depth": int(cfg["chain_depth"])}
    if trees:
        shape_inputs["trees"] = trees
    sim = steps.run("simulate", {**base, "sim": sim_cfg, "seeds": train_seeds, "queries": train_ids, **shape_inputs},
                    simulate_step)

    def closed_loop(folder: Path, pts, upstream: str) -> dict:
        from branchgate.models.encoder import Encoder

        qf = write_ids(folder, eval_ids)
        encoder = Encoder.load(enc) if workers <= 1 else None
        by_seed = [closed_loop_mod.run_points(env_path, _sim(cfg, seed, enc), pts, qf, folder / f"seed{seed}",
                                              {"queries": eval_ids, "export": upstream}, encoder=encoder,
                                              progress=progress, workers=workers) for seed in seeds]
        return {"runs": closed_loop_mod.average_seeds(by_seed)}

    baselines = baseline_points(cfg["policies"])
    loop_inputs = {**base, "sim": sim_cfg, "seeds": seeds, "queries": eval_ids}
    cl = steps.run("closed_loop", {**loop_inputs, "points": [(p.name, p.spec) for p in baselines]},
                   keeps_folder(lambda folder: closed_loop(folder, baselines, "")))
    real_sets = steps.run("real_data", {"real": [str(p) for p in real], "manifests": real_fp, "encoder": enc_id},
                          lambda folder: _real_datasets(real, folder, enc, progress))
    eval_set = steps.run("eval_data", {**loop_inputs, "point": ("none", "none")},  # what the unpruned runs depend on
                         lambda folder: _eval_dataset(out / "closed_loop", seeds, folder, enc, progress))
    pts, runs = list(baselines), dict(cl["runs"])
    per_source = {}
    for i, source in enumerate(sources):
        family = gate_family(i, source)
        res = _source_steps(steps, source, family, cfg, enc_id, sim, real_sets, closed_loop, loop_inputs, boot, progress,
                            eval_set)
        pts += res.pop("points")
        runs.update(res.pop("runs"))
        per_source[source] = res
    budgets = _budget_step(steps, cfg, per_source[sources[0]]["controller"], per_source[sources[0]]["export_fp"], boot=boot,
                           loop_inputs=loop_inputs, eval_ids=eval_ids, env_path=env_path, enc=enc, workers=workers,
                           progress=progress)
    for source, res in per_source.items():
        res.pop("controller", None)
        res.pop("export_fp", None)
        res["gate_vs"] = closed_loop_mod.gate_vs(pts, runs, boot, family=res["family"])
        for variant in VARIANTS:
            curve = variant_family(res["family"], variant)
            if any(p.family == curve for p in pts):
                res[variant] = {"family": curve, "gate_vs": closed_loop_mod.gate_vs(pts, runs, boot, family=curve)}
    first = per_source[sources[0]]
    report = {"policies": closed_loop_mod.summarize(pts, runs, boot), "gate_vs": first["gate_vs"],
              "offline": first["offline"], "offline_by_depth": first["offline_by_depth"],
              "offline_eval_by_depth": first["offline_eval_by_depth"], "real": first["real"],
              "real_by_depth": first["real_by_depth"], "labels": first["labels"], "by_labels": per_source, "encoder": enc_id,
              "timings": {**steps.timings, "total": round(time.perf_counter() - started, 2)},
              "queries": {"train": len(train_ids), "eval": len(eval_ids)}, "tau": first["tau"],
              "steps_run": list(steps.ran), "fingerprints": dict(steps.fingerprints)}
    if budgets is not None:
        report["budgets"] = budgets
    from branchgate.bench.report import findings
    from branchgate.training.metrics import clean

    report = clean(report)
    report["findings"] = findings(report)
    if command:
        report["command"] = command
    return report, write(out, report), steps


def _source_steps(steps: Steps, source: str, family: str, cfg: dict, enc_id: str, sim: dict, real_sets: dict,
                  closed_loop, loop_inputs: dict, boot: int, progress: bool, eval_set: dict) -> dict:
    """One label source's steps, under OUT/<source>/: dataset → train → export → the gate's closed-loop points
    → offline metrics (its own test split and labels) → offline_eval (the eval queries' unpruned runs,
    ``eval_data``, by their key points) → real decisions."""
    enc = cfg["encoder"]
    key = safe_name(source)
    split_by = cfg["split_by"]  # run_bench's checked value; the default leaves the step's fingerprint as it was

    def dataset_step(folder: Path) -> dict:
        from branchgate.logs_to_dataset.build import build

        m = build(sim["traces"], folder / "dataset", encoder=enc, labels=source,
                  positive_rate=float(cfg["positive_rate"]), label_options=dict(cfg.get("label_options") or {}),
                  progress=progress, split_by=split_by)
        return {"dataset": str(folder / "dataset"), "n_runs": m.get("n_runs"),
                "n_rows": (m.get("n_decisions") or {}).get("total"),
                "label_kind": m.get("label_kind"), "label_threshold": m.get("label_threshold"),
                "label_threshold_rule": m.get("label_threshold_rule"),
                "positive_rate": (m.get("positive_rate") or {}).get(m.get("label_kind")),
                "labels": m.get("labels")}

    ds = steps.run(f"{key}/dataset", {"upstream": steps.fingerprints["simulate"], "labels": source,
                                      "positive_rate": cfg["positive_rate"], "label_options": cfg.get("label_options"),
                                      "encoder": enc_id, **({"split_by": split_by} if split_by != "run" else {})},
                   dataset_step)

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

    tr = steps.run(f"{key}/train", {"upstream": steps.fingerprints[f"{key}/dataset"], "train": cfg["train"]},
                   train_step)

    def export_step(folder: Path) -> dict:
        from branchgate.export.controller import export_controller

        onnx = folder / "controller.onnx"
        rep = export_controller(tr["checkpoint"], onnx, int8=False, parity_dataset=ds["dataset"])
        return {"controller": str(onnx), "passed": rep.get("passed") if isinstance(rep, dict) else None}

    ex = steps.run(f"{key}/export", {"upstream": steps.fingerprints[f"{key}/train"]}, export_step)
    pts = gate_points(cfg["policies"], ex["controller"], family, variants=family == "gate")
    gl = steps.run(f"{key}/closed_loop", {**loop_inputs, "upstream": steps.fingerprints[f"{key}/export"],
                                          "points": [(p.name, p.spec) for p in pts]},
                   keeps_folder(lambda folder: closed_loop(folder, pts, steps.fingerprints[f"{key}/export"])))

    def offline_step(folder: Path) -> dict:
        rows = stats.controller_rows(tr["checkpoint"], ds["dataset"], ("test",))
        return {"offline": stats.scorer_metrics(rows, boot, ref="gate"),
                "offline_by_depth": stats.by_depth(rows, boot, ref="gate")}

    off = steps.run(f"{key}/offline", {"upstream": steps.fingerprints[f"{key}/train"], "bootstrap": boot},
                    offline_step)

    def real_rows():
        for name, path in real_sets["datasets"].items():
            yield name, stats.controller_rows(tr["checkpoint"], path, ("train", "validation", "test"))

    def real_step(folder: Path) -> dict:
        return {name: _real_table(stats.scorer_metrics(rows, boot, ref="gate")) for name, rows in real_rows()}

    def real_by_depth_step(folder: Path) -> dict:
        """The real decisions per depth stratum: depth 0 is a sequential agent's first search (no search state
        yet), where every relevance scorer ranks alike; depth ≥ 1 has earlier searches to judge against."""
        return {name: {k: _real_table(t) for k, t in stats.by_depth(rows, boot, ref="gate").items()}
                for name, rows in real_rows()}

    def offline_eval_step(folder: Path) -> dict:
        rows = stats.controller_rows(tr["checkpoint"], eval_set["dataset"], ("train", "validation", "test"))
        return {"offline_eval": stats.scorer_metrics(rows, boot, ref="gate"),
                "offline_eval_by_depth": stats.by_depth(rows, boot, ref="gate")}

    oe = ({"offline_eval": {}, "offline_eval_by_depth": {}} if not eval_set.get("dataset") else
          steps.run(f"{key}/offline_eval", {"upstream": steps.fingerprints[f"{key}/train"], "bootstrap": boot,
                                            "eval_data": steps.fingerprints["eval_data"]}, offline_eval_step))

    real_inputs = {"upstream": steps.fingerprints[f"{key}/train"], "real": steps.fingerprints["real_data"],
                   "bootstrap": boot}
    rl = steps.run(f"{key}/real", real_inputs, real_step)
    rd = steps.run(f"{key}/real_by_depth", real_inputs, real_by_depth_step)
    labels = {"source": source, "kind": ds.get("label_kind"), "threshold": ds.get("label_threshold"),
              "threshold_rule": ds.get("label_threshold_rule"), "positive_rate": ds.get("positive_rate"),
              "counts": ds.get("labels")}
    return {"family": family, "labels": labels, "tau": tr.get("tau"), "train_auroc": tr.get("auroc"),
            "controller": ex["controller"], "export_fp": steps.fingerprints[f"{key}/export"],
            "offline": off["offline"], "offline_by_depth": off["offline_by_depth"], **oe, "real": rl,
            "real_by_depth": rd, "points": pts, "runs": gl["runs"]}


def _real_table(table: dict) -> dict:
    """A real-decision table as reported: per scorer AUROC, AUPRC, CI and (not the gate) gate − scorer."""
    return {k: {"auroc": m["auroc"], "auprc": m["auprc"], "ci95": m["ci95_auroc"], "n_rows": m["n_rows"],
                **({"delta_vs_gate": m["delta_vs_gate"]} if "delta_vs_gate" in m else {})}
            for k, m in table.items()}


def _budget_step(steps: Steps, cfg: dict, first_export: str, export_fp: str, boot: int, loop_inputs: dict,
                 eval_ids: list[str], env_path: str, enc: str, workers: int, progress: bool) -> dict | None:
    """``budgets``: run budgets at ``budget_fractions`` of each query's unpruned tokens (``bench/budgets.py``) —
    the first label source's gate with and without deferral, and ``budget_baselines`` given the same budget —
    on the first ``budget_queries`` eval queries (0 = all). None when no fraction is configured."""
    from branchgate.bench import budgets as budgets_mod
    from branchgate.bench.policies import budget_points

    section = cfg["policies"]
    pts = budget_points(section, first_export)
    if not pts:
        return None
    n = int(section.get("budget_queries") or 0)
    ids = eval_ids[:n] if n > 0 else list(eval_ids)
    seeds = [int(s) for s in cfg["seeds"]]
    references = {}  # per seed: the unpruned runs that size each query's budget (read, not re-run)
    for seed in seeds:
        none_dir = steps.out / "closed_loop" / f"seed{seed}" / "none"
        none = closed_loop_mod.per_query(none_dir)
        missing = [q for q in ids if q not in none]
        if missing:
            raise InputError(f"{len(missing)} eval queries have no unpruned run to size their budget "
                             f"(e.g. {missing[0]!r})", str(none_dir))
        references[seed] = {q: none[q] for q in ids}
    inputs = {**loop_inputs, "queries": ids, "points": [(p.name, p.spec) for p in pts], "export": export_fp,
              "reference": {s: {q: [t["nodes"], t["tokens"]] for q, t in r.items()} for s, r in references.items()}}

    @keeps_folder
    def run(folder: Path) -> dict:
        qf = folder / "queries.txt"
        atomic_write_text(qf, "\n".join(ids) + "\n")
        by_seed, checks = [], {p.name: [] for p in pts}
        encoder = None
        if workers <= 1:
            from branchgate.models.encoder import Encoder

            encoder = Encoder.load(enc)
        for seed in seeds:
            ref_path = budgets_mod.write_reference(references[seed], folder / f"seed{seed}" / "reference.json")
            sim = {**_sim(cfg, seed, enc), "budget_reference": ref_path}
            out = folder / f"seed{seed}"
            by_seed.append(closed_loop_mod.run_points(env_path, sim, pts, str(qf), out,
                                                      {"queries": ids, "export": export_fp}, encoder=encoder,
                                                      progress=progress, workers=workers))
            reference = json.loads(Path(ref_path).read_text())
            for p in pts:
                checks[p.name] += budgets_mod.check_runs(out / safe_name(p.name), p.budget, reference)
        runs = closed_loop_mod.average_seeds(by_seed)
        return budgets_mod.summarize(pts, runs, checks, boot)

    return steps.run("budgets", inputs, run)


def _real_datasets(real: list[str], folder: Path, enc: str, progress: bool) -> dict:
    """``{"datasets": {NAME: decision dataset}}``: each ``--real`` path, trace folders built into datasets
    (``dataset build --labels auto``) once for every label source."""
    from branchgate.logs_to_dataset.build import build

    result: dict[str, str] = {}
    for path in real:
        name = Path(path).resolve().name
        name = name if name not in result else f"{name}-{len(result)}"
        if not (Path(path) / "manifest.json").is_file():  # agent traces: build their decision dataset first
            dest = folder / safe_name(name) / "dataset"
            build([path], dest, encoder=enc, labels="auto", progress=progress)
            path = dest
        result[name] = str(path)
    return {"datasets": result}


def _eval_dataset(loop_folder: Path, seeds: list[int], folder: Path, enc: str, progress: bool) -> dict:
    """``eval_data``: the eval queries' unpruned closed-loop runs (policy ``none``, every seed) as a decision
    dataset labelled by their key points: held-out queries, every branch expanded, so every candidate has a
    label. ``{"dataset": None}`` when those runs carry no key points (an environment without them)."""
    from branchgate.logs_to_dataset.build import build

    traces = [loop_folder / f"seed{s}" / "none" / "traces" for s in seeds]
    dest = folder / "dataset"
    m = build([str(t) for t in traces], dest, encoder=enc, labels="keypoints", progress=progress)
    labelled = sum(v for s in m["labels"].values() for k, v in s.items() if k in ("0", "1"))
    return {"dataset": str(dest) if labelled else None, "runs": m["n_runs"]["total"], "labelled": labelled}


def _outside_own_output(real: list[str], out: str | Path) -> list[str]:
    """The ``--real`` paths that are inputs to keep apart from ``out``: all but those inside an earlier bench
    output at ``out`` (its own dataset or traces scored as real decisions, which the bench made)."""
    if not (Path(out).is_dir() and is_output_of(out, OUTPUT_KIND)):
        return list(real)
    root = Path(os.path.realpath(out))
    return [p for p in real if root not in Path(os.path.realpath(p)).parents]


def _manifest_hash(path) -> str:
    """A decision dataset's manifest, or a trace folder's file names, sizes and mtimes, hashed."""
    from branchgate.bench.steps import fingerprint

    path = Path(path)
    m = path / "manifest.json"
    if m.is_file():
        return fingerprint(json.loads(m.read_text()))
    if not path.exists():
        raise InputError("not found (--real takes decision datasets or trace folders)", str(path))
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return fingerprint([(str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in files])
