"""The `branchgate` command line.

Each command lives in the module that owns the work; this file only lists them. A command module
exposes ``configure(parser)`` (adds its arguments) and ``run(args) -> int`` (does the work, returns
the exit code). Heavy imports (torch, datasets) belong inside ``run`` so ``--help`` stays fast and the
core install (no torch) can still run ``branchgate gate``.

Exit codes: 0 success, 1 the work ran but failed (e.g. parity check, nothing parsed), 2 bad usage or
bad input (the message names the file/field), 130 interrupted.
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

import argparse
import importlib
import logging
import sys

from branchgate import __version__
from branchgate.errors import BranchgateError

# (command path, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (
        ("dataset", "build"),
        "branchgate.logs_to_dataset.build_cli",
        "Turn agent run logs into a decision dataset split by run.",
    ),
    (("env", "build"), "branchgate.pipeline.env_cli", "Build a local retrieval environment from benchmark data."),
    (
        ("simulate",),
        "branchgate.pipeline.simulate_cli",
        "Run the reference deep-research pipeline and write canonical traces.",
    ),
    (("train",), "branchgate.training.cli", "Train the value model (LightningCLI conventions: --config, overrides)."),
    (
        ("evaluate",),
        "branchgate.training.evaluate_cli",
        "Evaluate a checkpoint on a dataset's test split against the baselines.",
    ),
    (("export",), "branchgate.export.cli", "Export a checkpoint to an ONNX controller (with parity check)."),
    (("gate",), "branchgate.inference.gate_cli", "Gate one decision read as JSON on stdin with an ONNX controller."),
    (
        ("serve",),
        "branchgate.inference.server.cli",
        "Serve controllers over HTTP/JSON: both stages and budgeted runs (the serve extra).",
    ),
    (("bench-gate",), "branchgate.export.latency_cli", "Latency of the ONNX Gate (fp32, int8) vs the torch model."),
    (
        ("bench",),
        "branchgate.bench.cli",
        "The held-out experiment in one command: simulate, dataset, train, export, closed loop, report.",
    ),
    (
        ("replay",),
        "branchgate.bench.replay_cli",
        "Replay controllers on your own unpruned logs: what each τ saves and keeps, and the τ to use.",
    ),
    (
        ("quickstart",),
        "branchgate.quickstart",
        "The whole chain on the bundled sample: simulate, dataset, train, evaluate, export.",
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="branchgate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"branchgate {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, module, help_text in COMMANDS:
        subs = top
        for i, word in enumerate(path[:-1]):
            key = " ".join(path[: i + 1])
            if key not in groups:
                group = subs.add_parser(word, help=f"{word} commands")
                groups[key] = group.add_subparsers(dest=f"{word}_command", metavar="COMMAND", required=True)
            subs = groups[key]
        cmd = subs.add_parser(path[-1], help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        _configure(cmd, module)
    return parser


def _configure(parser: argparse.ArgumentParser, module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # A command whose module needs an extra that is not installed still shows in --help.
        parser.set_defaults(_missing=missing(exc.name))
        return
    mod.configure(parser)


EXTRAS = {"fastapi": "serve", "starlette": "serve", "uvicorn": "serve", "ray": "ray"}  # else: train


def install_hint(module: str | None) -> str:
    """The install command that provides a missing module: its extra (``EXTRAS``; anything else is train's)."""
    extra = EXTRAS.get((module or "").partition(".")[0], "train")
    return f"pip install 'branchgate[{extra}]'"


def missing(module: str) -> str:
    """What every command says when a module of an extra is missing: the extra, installed from the package or from a
    clone of the repository (branchgate is on no package index)."""
    extra = install_hint(module).split("[", 1)[1].split("]", 1)[0]
    return f"{module} is not installed ({install_hint(module)}; in a clone: pip install '.[{extra}]')"


class _CurrentStderr(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is then, not to the stream of the first ``main`` call (a caller
    that swaps ``sys.stderr`` between calls, as tests do, would leave the handler writing to a closed stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the property always reads sys.stderr
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        handlers=[_CurrentStderr()],
    )
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"branchgate: error: {args._missing}", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except BranchgateError as exc:
        print(f"branchgate: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.partition(".")[0] == "branchgate":
            raise  # a module of branchgate itself: a bug, not a missing extra
        print(f"branchgate: error: {missing(exc.name)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("branchgate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
