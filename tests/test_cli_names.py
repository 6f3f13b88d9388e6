"""One name for each thing on the command line (``inference/options.py``): ``--pre`` / ``--read`` name a
pre-retrieval / read controller file in every command, a simulator policy string is ``--pre-policy`` /
``--read-policy`` (``--post-policy``, ``--synth-policy``), and the old spellings work for one release, hidden
from ``--help``, with a deprecation line on stderr."""

from __future__ import annotations

import io
import json
import sys

import pytest

from branchgate.cli import build_parser, main

CONTROLLER_COMMANDS = ("gate", "evaluate", "bench-gate", "replay", "serve")


def subparser(name: str):
    for action in build_parser()._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict) and name in action.choices:
            return action.choices[name]
    raise KeyError(name)


@pytest.mark.parametrize("command", CONTROLLER_COMMANDS)
def test_every_command_names_the_controllers_pre_and_read(command):
    sub = subparser(command)
    if getattr(sub, "_defaults", {}).get("_missing"):
        pytest.skip(f"{command}: its extra is not installed")
    helptext = sub.format_help()
    assert "--pre PATH" in helptext and "--read PATH" in helptext
    assert "--model" not in helptext  # the old spelling is hidden
    assert sub._option_string_actions["--model"].dest == sub._option_string_actions["--pre"].dest


def test_simulate_names_its_policy_strings_as_policies(capsys):
    sub = subparser("simulate")
    helptext = sub.format_help()
    for stage in ("pre", "read", "post", "synth"):
        assert f"--{stage}-policy SPEC" in helptext
        assert f"--{stage} " not in helptext  # hidden
    args = sub.parse_args(["--env", "sample", "--out", "o", "--read", "sc:max_items=1", "--pre-policy", "mmr"])
    assert (args.read, args.pre) == ("sc:max_items=1", "mmr")
    assert "--read is deprecated" in capsys.readouterr().err and "--read-policy" not in args.__dict__


def test_old_spellings_still_work_and_say_so(monkeypatch, capsys):
    decision = {"state": {"root_query": "bees"}, "candidates": ["varroa mites", "honey prices"]}
    answers = {}
    for flag in ("--pre", "--model"):
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(decision)))
        assert main(["gate", flag, "pretrained:pre-model", "--threads", "1"]) == 0
        out = capsys.readouterr()
        answers[flag] = json.loads(out.out)
        assert ("deprecated" in out.err) == (flag == "--model")
    assert answers["--pre"] == answers["--model"]


@pytest.mark.parametrize(("flag", "model", "other"), [("--read", "pretrained:pre-model", "--pre")])
def test_a_controller_given_with_the_other_stages_option_is_refused(monkeypatch, capsys, flag, model, other):
    monkeypatch.setattr(sys, "stdin", io.StringIO("{}"))
    assert main(["gate", flag, model]) == 2
    err = capsys.readouterr().err
    assert flag in err and f"give it with {other}" in err
