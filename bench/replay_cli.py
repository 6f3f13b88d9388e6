"""`branchgate replay`: what the controller(s) would have done on your own unpruned logs, before you switch them on.

    branchgate replay --traces LOGS --pre pre.onnx [--read read.onnx]
        [--labels keypoints|citations|teacher:NAME|judge] [--dataset DIR] [--keep 0.95 | --budget 0.3]
        [--taus T,...] [--run-budgets SHARE,...] --out DIR

Each run of LOGS (any format ``dataset build`` reads) is replayed (``bench/replay.py``) at every τ of the sweep:
the pre-retrieval controller's τ, or with ``--read`` the read controller's (the pre controller, if given, at
``--pre-tau``, default its own). Per τ: searches, hits read, LLM tokens and the value kept (key points, cited
evidence, or a decision dataset's row utilities: ``--dataset``, or ``--labels teacher:NAME|judge``, which builds
that dataset from LOGS into OUT/dataset first and needs the train extra), each as a mean over runs and a share of
the unpruned replay with a 95% interval over runs (``training.stats.bootstrap_ci``). It recommends the τ that keeps
``--keep`` of the value at the fewest tokens, or the most value within ``--budget`` of the tokens, and writes
``replay.json``, ``replay.md`` and ``replay.png``. ``--run-budgets`` adds points that replay the pre controller's
run budget (``RunGate``) at shares of each run's unpruned tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

from branchgate.bench import replay
from branchgate.bench.replay import ReplayRun
from branchgate.bench.replay_report import summarise, write_outputs
from branchgate.data.decision_batches import load_decision_dataset
from branchgate.errors import InputError
from branchgate.fileio import check_output_dir
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_tau, as_threads
from branchgate.inference.options import HELP, deprecated_alias
from branchgate.limits import MAX_BOOTSTRAP
from branchgate.logs_to_dataset.build import build
from branchgate.logs_to_dataset.build_cli import add_judge_options, judge_options

OUTPUT_KIND = "replay"
PRE_TAUS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 0.9)
READ_TAUS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
LABELS = ("keypoints", "citations", "rows", "judge", "teacher:NAME")
ROW_SOURCES = ("judge", "teacher:")  # label sources whose value is a decision dataset's row utilities

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", nargs="+", required=True, help="unpruned run logs: files or folders, any format")
    parser.add_argument("--pre", dest="model", default=None, metavar="PATH", help=HELP["pre"])
    deprecated_alias(parser, "--model", "--pre", "model")
    parser.add_argument(
        "--read", default=None, metavar="PATH", help=HELP["read"] + "; its τ is swept (the pre one held)"
    )
    parser.add_argument(
        "--labels",
        default=None,
        help="value kept: keypoints (evidence key points; default when the runs have them), citations (the "
        "report's cited_ids), teacher:NAME or judge (a decision dataset's row utilities with that label source: "
        "--dataset, else built from --traces into OUT/dataset), rows (--dataset's own; the default with --dataset)",
    )
    add_judge_options(parser)
    parser.add_argument(
        "--dataset",
        default=None,
        help="a decision dataset built from these logs (dataset build, any --labels: teacher:NAME, judge, ...): "
        "value kept = the sum of its rows' utilities over the kept candidates (stage pre) or read hits (read)",
    )
    parser.add_argument("--taus", default=None, help="comma-separated τ to sweep (default: a grid per stage)")
    parser.add_argument(
        "--run-budgets",
        default=None,
        help="comma-separated shares of each run's unpruned tokens: replay the pre controller's run budget "
        "(Gate.run(budget_tokens=share × the run's tokens), spent as the reference pipeline spends it) at each",
    )
    parser.add_argument("--pre-tau", type=float, default=None, help="with --read: the pre controller's τ")
    parser.add_argument("--floor", choices=["root"], default=None, help="the read controller's floor (Gate.select)")
    parser.add_argument("--keep", type=float, default=0.95, help="recommend the τ keeping this share of the value")
    parser.add_argument("--budget", type=float, default=None, help="…or the most value within this token share")
    parser.add_argument("--format", dest="fmt", default=None, help="force one log format (as dataset build)")
    parser.add_argument("--max-runs", type=int, default=0, help="replay the first N runs only (0: all)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of each interval")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for the Gate")
    parser.add_argument("--out", required=True, help="output folder (replay.json, replay.md, replay.png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    check_args(args)
    out = check_output_dir(args.out, [*args.traces, args.model, args.read, args.dataset], OUTPUT_KIND)
    runs, read = load_runs(args)
    sweep = Sweep.from_args(args)
    if sweep.stage == "read" and not any(r.has_results for r in runs):
        raise InputError(
            "no run records its searches' result lists (results events): the read stage cannot be "
            "replayed on these logs",
            "--read",
        )
    value, labels = value_rule(args, runs, sweep.stage, out)
    rows = sweep.run(runs, value, quiet=args.no_progress)
    report = summarise(rows, runs, args, labels, sweep, skipped=[s.as_dict() for s in read.skipped])
    if not report["unpruned"]["tokens"]:
        log.warning("the logs record no LLM calls and no evidence tokens: no token shares, no recommendation")
    written = write_outputs(out, report, OUTPUT_KIND)
    print(report["summary"], file=sys.stderr)
    print(f"wrote {out}/{', '.join(written)}", file=sys.stderr)
    return 0


def check_args(args) -> None:
    """Every option's value, before any work (no log read, no controller loaded, no folder made): an
    ``InputError`` naming the option."""
    if args.model is None and args.read is None:
        raise InputError("give a controller to replay: --pre (pre-retrieval) and/or --read", "--pre")
    if not 0 < args.keep <= 1:
        raise InputError(f"must be in (0, 1], got {args.keep}", "--keep")
    if args.budget is not None and not 0 < args.budget <= 1:
        raise InputError(f"must be in (0, 1], got {args.budget}", "--budget")
    check_labels(args)
    if args.labels == "rows" and args.dataset is None:
        raise InputError("rows labels come from a decision dataset: pass --dataset", "--labels")
    if args.dataset is not None and not Path(args.dataset).is_dir():
        raise InputError("not a folder: a decision dataset is the folder dataset build wrote", args.dataset)
    if not 0 <= args.bootstrap <= MAX_BOOTSTRAP:
        raise InputError(f"must be from 0 to {MAX_BOOTSTRAP} (branchgate.limits.MAX_BOOTSTRAP)", "--bootstrap")
    if args.max_runs < 0:
        raise InputError("must be ≥ 0", "--max-runs")
    if args.pre_tau is not None:
        if args.read is None or args.model is None:
            raise InputError(
                "holds the pre-retrieval controller at this τ while --read's τ is swept: give it with --pre and "
                "--read (without --read, --taus sweeps the pre controller's τ)",
                "--pre-tau",
            )
        as_tau(args.pre_tau, "--pre-tau")
    if args.floor is not None and args.read is None:
        raise InputError("applies to the read controller: give --read", "--floor")
    as_threads(args.threads, "--threads")
    parse_taus(args.taus, ())
    if args.run_budgets is not None:
        parse_shares(args.run_budgets, "--run-budgets")
        if args.model is None or args.read is not None:
            raise InputError("run budgets replay the pre-retrieval controller alone: --pre, no --read", "--run-budgets")


def check_labels(args) -> None:
    """``--labels``: one of ``LABELS``; ``teacher:NAME`` names a teacher; ``judge`` has its endpoint and model; the
    read stage takes only the sources it has (``read_rows.check_read_labels``)."""
    labels = args.labels
    if labels is None:
        return
    if labels not in LABELS[:4] and not labels.startswith("teacher:"):
        raise InputError(f"expected one of {', '.join(LABELS)}, got {labels!r}", "--labels")
    if labels.startswith("teacher:"):
        from branchgate.models import teachers as T

        name = labels.partition(":")[2]
        if name not in T.NAMES:
            raise InputError(f"teacher:NAME names a teacher ({', '.join(T.NAMES)}), got {labels!r}", "--labels")
    if labels == "judge" and not (args.llm_url and args.llm_model):
        raise InputError("judge labels need the judge's endpoint and model: --llm-url and --llm-model", "--labels")
    if args.read is not None and labels != "rows":
        from branchgate.logs_to_dataset.read_rows import check_read_labels

        check_read_labels(labels)


def load_runs(args) -> tuple[list, object]:
    """The runs of ``--traces`` as ``ReplayRun``s (a progress bar on long logs) and the ``ReadReport``; none is an
    error. Records skipped (a bad line, a count out of bounds) are a warning naming the first few by file and line.
    """
    from branchgate.logs_to_dataset.readers import ReadReport, read_runs

    report, runs = ReadReport(), []
    runs_read = read_runs(args.traces, args.fmt, report=report)
    for run in progress(runs_read, disable=args.no_progress, desc="reading runs", unit="run", leave=False):
        runs.append(ReplayRun(run))
        if args.max_runs and len(runs) == args.max_runs:
            break
    if report.skipped:
        first = "; ".join(f"{s.file}{'' if s.line is None else f':{s.line}'}: {s.reason}" for s in report.skipped[:3])
        more = f" (and {len(report.skipped) - 3} more, listed in replay.json)" if len(report.skipped) > 3 else ""
        log.warning("%d record(s) skipped, not replayed: %s%s", len(report.skipped), first, more)
    if not runs:
        raise InputError("no runs found (skipped records, if any, were logged above)", " ".join(args.traces))
    return runs, report


def value_rule(args, runs, stage: str, out) -> tuple:
    """The value-kept rule and its name: ``--labels`` (default keypoints when the runs carry key points, rows
    with ``--dataset``, else citations)."""
    labels = args.labels or (
        "rows" if args.dataset else "keypoints" if any(r.n_key_points for r in runs) else "citations"
    )
    if labels == "keypoints":
        if not any(r.n_key_points for r in runs):
            raise InputError(
                "no run has key-point labels (evidence labels): use --labels citations or --dataset", "--labels"
            )
        return replay.keypoint_value, labels
    if labels == "citations":
        if not any(r.report is not None and r.report.cited_ids for r in runs):
            raise InputError("no run's report records cited_ids: use --labels keypoints or --dataset", "--labels")
        return replay.citation_value, labels
    path = args.dataset or label_dataset(args, labels, stage, out)
    utilities, data_stage, source = dataset_utilities(path)
    if labels != "rows" and source != labels:
        raise InputError(f"{path} is labelled {source}, not {labels}: build it with --labels {labels}", "--dataset")
    if data_stage != stage:
        raise InputError(
            f"{path} is a {data_stage}-stage dataset; this replay sweeps the {stage} stage "
            f"(dataset build --stage {stage})",
            "--dataset",
        )
    check_rows_match(utilities, runs, stage, path)
    return replay.row_value(utilities, stage), f"rows:{source}"


def check_rows_match(utilities: dict, runs, stage: str, path) -> None:
    """The dataset's labelled rows must be rows of these runs — candidates (pre) or hits of their searches (read) —
    or every value would be 0: none matching is an ``InputError``, some runs without one a warning."""
    items = {}
    for r in runs:
        if stage == "pre":
            items[r.run_id] = set(r.cands)
        else:
            items[r.run_id] = {(f"{cid}@{seq}", h.hit_id) for cid, (seq, hits) in r.results.items() for h in hits}
    matched = [k for k in utilities if k[0] in items and (k[1] if stage == "pre" else k[1:]) in items[k[0]]]
    if not matched:
        sample = sorted({k[0] for k in utilities})[:3]
        raise InputError(
            f"no labelled row of {path} matches a {'candidate' if stage == 'pre' else 'hit'} of --traces (its "
            f"runs: {', '.join(map(repr, sample)) or 'none'}{' …' if len({k[0] for k in utilities}) > 3 else ''}; "
            f"these logs': {', '.join(repr(r.run_id) for r in runs[:3])}{' …' if len(runs) > 3 else ''}): every value "
            "would be 0; build the dataset from these logs",
            "--dataset",
        )
    without = len(runs) - len({k[0] for k in matched})
    if without:
        log.warning("%d of the %d runs replayed have no labelled row in %s: their value is 0", without, len(runs), path)


def label_dataset(args, labels: str, stage: str, out) -> str:
    """Build the ``labels`` decision dataset of ``--traces`` at OUT/dataset (``dataset build``; the train extra)."""
    options = judge_options(args)
    path = out / "dataset"
    log.info("building the %s-stage %s dataset of --traces at %s", stage, labels, path)
    build(args.traces, path, labels=labels, stage=stage, fmt=args.fmt, label_options=options)
    return str(path)


def dataset_utilities(path: str) -> tuple[dict, str, str]:
    """``({row key: utility}, stage, label source)`` of a decision dataset (every split, labelled rows)."""
    dd, manifest = load_decision_dataset(path)
    stage = manifest.get("stage", "pre")
    out: dict = {}
    for split in dd:
        part = dd[split]
        keys = zip(part["run_id"], part["frame_id"], part["candidate_id"], part["utility"], part["label"])
        for run_id, frame_id, cid, u, y in keys:
            if y >= 0:
                out[(run_id, cid) if stage == "pre" else (run_id, frame_id, cid)] = float(u)
    return out, stage, str(manifest.get("label_kind", "?"))


class Sweep:
    """The sweep: which stage, the controllers, and its points — each τ, or each run budget (``--run-budgets``: a
    share of each run's unpruned tokens, the pre controller's ``RunGate``)."""

    def __init__(self, pre, read, taus, pre_tau, floor, budgets=()):
        self.pre, self.read, self.taus, self.pre_tau, self.floor = pre, read, taus, pre_tau, floor
        self.budgets = list(budgets)
        self.stage = "read" if read is not None else "pre"

    @classmethod
    def from_args(cls, args) -> Sweep:
        pre = Gate.load(args.model, threads=args.threads) if args.model else None
        read = Gate.load(args.read, threads=args.threads) if args.read else None
        for gate, flag, want in ((pre, "--pre", "pre"), (read, "--read", "read")):
            if gate is not None and gate.stage != want:
                raise InputError(f"{gate.path} is a {gate.stage} controller; {flag} takes a {want} controller", flag)
        budgets = parse_shares(args.run_budgets, "--run-budgets") if args.run_budgets else []
        if budgets and (pre is None or read is not None or hasattr(pre, "teacher")):
            raise InputError(
                "run budgets replay a learned pre-retrieval controller alone: --pre, no --read "
                "(a teacher default has no budgeted runs: pretrained:pre-model)",
                "--run-budgets",
            )
        taus = [] if budgets and args.taus is None else parse_taus(args.taus, READ_TAUS if read else PRE_TAUS)
        pre_tau = args.pre_tau if args.pre_tau is not None else (pre.tau if pre is not None else None)
        return cls(pre, read, taus, pre_tau, args.floor, budgets)

    def points(self) -> list[dict]:
        """The unpruned replay, then each τ, then each run budget."""
        return [{"tau": None}, *({"tau": t} for t in self.taus), *({"run_budget": b} for b in self.budgets)]

    def rules(self, point: dict, run, unpruned_tokens: float):
        """(pre rule, read rule, run budget) of ``point`` for ``run`` (the unpruned point keeps everything)."""
        if "run_budget" in point:
            tokens = max(1, int(point["run_budget"] * unpruned_tokens))  # rounded down, as the pipeline's P%
            return None, None, self.pre.run(budget_tokens=tokens, charges=False)
        tau = point["tau"]
        if tau is None:
            return None, None, None
        if self.stage == "pre":
            return pre_rule(self.pre, tau), None, None
        held = pre_rule(self.pre, self.pre_tau) if self.pre is not None else None
        return held, read_rule(self.read, tau, self.floor), None

    def run(self, runs, value, quiet: bool = False) -> list[dict]:
        """Per point: per-run searches, hits read, tokens and value (a progress bar unless ``quiet``)."""
        rows, base = [], {}
        points = self.points()
        with progress(total=len(points) * len(runs), disable=quiet, desc="replaying", unit="run") as bar:
            for point in points:
                per_run = []
                for r in runs:
                    pre, read, budget = self.rules(point, r, base.get(r.run_id, 0.0))
                    o = r.replay(pre, read, budget)
                    base.setdefault(r.run_id, o.tokens)  # the first point is the unpruned replay
                    per_run.append((o.searches, o.hits_read, o.tokens, value(r, o)))
                    bar.update()
                rows.append({**point, "per_run": per_run})
        return rows


def progress(iterable=None, disable: bool = False, **options):
    """A tqdm bar over ``iterable`` (or a context-managed bar of ``total``); with ``disable``, or without tqdm (the
    core install without the replay extra), the iterable itself, or a bar that counts nothing."""
    tqdm = None if disable else _tqdm()
    if tqdm is None:
        return iterable if iterable is not None else contextlib.nullcontext(_NoBar())
    return tqdm(iterable, **options) if iterable is not None else tqdm(**options)


def _tqdm():
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


def parse_shares(text: str, flag: str) -> list[float]:
    """Comma-separated shares in (0, 1]."""
    try:
        shares = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"expected comma-separated numbers, got {text!r}", flag) from None
    if not shares or any(not 0 < x <= 1 for x in shares):
        raise InputError(f"expected shares in (0, 1], got {text!r}", flag)
    return shares


def parse_taus(text: str | None, default) -> list[float]:
    if text is None:
        return list(default)
    try:
        taus = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"expected comma-separated numbers, got {text!r}", "--taus") from None
    if not taus or any(not 0 <= t <= 1 for t in taus):
        raise InputError(f"expected τ values in [0, 1], got {text!r}", "--taus")
    return taus


def pre_rule(gate, tau: float):
    def keep(frame, state: dict, cands: list) -> list[int]:
        return gate.select(state, [{"query": q, "goal": g} for q, g in cands], tau=tau).kept

    return keep


def read_rule(gate, tau: float, floor: str | None):
    def keep(state: dict, hits: list) -> list[int]:
        listed = [
            {"id": h.hit_id, "title": h.title or "", "snippet": h.snippet or "", "rank": i} for i, h in enumerate(hits)
        ]
        return gate.select(state, listed, tau=tau, floor=floor).kept

    return keep
