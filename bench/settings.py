"""The bench's settings, read and checked before any work (``load_config``, ``prepare``), and ``BenchRun``: what every
step of one invocation shares (the checked settings, the query ids, the step cache)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from branchgate.bench import closed_loop
from branchgate.bench.closed_loop import safe_name
from branchgate.bench.steps import Steps, fingerprint
from branchgate.data.decision_batches import read_manifest
from branchgate.errors import InputError
from branchgate.fileio import atomic_write_text
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.label_sources import parse_spec
from branchgate.models.encoder import Encoder
from branchgate.pipeline.simulate import select_queries
from branchgate.texts import SNIPPET_WORDS

SECTIONS = ("train", "policies", "experimental")  # the config's mappings, each merged key by key over the defaults
SIM_KEYS = ("breadth", "depth", "oversample", "top_k")
LATER_SIM_KEYS = {
    "snippet_words": SNIPPET_WORDS
}  # simulation keys added later, with their defaults: in the steps' inputs only
# when set to something else, so that outputs cached before the key existed stay valid


def sim_settings(cfg: dict) -> dict:
    """The bench config's simulation settings (``pipeline.config.Config`` keys) as the steps' inputs record them."""
    out = {k: cfg[k] for k in SIM_KEYS}
    out.update({k: cfg[k] for k, default in LATER_SIM_KEYS.items() if cfg.get(k, default) != default})
    return out


TREE_KEYS = ("breadth", "depth", "oversample")
MOVED = "options measured without a gain are under experimental: or were removed (docs/bench.md#experimental)"


def load_config(name: str) -> dict:
    """A bench YAML (a path, or a packaged config's name) over the packaged ``configs/bench.yaml``: top-level keys
    replace the defaults, the ``SECTIONS`` are merged key by key; an unknown key is an error naming it."""
    import yaml

    packaged = Path(str(files("branchgate.configs")))
    path = Path(name)
    if not path.is_file():
        path = next((p for p in (packaged / name, packaged / f"{name}.yaml") if p.is_file()), path)
    if not path.is_file():
        raise InputError("bench config not found", name)
    base = yaml.safe_load((packaged / "bench.yaml").read_text())
    cfg = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cfg, dict):
        raise InputError("expected a mapping of bench settings", str(path))
    _known(cfg, base, str(path))
    for key in SECTIONS:
        section = cfg.get(key) or {}
        if not isinstance(section, dict):
            raise InputError(f"expected a mapping, got {section!r}", f"{path}: {key}")
        _known(section, base[key], f"{path}: {key}")
        cfg[key] = {**base[key], **section}
    return {**base, **cfg}


def _known(cfg: dict, base: dict, where: str) -> None:
    unknown = sorted(set(cfg) - set(base))
    if unknown:
        raise InputError(f"unknown keys {unknown} (known: {sorted(base)}); {MOVED}", where)


def listed(value) -> list[str]:
    """A config list given as a YAML list or a comma-separated string, each item stripped."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(s).strip() for s in items]


def label_sources(value) -> list[str]:
    """The config's ``labels`` (one source, a comma-separated list, or a YAML list) as a list of specs."""
    out = [s for s in listed(value) if s]
    if not out:
        raise InputError("no label source given", "labels")
    if len(set(out)) != len(out):
        raise InputError(f"a label source is listed twice in {out}", "labels")
    for spec in out:
        parse_spec(spec)  # an unknown source fails before any work
    return out


GATE_STAGES = ("pre", "read")  # the stages a bench trains a learned gate for (``gate_stages``)


def gate_stages(cfg: dict) -> list[str]:
    """The config's ``gate_stages``: ``[pre]`` or ``[pre, read]`` (the pre-retrieval gate is the report's headline
    and the read gate's partner in the two-stage curves, so it is always trained)."""
    out = listed(cfg.get("gate_stages") or ["pre"])
    bad = [s for s in out if s not in GATE_STAGES]
    if bad or "pre" not in out or len(set(out)) != len(out):
        raise InputError(f"expected [pre] or [pre, read], got {out}", "gate_stages")
    return out


def train_trees(cfg: dict) -> list[dict]:
    """``experimental.train_trees``: extra tree-shaped training runs, each a mapping of ``breadth``, ``depth`` and
    ``oversample`` that overrides the top-level keys (wider or narrower sibling sets than the eval's), checked."""
    key = "experimental.train_trees"
    value = (cfg.get("experimental") or {}).get("train_trees") or []
    if not isinstance(value, (list, tuple)):
        raise InputError(f"must be a list of {{breadth, depth, oversample}} mappings, got {value!r}", key)
    out = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
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
        raise InputError("the same tree is listed twice", key)
    return out


def seed_lists(cfg: dict) -> tuple[list[int], list[int]]:
    """``(seeds, train seeds)``: the eval's simulation seeds, and the training runs' (``experimental.train_seeds``,
    else ``seeds``); each needs at least one."""
    own = (cfg.get("experimental") or {}).get("train_seeds")
    out = [int(s) for s in cfg["seeds"]], [int(s) for s in (cfg["seeds"] if own is None else own)]
    if not all(out):
        raise InputError("seeds and train_seeds need at least one seed each", "bench config")
    return out


def read_ids(env, path: str) -> list[str]:
    return list(dict.fromkeys(q for q, _ in select_queries(env, None, path)))  # InputError names file and line


def check_disjoint(train_file: str, train: list[str], eval_file: str, ev: list[str]) -> None:
    common = sorted(set(train) & set(ev))
    if common:
        raise InputError(
            f"{len(common)} query ids are in both {train_file} and {eval_file} (e.g. {common[0]!r}); "
            "the train and eval sets must not overlap",
            eval_file,
        )


@dataclass
class BenchRun:
    """One bench invocation: the checked settings and query ids every step reads, and the step cache."""

    env_path: str
    cfg: dict  # split_by checked
    steps: Steps
    sources: list[str]  # label sources, the first one's gate is the report's headline gate
    stages: list[str]  # gate_stages: pre, and read when the bench trains read gates too
    train_ids: list[str]
    eval_ids: list[str]
    seeds: list[int]
    train_seeds: list[int]
    trees: list[dict]  # experimental.train_trees
    enc_id: str  # the resolved encoder id (fingerprints); ``enc`` is the config's name for it
    env_fp: str
    progress: bool = False

    @property
    def enc(self) -> str:
        return self.cfg["encoder"]

    @property
    def boot(self) -> int:
        return int(self.cfg["bootstrap"])

    @property
    def workers(self) -> int:
        return max(1, int(self.cfg.get("workers") or os.cpu_count() or 1))

    @property
    def base(self) -> dict:
        """The inputs of every step: the environment and the encoder."""
        return {"env": self.env_fp, "encoder": self.enc_id}

    @property
    def loop_inputs(self) -> dict:
        """The inputs of every closed-loop step: the simulation settings, seeds and eval queries."""
        return {**self.base, "sim": sim_settings(self.cfg), "seeds": self.seeds, "queries": self.eval_ids}

    def sim(self, seed: int) -> dict:
        """One seed's simulation settings (``pipeline.config.Config`` keys)."""
        return {**sim_settings(self.cfg), "seed": int(seed), "encoder": self.enc}

    def closed_loop(self, folder: Path, pts, upstream: str) -> dict:
        """``pts`` on the eval queries for every seed, averaged over seeds (``upstream``: the export they use)."""
        qf = write_ids(folder, self.eval_ids)
        encoder = Encoder.load(self.enc) if self.workers <= 1 else None
        by_seed = [
            closed_loop.run_points(
                self.env_path,
                self.sim(seed),
                pts,
                qf,
                folder / f"seed{seed}",
                {"queries": self.eval_ids, "export": upstream},
                encoder=encoder,
                progress=self.progress,
                workers=self.workers,
            )
            for seed in self.seeds
        ]
        return {"runs": closed_loop.average_seeds(by_seed)}


def write_ids(folder: Path, ids: list[str]) -> str:
    """``folder/queries.txt``, one id per line (the ``--queries`` file of a simulation); its path."""
    path = folder / "queries.txt"
    atomic_write_text(path, "\n".join(ids) + "\n")
    return str(path)


def real_datasets(real: list[str], folder: Path, enc: str, progress: bool, reads: bool = False) -> dict:
    """``{"datasets": {NAME: decision dataset}}``: each ``--real`` path, trace folders built into datasets
    (``dataset build --labels auto``) once for every label source; with ``reads`` also ``"read_datasets"``: each
    trace folder's read decisions (``--stage read``), and each read dataset given as such."""
    result: dict[str, str] = {}
    read: dict[str, str] = {}
    for path in real:
        name = Path(path).resolve().name
        name = name if name not in result else f"{name}-{len(result)}"
        if (Path(path) / "manifest.json").is_file():
            (read if read_manifest(path).get("stage") == "read" else result)[name] = str(path)
            continue
        dest = folder / safe_name(name)  # agent traces: build their decision datasets first
        build([path], dest / "dataset", encoder=enc, labels="auto", progress=progress)
        result[name] = str(dest / "dataset")
        if reads:
            build([path], dest / "read_dataset", encoder=enc, labels="auto", progress=progress, stage="read")
            read[name] = str(dest / "read_dataset")
    return {"datasets": result, **({"read_datasets": read} if reads else {})}


def manifest_hash(path) -> str:
    """A decision dataset's manifest, or a trace folder's file names, sizes and mtimes, hashed."""
    path = Path(path)
    m = path / "manifest.json"
    if m.is_file():
        return fingerprint(json.loads(m.read_text()))
    if not path.exists():
        raise InputError("not found (--real takes decision datasets or trace folders)", str(path))
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return fingerprint(
        [(str(p.relative_to(path) if path.is_dir() else p.name), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    )
