"""``branchgate dataset build``: agent run logs → decision dataset split by run.

Reads canonical JSONL traces, Search-o1 traces (``<qid>.q`` + ``<qid>.a``), GPT-Researcher
``outputs/task_*.json`` logs and OpenInference / OpenTelemetry span exports (OTLP JSON, Phoenix spans)
(auto-detected per file; ``--format`` forces one), turns every decision
point into one row per candidate with realized labels and per-teacher pre-retrieval scores, and
writes a Hugging Face ``DatasetDict`` (train / validation / test by hash of run_id) + ``manifest.json``.
Search-o1 evidence gets DeepResearchGym key-point labels from ``--keypoints`` (default: a ``key_point/``
folder beside the traces' folder), so its utility is the number of new key points covered. ``--labels``
chooses the label source (keypoints, citations, teacher:NAME, judge; ``logs_to_dataset/label_sources.py``).
``--stage read`` builds the read gate's dataset instead: one row per new hit of each search's result list
(``logs_to_dataset/read_rows.py``).
Bad records are skipped and listed in the manifest (``--strict``: the first one fails, exit 2); exit 1
if nothing could be parsed.
"""

from __future__ import annotations

import argparse
import sys

from branchgate.data.dataset_schema import STAGES
from branchgate.logs_to_dataset.build import BATCH_TEXTS, BuildSettings, NothingParsed, run_build
from branchgate.logs_to_dataset.build_report import summary_line
from branchgate.logs_to_dataset.decision_points import SPLIT_BY
from branchgate.logs_to_dataset.labels import PRUNED_LABELS
from branchgate.logs_to_dataset.ray_build import RAY_BATCH_TEXTS, ray_run_build
from branchgate.logs_to_dataset.readers import READERS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--traces", nargs="+", required=True, metavar="PATH", help="trace files or directories (searched recursively)"
    )
    parser.add_argument("--out", required=True, help="output directory (replaced atomically)")
    parser.add_argument(
        "--stage",
        choices=STAGES,
        default="pre",
        help="which gate the dataset trains: pre (default): one row per candidate sub-query of each decision "
        "point; read: one row per new hit of each search's result list (trace schema v2 results events; a run "
        "without them gives no rows, counted in the manifest's read.runs_without_results), with the hit's "
        "title, snippet, rank and url; --labels keypoints, citations, teacher:NAME or auto there",
    )
    parser.add_argument(
        "--labels",
        default="auto",
        metavar="auto|keypoints|returns[:G]|citations|judge|teacher:NAME",
        help="label source (default auto: key points when a run's evidence has them, else "
        "teacher:<--teacher>). keypoints: new ground-truth key points a branch's evidence covers; "
        "returns[:G]: those plus G^k times the ones its expanded descendants k levels below first "
        "cover (G = 0.5; the value of expanding the branch, not only its own gain); "
        "citations: its new evidence items the final report cites; teacher:NAME: the teacher's "
        "post-retrieval set gain of its evidence; judge: key points an LLM judge finds new "
        "(needs --llm-url/--llm-model). A run without what the source needs (no key-point "
        "labels, no report citing evidence) is counted in the manifest (label_missing) and its "
        "candidates excluded (label -1)",
    )
    parser.add_argument(
        "--teacher",
        default="sc",
        help="teacher whose marginal value labels runs without key-point labels under --labels auto, "
        "and scores --pruned-labels teacher_pre (default: sc)",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=sorted(READERS),
        default=None,
        help="force one log format instead of auto-detecting per file",
    )
    parser.add_argument(
        "--encoder",
        default="auto",
        help="sentence encoder: auto (bge-small, else packaged MiniLM), packaged, a hub id or a directory",
    )
    parser.add_argument("--strict", action="store_true", help="fail on the first bad record instead of skipping it")
    parser.add_argument(
        "--label-threshold",
        type=float,
        default=None,
        metavar="X",
        help="label = 1[g >= X] for every source (default: 1 key point, 1 citation; teachers: --positive-rate)",
    )
    parser.add_argument(
        "--positive-rate",
        type=float,
        default=0.1,
        metavar="R",
        help="without --label-threshold, a teacher's threshold is the level at which a fraction R "
        "of the train split's realized utilities is positive, lowered at any depth where fewer than R "
        "would pass (a set gain shrinks as the context grows; validation and test are not looked "
        "at). A teacher's set gain has no fixed scale across logs: every realized SC gain of the "
        "drgym dev runs without key points is below SC's operating point 0.05 (at most 0.017), "
        "an all-negative dataset. Default 0.1, about the key-point labels' positive rate there (9%%); the "
        "manifest records the threshold, its rule and the rate achieved per split",
    )
    add_judge_options(parser)
    parser.add_argument(
        "--pruned-labels",
        choices=PRUNED_LABELS,
        default="excluded",
        help="label of candidates never expanded / without known evidence: excluded (label -1, "
        "default) or teacher_pre (the teacher's pre-retrieval score thresholded)",
    )
    parser.add_argument(
        "--cache",
        default=None,
        metavar="PATH",
        help="embedding cache file (default: $BRANCHGATE_CACHE or ~/.cache/branchgate/embeddings.sqlite)",
    )
    parser.add_argument(
        "--keypoints",
        default="auto",
        metavar="DIR|auto|none",
        help="DeepResearchGym key_point/ folder giving Search-o1 evidence its key-point labels "
        "(auto: the key_point/ folder beside the traces' folder, if any; none: no labels)",
    )
    parser.add_argument(
        "--split-by",
        choices=SPLIT_BY,
        default="run",
        help="what the train/validation/test split hashes: the run id (default), or the run's root "
        "question, so that repeated runs of one question (seeds, retries) share a split",
    )
    parser.add_argument(
        "--partial-runs",
        choices=("keep", "skip"),
        default="keep",
        help="runs without a normal run_end (crashed, truncated, incomplete): keep them (default; "
        "counted in the manifest's partial_runs, with a warning) or skip them (counted and listed "
        "in skipped)",
    )
    parser.add_argument(
        "--embed",
        choices=("onnx", "torch"),
        default="onnx",
        help="how texts are embedded: onnx (default): the encoder's fp32 text tower exported to ONNX "
        "once (cached), checked against the torch encoder at start (same vectors within 1e-6, "
        "else an error), in --workers processes; torch: sentence-transformers (the old path)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="--embed onnx: embedding processes, one onnxruntime thread each (default: the available cores)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local (default): this process; ray: the same build with embedding (an encoder actor "
        "pool) and row building on Ray Data, through Parquet shards (logs_to_dataset/ray_build.py; "
        "needs pip install 'branchgate[ray]'; connects to $RAY_ADDRESS if set, else a local Ray; "
        "--workers: encoder actors)",
    )


def add_judge_options(parser: argparse.ArgumentParser) -> None:
    """``--llm-url`` and ``--llm-model``: the judge label source's endpoint (``dataset build``, ``replay``)."""
    parser.add_argument("--llm-url", default=None, help="--labels judge: an OpenAI-compatible endpoint (base URL)")
    parser.add_argument("--llm-model", default=None, help="--labels judge: the judge model's name")


def judge_options(args: argparse.Namespace) -> dict:
    """The label source's options from ``add_judge_options``' flags (those given)."""
    return {k: v for k, v in (("llm_url", args.llm_url), ("llm_model", args.llm_model)) if v is not None}


def settings_from_args(args: argparse.Namespace):
    """The build's ``BuildSettings`` from the parsed options (``--engine ray``: Ray's batch size)."""
    ray = getattr(args, "engine", "local") == "ray"
    label_options = judge_options(args)
    return BuildSettings(
        args.traces,
        args.out,
        teacher=args.teacher,
        fmt=args.fmt,
        encoder=args.encoder,
        strict=args.strict,
        label_threshold=args.label_threshold,
        cache=args.cache,
        pruned_labels=args.pruned_labels,
        progress=False if args.no_progress else None,
        keypoints=args.keypoints,
        labels=args.labels,
        positive_rate=args.positive_rate,
        label_options=label_options,
        partial_runs=args.partial_runs,
        embed=args.embed,
        workers=args.workers,
        split_by=args.split_by,
        stage=args.stage,
        batch_texts=RAY_BATCH_TEXTS if ray else BATCH_TEXTS,
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    try:
        manifest = ray_run_build(settings) if getattr(args, "engine", "local") == "ray" else run_build(settings)
    except NothingParsed as exc:
        print(f"branchgate: error: {exc}", file=sys.stderr)
        return 1
    print(summary_line(manifest, args.out), file=sys.stderr)
    for warning in manifest["warnings"]:
        print(f"branchgate: warning: {warning}", file=sys.stderr)
    return 0
