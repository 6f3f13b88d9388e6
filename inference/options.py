"""The command line's names for controllers, the same in every command (core install: argparse only).

- ``--pre PATH``: a pre-retrieval controller file (``controller.onnx``, its folder, or ``pretrained:NAME``);
- ``--read PATH``: a read controller file;
- a policy string of the simulator says so in its name: ``--pre-policy SPEC``, ``--read-policy SPEC``.

``controller_options`` adds ``--pre`` and ``--read`` to a command that takes one controller of either stage
(``gate``, ``evaluate``, ``bench-gate``) and ``chosen_controller`` checks that the file given is of the stage its
option names. ``deprecated_alias`` keeps an old spelling working for one release (hidden from ``--help``; using
it prints a deprecation line on stderr): ``--model`` for either stage, simulate's ``--pre``/``--read`` for the
policy strings.
"""

from __future__ import annotations

import argparse
import sys

from branchgate.errors import InputError
from branchgate.inference.model_file import read_stage

STAGE_FLAGS = {"pre": "--pre", "read": "--read"}  # a controller's stage → the option that names its file
HELP = {
    "pre": "pre-retrieval controller: controller.onnx (or its folder, or pretrained:NAME)",
    "read": "read controller (metadata stage=read): controller.onnx (or its folder, or pretrained:NAME)",
}


class _Given(argparse.Action):
    """Stores the value and remembers which option gave it (``<dest>_flag``); a deprecated spelling also prints
    that it is deprecated."""

    def __init__(self, option_strings, dest, instead: str | None = None, **kw):
        super().__init__(option_strings, dest, **kw)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        if self.instead:
            print(
                f"branchgate: {option_string} is deprecated and goes in the next release: use {self.instead}",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def controller_options(parser: argparse.ArgumentParser, required: bool = True, group=None) -> None:
    """``--pre PATH`` | ``--read PATH`` (one of them; ``--model`` the deprecated spelling for either), all stored
    in ``args.model``; ``chosen_controller(args)`` checks the stage. ``group``: a mutually exclusive group to add
    them to (else a new one, required when ``required``)."""
    which = group if group is not None else parser.add_mutually_exclusive_group(required=required)
    for stage, flag in STAGE_FLAGS.items():
        which.add_argument(flag, dest="model", action=_Given, default=None, metavar="PATH", help=HELP[stage])
    which.add_argument("--model", dest="model", action=_Given, instead="--pre or --read", help=argparse.SUPPRESS)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, dest: str) -> None:
    """``old``: a hidden spelling of option ``new`` (stored in ``dest``), kept for one release."""
    parser.add_argument(old, dest=dest, action=_Given, instead=new, help=argparse.SUPPRESS)


def chosen_controller(args) -> str | None:
    """The controller file given (``args.model``), checked to be of the stage its option names (``--pre``: a
    pre-retrieval controller, ``--read``: a read one); ``--model`` takes either."""
    path, flag = getattr(args, "model", None), getattr(args, "model_flag", None)
    if path is None or flag not in STAGE_FLAGS.values():
        return path
    stage = read_stage(path)
    if STAGE_FLAGS.get(stage) != flag:
        raise InputError(
            f"{path} is a {stage} controller (metadata stage={stage}): give it with {STAGE_FLAGS[stage]}", flag
        )
    return path
