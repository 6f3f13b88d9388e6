"""``branchgate train``: arguments follow LightningCLI conventions and are handed to it unparsed.

    branchgate train --config configs/quickstart.yaml --trainer.max_epochs=3 --model.hidden=128
    branchgate train --help          (every option: --model.*, --data.*, --trainer.*, --calibration.*, ...)
    branchgate train --config bench_train --data.dataset real_read --init-from pretrained:read --folds 5 --out ft

``--init-from CONTROLLER`` starts from a trained controller (training/init_from.py says what stays frozen: the
sentence encoder always, the value network's towers by default); ``--folds K`` trains K folds by run, writes an
out-of-fold report and one final model on every run (training/folds.py).

``--config NAME`` also finds the packaged configs (quickstart, paper, bench_train; ``benchmark`` is an alias of \
bench_train) by name.
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "lightning_argv",
        nargs="*",
        metavar="ARGS",
        help="LightningCLI arguments: --config FILE, --model.*, --data.*, --trainer.*, --out DIR",
    )

    def parse_known_args(args=None, namespace=None):
        # Everything after `train` (including --help) goes to LightningCLI untouched.
        ns = namespace if namespace is not None else argparse.Namespace()
        for key, value in parser._defaults.items():
            setattr(ns, key, value)
        ns.lightning_argv = list(args or [])
        return ns, []

    parser.parse_known_args = parse_known_args


def resolve_config_names(argv: list[str]) -> list[str]:
    """``--config quickstart`` → the packaged configs/quickstart.yaml when no such file exists."""
    packaged = Path(str(files("branchgate.configs")))
    out = []
    argv = [SPELLINGS.get(a, a) for a in argv]
    argv = [next((SPELLINGS[k] + a[len(k) :] for k in SPELLINGS if a.startswith(k + "=")), a) for a in argv]
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            out.append("--config=" + _find(arg.split("=", 1)[1], packaged))
        elif i > 0 and argv[i - 1] == "--config":
            out.append(_find(arg, packaged))
        else:
            out.append(arg)
    return out


SPELLINGS = {"--init-from": "--init_from"}  # the documented spelling → LightningCLI's option name
CONFIG_ALIASES = {"benchmark": "bench_train"}  # the bench's training config, named benchmark until 0.1.0


def _find(name: str, packaged: Path) -> str:
    if Path(name).is_file():  # a directory of the same name (e.g. the quickstart's output) is not a config
        return name
    name = CONFIG_ALIASES.get(name, name)
    for cand in (packaged / name, packaged / f"{name}.yaml"):
        if cand.is_file():
            return str(cand)
    return name


def run(args) -> int:
    from branchgate.training.fit import train

    train(resolve_config_names(args.lightning_argv))
    return 0
