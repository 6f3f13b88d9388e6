"""Issue 24: every bad input a named error, nothing lost, and the Gate never silently out of its depth.

One test (or parametrised case) per item of the issue; each failed on the code before the fix.
"""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from branchgate.cli import main
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.fileio import atomic_dir, load_json
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.traces import ReadReport

FIX = Path(__file__).parent / "fixtures"


# -- helpers ----------------------------------------------------------------------------------------------
def run_lines(run_id: str = "good", query: str = "caffeine and sleep", end: str | None = "ok") -> list[str]:
    """A small complete canonical run: one frame, two candidates, one expanded with one evidence item."""
    ev = [
        {"type": "run_start", "root_query": "How does caffeine affect sleep?"},
        {"type": "frame_open", "frame_id": "f0", "depth": 0, "frame_query": "How does caffeine affect sleep?"},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c0", "order": 0, "query": query, "goal": "g"},
        {"type": "candidate", "frame_id": "f0", "candidate_id": "c1", "order": 1, "query": "coffee history"},
        {"type": "decision", "candidate_id": "c0", "action": "expand"},
        {"type": "evidence", "evidence_id": "e0", "text": "Caffeine delays sleep onset.", "tokens": 4},
        {"type": "retrieval", "candidate_id": "c0", "query": query, "evidence_ids": ["e0"], "tokens": 4},
    ]
    if end is not None:
        ev.append({"type": "run_end", "status": end})
    return [json.dumps({"v": 1, "run_id": run_id, "seq": i, "ts": None, **e}) for i, e in enumerate(ev)]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read(paths, **kw) -> tuple[list, ReadReport]:
    report = ReadReport()
    return list(read_runs([str(p) for p in paths], report=report, **kw)), report


def gptr_doc(events=(), **content) -> dict:
    return {
        "timestamp": "2025-03-01T10:00:00",
        "events": list(events),
        "content": {"query": "q", "report": "done", **content},
    }


def logs(tag: str, output: str = "", metadata=None) -> dict:
    return {
        "timestamp": "2025-03-01T10:00:01",
        "type": "event",
        "data": {"type": "logs", "content": tag, "output": output, "metadata": metadata},
    }


# -- JSON that parses but breaks later ------------------------------------------------------------------
BAD_LINES = {
    "huge integer": '{"v":1,"run_id":"bad","seq":0,"type":"run_start","root_query":"q","n":' + "9" * 5000 + "}",
    "deep nesting": '{"v":1,"run_id":"bad","seq":0,"type":"raw","data":' + "[" * 5000 + "]" * 5000 + "}",
    "nesting json parses but dumps refuse": '{"v":1,"run_id":"bad","seq":0,"type":"zz","x":'
    + "[" * 900
    + "]" * 900
    + "}",
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))  # ids are the names
def test_json_that_parses_but_breaks_later_is_a_skipped_line_and_good_runs_stay(tmp_path, name):
    f = write(tmp_path / "t.jsonl", [*run_lines(), BAD_LINES[name]])
    runs, report = read([f])
    assert [r.run_id for r in runs] == ["good"] and len(runs[0].events) == 8
    assert [(s.line, s.file) for s in report.skipped] == [(9, str(f))]
    with pytest.raises(InputError, match=r"t.jsonl:9"):
        read([f], strict=True)


def test_load_json_names_every_failure():
    for text, what in (
        ("9" * 5000, "invalid JSON value"),
        ("[" * 100_000, "nested deeper"),
        ("[" * 101 + "]" * 101, "nested deeper"),
        ('{"a": ', "invalid JSON"),
    ):
        with pytest.raises(InputError, match=what) as info:
            load_json(text, "f.json", 3)
        assert info.value.file == "f.json" and info.value.line == 3
    assert load_json('["\\ud800x", {"\\udfff": "\\ud83d\\ude00"}]') == ["\ufffdx", {"\ufffd": "\U0001f600"}]


def test_gptr_subqueries_with_an_unhashable_key_are_a_skipped_event(tmp_path):
    doc = gptr_doc(
        [
            logs("subqueries", "I will conduct research on the following queries: [{[1]: 2}, 'a']"),
            logs("subqueries", "I will conduct research on the following queries: " + "[" * 3000 + "]" * 3000),
        ]
    )
    f = tmp_path / "task_1.json"
    f.write_text(json.dumps(doc))
    runs, report = read([f])
    assert len(runs) == 1 and [s.reason.split(":")[0] for s in report.skipped] == ["events[0]", "events[1]"]


def _searcho1(tmp_path: Path, per_doc: str) -> Path:
    traces = tmp_path / "drgym" / "Searcho1_ClueWeb22"
    traces.mkdir(parents=True)
    (traces / "7.q").write_text("what is x?")
    (traces / "7.a").write_text(
        "Think.<|begin_search_query|>x<|end_search_query|>"
        "<|begin_search_result|>Doc 1 (URL: http://a, ClueWebID: c1)\nx is y.<|end_search_result|>"
        "Answer: y."
    )
    kp = tmp_path / "drgym" / "key_point"
    kp.mkdir()
    (kp / "7.json").write_text(per_doc)
    (kp / "7_aggregated.json").write_text(
        json.dumps({"key_points": [{"point_number": 1, "point_content": "x is y", "original_point_number": [1]}]})
    )
    return traces


def test_searcho1_deeply_nested_key_point_file_is_a_counted_warning(tmp_path):
    traces = _searcho1(tmp_path, '{"key_points": ' + "[" * 50_000 + "]" * 50_000 + "}")
    runs, report = read([traces])
    assert [r.run_id for r in runs] == ["7"]
    assert any("unreadable key-point file 7.json" in w for w in report.warnings)
    with pytest.raises(InputError, match="nested deeper"):
        read([traces], strict=True)


def gate_cli(monkeypatch, capsys, stdin: str, *flags: str, model: str = "/nonexistent/controller.onnx"):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(["gate", "--pre", model, *flags])
    return rc, capsys.readouterr()


@pytest.mark.parametrize(
    "stdin",
    [
        '{"state": {"root_query": "q", "depth": ' + "9" * 5000 + '}, "candidates": []}',
        '{"state": ' + "[" * 5000 + "]" * 5000 + ', "candidates": []}',
    ],
    ids=["huge-int", "deep"],
)
def test_gate_cli_json_that_breaks_later_is_exit_2(monkeypatch, capsys, stdin, exported_model):
    rc, out = gate_cli(monkeypatch, capsys, stdin, model=exported_model["fp32"])  # --pre checks the file first
    assert rc == 2 and "<stdin>" in out.err and "Traceback" not in out.err


# -- lone surrogates ------------------------------------------------------------------------------------------
def test_lone_surrogates_in_run_id_and_query_are_replaced_and_build(tmp_path, encoder):
    from branchgate.logs_to_dataset.build import build

    lines = run_lines(run_id="r\\ud800", query="caffeine \\udc00 sleep")
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(lines).replace("\\\\u", "\\u") + "\n", encoding="utf-8")
    runs, _ = read([f])
    assert runs[0].run_id == "r\ufffd" and "caffeine \ufffd sleep" in [getattr(e, "query", "") for e in runs[0].events]
    m = build([f], tmp_path / "out", encoder_obj=encoder, cache=tmp_path / "c.sqlite", progress=False)
    assert m["n_runs"]["total"] == 1 and m["n_decisions"]["total"] == 2


# -- GPT-Researcher cost strings ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "output,costs,expected,warned",
    [
        ("Total Research Costs: $0.0123.", None, 0.0123, False),
        ("Total Research Costs: $" + "9" * 400, None, None, True),
        ("", int("9" * 400), None, True),
        ("", 0.5, 0.5, False),
    ],
    ids=["trailing-dot", "400-digit-text", "400-digit-number", "plain"],
)
def test_gptr_cost_strings(tmp_path, output, costs, expected, warned):
    extra = {} if costs is None else {"costs": costs}
    f = tmp_path / "task_2.json"
    f.write_text(json.dumps(gptr_doc([logs("research_step_finalized", output)], **extra)))
    runs, report = read([f])
    end = runs[0].events[-1]
    assert end.type == "run_end" and end.totals["cost_usd"] == (pytest.approx(expected) if expected else None)
    assert any("cost" in w for w in report.warnings) is warned


# -- unreadable files -----------------------------------------------------------------------------------------
def _deny(monkeypatch, target: Path) -> None:
    """Make ``target`` unreadable: chmod 000, or (as root, who reads anything) refuse opening it."""
    if os.geteuid() != 0:
        target.chmod(0)
        return
    real = builtins.open

    def guarded(file, *a, **kw):
        if isinstance(file, (str, os.PathLike)) and Path(file).resolve() == target.resolve():
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


def test_unreadable_file_is_a_skipped_named_file(tmp_path, monkeypatch):
    good = write(tmp_path / "a.jsonl", run_lines())
    bad = write(tmp_path / "b.jsonl", run_lines("other"))
    (tmp_path / "task_9.json").write_text(json.dumps(gptr_doc()))
    _deny(monkeypatch, bad)
    runs, report = read([tmp_path])
    assert sorted(r.run_id for r in runs) == ["good", "task_9"]
    assert [(s.file, s.reason) for s in report.skipped] == [
        (str(bad), "cannot read (permission denied or not a regular file)")
    ]
    with pytest.raises(InputError, match="b.jsonl: cannot read"):
        read([tmp_path], strict=True)
    assert good.exists()


def test_looping_symlink_is_listed(tmp_path):
    write(tmp_path / "a.jsonl", run_lines())
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing.jsonl")
    runs, report = read([tmp_path])
    assert [r.run_id for r in runs] == ["good"]
    assert sorted(Path(s.file).name for s in report.skipped) == ["gone.jsonl", "loop.jsonl"]
    assert all("symlink" in s.reason for s in report.skipped)


# -- controller metadata --------------------------------------------------------------------------------------
GOOD_META = {
    "branchgate_version": "0.1.0",
    "schema_version": "1",
    "graph_io_version": "1",
    "encoder": "e",
    "dim": "384",
    "max_length": "256",
    "tau": "0.5",
    "tokenizer_file": "t.json",
    "pad_token_id": "0",
    "feature_names": json.dumps(["depth", "order", "n_candidates", "n_retained"]),
    "tokenizer_sha256": "0" * 64,
}


@pytest.mark.parametrize(
    "key,value",
    [
        ("tau", "abc"),
        ("tau", "nan"),
        ("tau", "inf"),
        ("tau", "2"),
        ("dim", "x"),
        ("dim", "0"),
        ("max_length", "-3"),
        ("max_length", "abc"),
        ("pad_token_id", "abc"),
        ("feature_range", "[1, 2]"),
        ("feature_range", '{"depth": [3, 1]}'),
        ("feature_range", '{"depth": [0, NaN]}'),
        ("feature_range", '{"nope": [0, 1]}'),
        ("root_tau", "1.5"),
        ("root_tau", "abc"),
    ],
)
def test_bad_controller_metadata_is_a_mismatch_error_naming_the_key(key, value):
    from branchgate.inference.metadata import check_metadata, controller_numbers

    check_metadata(GOOD_META, "m.onnx")
    with pytest.raises(MismatchError, match=f"m.onnx: metadata {key}"):
        check_metadata({**GOOD_META, key: value}, "m.onnx")
    assert controller_numbers({**GOOD_META, "feature_range": '{"depth": [0, 2]}'}).feature_range == {
        "depth": (0.0, 2.0)
    }
    assert (
        controller_numbers(GOOD_META).root_tau is None
        and controller_numbers({**GOOD_META, "root_tau": "0.7"}).root_tau == 0.7
    )


def _args(shapes: dict) -> list:
    return [SimpleNamespace(name=k, shape=v) for k, v in shapes.items()]


IN = {
    "input_ids": ["N", "L"],
    "attention_mask": ["N", "L"],
    "cached_emb": ["M", 384],
    "root_idx": [1],
    "frame_idx": [1],
    "goal_idx": [1],
    "retained_idx": ["R"],
    "cand_idx": ["K"],
    "features": ["K", 4],
}
OUT = {"p_keep": ["K"], "utility": ["K"], "text_emb": ["N", 384]}


def test_graph_is_checked_against_the_metadata():
    from branchgate.inference.metadata import check_graph

    check_graph(_args(IN), _args(OUT), 384)
    with pytest.raises(MismatchError, match="metadata dim=256 but the graph's 'cached_emb' is 384 wide"):
        check_graph(_args(IN), _args(OUT), 256)
    with pytest.raises(MismatchError, match="not a branchgate controller"):
        check_graph(_args({"x": [1, 3]}), _args({"y": [1]}), 384)
    with pytest.raises(MismatchError, match="'features' has 5 columns"):
        check_graph(_args({**IN, "features": ["K", 5]}), _args(OUT), 384)


def test_foreign_graph_carrying_our_metadata_is_refused_at_load(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for k, v in GOOD_META.items():
        e = model.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(model, str(tmp_path / "controller.onnx"))
    (tmp_path / "t.json").write_text("{}")
    from branchgate.inference.gate import Gate

    with pytest.raises(MismatchError, match="graph inputs \\['x'\\] are not a branchgate controller's"):
        Gate.load(tmp_path / "controller.onnx")


def test_crafted_file_claiming_a_huge_metadata_entry_is_refused_quickly(tmp_path):
    from branchgate.inference.model_file import read_metadata

    f = tmp_path / "m.onnx"
    f.write_bytes(bytes([14 << 3 | 2]) + b"\xff\xff\xff\xff\xff\xff\xff\xff\x0f" + b"x" * 10)
    with pytest.raises(BranchgateError, match="past the end of the file"):
        read_metadata(f)


# -- the Python API and the gate CLI's flags ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra,field",
    [
        ({"tau": 2}, "tau"),
        ({"tau": True}, "tau"),
        ({"tau": float("nan")}, "tau"),
        ({"max_keep": 0}, "max_keep"),
        ({"max_keep": 1.5}, "max_keep"),
    ],
)
def test_gate_cli_decisions_refuse_bad_tau_and_max_keep_naming_line_and_field(extra, field):
    """A decision line's tau/max_keep go through the Gate's own checks (inference/inputs.py), named by line."""
    from branchgate.inference.gate_cli import parse_decision

    with pytest.raises(InputError, match=f"^in.jsonl:3: field '{field}': must be"):
        parse_decision({"state": {"root_query": "q"}, "candidates": [{"query": "a"}], **extra}, "in.jsonl:3")
    ok = parse_decision({"state": {"root_query": "q"}, "candidates": [{"query": "a"}], "tau": 1, "max_keep": 2}, "x")
    assert (ok["tau"], ok["max_keep"]) == (1.0, 2)


@pytest.mark.parametrize(
    "state,cands,kw,field",
    [
        ({"root_query": "q"}, {"query": "a"}, {}, "candidates"),
        ({"root_query": "q"}, "abc", {}, "candidates"),
        ("a state as text", ["a"], {}, "state"),
        ({"root_query": "q"}, ["a"], {"max_keep": 1.7}, "max_keep"),
        ({"root_query": "q"}, ["a"], {"max_keep": True}, "max_keep"),
        ({"root_query": "q", "depth": float("inf")}, ["a"], {}, "state.depth"),
        ({"root_query": "q", "depth": float("nan")}, ["a"], {}, "state.depth"),
        ({"root_query": "q", "depth": 10**400}, ["a"], {}, "state.depth"),
        ({"root_query": "q"}, ["a"], {"tau": "abc"}, "tau"),
        ({"root_query": "q"}, ["a"], {"tau": float("nan")}, "tau"),
        ({"root_query": "q"}, ["a"], {"tau": 2}, "tau"),
    ],
)
def test_select_refuses_bad_arguments_with_a_named_input_error(state, cands, kw, field):
    from branchgate.inference.gate import Gate

    gate = Gate.__new__(Gate)  # the checks run before any graph work
    gate.tau, gate.root_tau, gate.feature_range = 0.5, None, {}
    with pytest.raises(InputError, match=f"^{field}: "):
        gate.select(state, cands, **kw)


@pytest.mark.parametrize(
    "flags,name",
    [
        (["--tau", "nan"], "--tau"),
        (["--tau", "inf"], "--tau"),
        (["--tau", "2"], "--tau"),
        (["--tau", "-1"], "--tau"),
        (["--threads", "0"], "--threads"),
        (["--threads", "-3"], "--threads"),
        (["--max-keep", "0"], "--max-keep"),
    ],
)
def test_gate_cli_flags_are_range_checked(monkeypatch, capsys, flags, name):
    rc, out = gate_cli(monkeypatch, capsys, '{"state": {"root_query": "q"}, "candidates": ["a"]}', *flags)
    assert rc == 2 and f"{name}: must be" in out.err


# -- dataset build: partial runs, nothing parsed, key-point line ----------------------------------------------
def _partial_traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    write(d / "a.jsonl", run_lines("complete") + run_lines("crashed", end=None) + run_lines("failed", end="error"))
    return d


def test_partial_runs_are_counted_and_kept_with_a_warning_or_skipped(tmp_path, encoder):
    from branchgate.logs_to_dataset.build import build

    d = _partial_traces(tmp_path)
    kw = dict(encoder_obj=encoder, cache=tmp_path / "c.sqlite", progress=False)
    m = build([d], tmp_path / "keep", **kw)
    assert m["n_runs"]["total"] == 3
    p = m["partial_runs"]
    assert p["action"] == "keep" and p["runs"] == 2 and sorted(x["run_id"] for x in p["list"]) == ["crashed", "failed"]
    assert p["reasons"] == {"no run_end (the run crashed or is still running)": 1, "run_end status 'error'": 1}
    assert any("2 partial run(s) kept" in w for w in m["warnings"])
    m = build([d], tmp_path / "skip", partial_runs="skip", **kw)
    assert m["n_runs"]["total"] == 1 and m["partial_runs"]["runs"] == 2
    assert sum("partial run" in s["reason"] for s in m["skipped"]) == 2
    assert not any("partial" in w for w in m["warnings"])
    with pytest.raises(InputError, match="--partial-runs"):
        build([d], tmp_path / "x", partial_runs="drop", **kw)


def test_searcho1_truncated_and_gptr_incomplete_runs_are_partial(tmp_path):
    from branchgate.logs_to_dataset.decision_points import partial_reason

    f = tmp_path / "task_3.json"
    f.write_text(json.dumps({"events": [], "content": {"query": "q"}}))  # no report: "incomplete"
    (tmp_path / "1.q").write_text("q")
    (tmp_path / "1.a").write_text("<|begin_search_query|>cut off")
    runs, _ = read([tmp_path])
    assert {r.run_id: partial_reason(r.events) for r in runs} == {
        "1": "run_end status 'truncated'",
        "task_3": "run_end status 'incomplete'",
    }


def test_nothing_parsed_names_the_reasons_and_writes_a_manifest(tmp_path, encoder):
    from branchgate.logs_to_dataset.build import NothingParsed, build

    d = tmp_path / "traces"
    d.mkdir()
    (d / "bin.jsonl").write_bytes(b"\x00\x01\x02garbage")
    (d / "empty.jsonl").write_text("")
    (d / "u16.jsonl").write_bytes("\n".join(run_lines()).encode("utf-16"))
    with pytest.raises(NothingParsed) as info:
        build([d], tmp_path / "out", encoder_obj=encoder, cache=tmp_path / "c.sqlite", progress=False)
    msg = str(info.value)
    assert "bin.jsonl: binary data" in msg and "empty.jsonl: empty file" in msg and "u16.jsonl: UTF-16 text" in msg
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["error"] == "nothing parsed" and len(m["skipped"]) == 3
    assert any(s["reason"].startswith("UTF-16 text, not UTF-8") for s in m["skipped"])


def test_keypoint_line_without_a_key_point_count_has_no_slash_zero():
    from branchgate.logs_to_dataset.build_report import _keypoint_line

    line = _keypoint_line(
        {"runs_with_ground_truth": 2, "evidence_labelled": 3, "evidence": 4, "key_points_reachable": 5, "key_points": 0}
    )
    assert "/0" not in line and "5 key points reachable" in line
    assert "5/9 key points" in _keypoint_line(
        {"runs_with_ground_truth": 2, "evidence_labelled": 3, "evidence": 4, "key_points_reachable": 5, "key_points": 9}
    )


# -- atomic_dir between its two renames -------------------------------------------------------------------------
def test_atomic_dir_keeps_the_old_output_when_the_second_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "v").write_text("1")
    real, calls = os.replace, []

    def dying(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process is stopped between the two renames
        return real(src, dst)

    monkeypatch.setattr(os, "replace", dying)
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(out) as tmp:
            (tmp / "v").write_text("2")
    monkeypatch.setattr(os, "replace", real)
    assert (out / "v").read_text() == "1"


def test_atomic_dir_never_touches_a_folder_named_like_its_own_old_one(tmp_path):
    """A ``.out.old`` folder (the user's, or what a kill -9 between the renames once left) is never renamed or
    deleted: the previous output goes to a new folder of its own (issue 62 item 3)."""
    out = tmp_path / "out"
    old = tmp_path / ".out.old"
    old.mkdir()
    (old / "v").write_text("1")
    for v in "23":
        with atomic_dir(out, "dataset build") as tmp:
            (tmp / "v").write_text(v)
        assert (out / "v").read_text() == v and (old / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.old", "out"]


# -- training: zero epochs ----------------------------------------------------------------------------------
def test_train_with_zero_epochs_is_an_error_not_an_untrained_controller(tmp_path, capsys):
    from branchgate.data.synthetic import write_synthetic_dataset

    ds = write_synthetic_dataset(tmp_path / "ds", n_runs=12, seed=1)
    rc = main(
        [
            "train",
            "--config",
            "quickstart",
            "--data.dataset",
            str(ds),
            "--out",
            str(tmp_path / "run"),
            "--wandb.mode",
            "disabled",
            "--trainer.max_epochs=0",
        ]
    )
    assert rc == 2 and "--trainer.max_epochs: must be ≥ 1" in capsys.readouterr().err
    assert not (tmp_path / "run" / "controller.safetensors").exists()


# -- out of its depth: feature ranges ------------------------------------------------------------------------
def test_value_net_clamps_structured_features_to_the_train_range():
    torch = pytest.importorskip("torch")
    from branchgate.features import structured_features
    from branchgate.models.value_model import ValueNet

    torch.manual_seed(0)
    net = ValueNet(8, hidden=8).eval()
    assert net.feature_range() is None  # no range: no clamping (older controllers)
    net.set_feature_range([0, 0, 3, 0], [2, 5, 6, 3])
    assert net.feature_range()["n_candidates"] == [3.0, 6.0]
    x = {k: torch.randn(*s) for k, s in (("root", (8,)), ("frame", (8,)), ("goal", (8,)), ("ret", (2, 8)))}
    cand = torch.randn(6, 8)

    def p(depth):
        feats = torch.from_numpy(structured_features(depth, 6, 2))
        return net(x["root"], x["frame"], x["goal"], x["ret"], cand, feats)[0]

    assert torch.allclose(p(1e30), p(2)) and not torch.allclose(p(0), p(2))


def test_checkpoint_stores_the_range_and_old_files_still_load(tmp_path):
    pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from branchgate.models.value_model import ValueNet
    from branchgate.training.checkpoint import load_controller, make_meta, save_controller, train_feature_range

    rng = train_feature_range(np.array([[0, 0, 3, 0], [2, 5, 6, 1]], np.float32))
    assert rng == {"depth": [0.0, 2.0], "order": [0.0, 5.0], "n_candidates": [3.0, 6.0], "n_retained": [0.0, 1.0]}
    net = ValueNet(8, hidden=8)
    net.set_feature_range([v[0] for v in rng.values()], [v[1] for v in rng.values()])
    spec = SimpleNamespace(id="enc", path=None)
    meta = make_meta(SimpleNamespace(spec=spec, dim=8, max_length=16), tau=0.5, feature_range=rng)
    save_controller(tmp_path / "c.safetensors", net, meta)
    _, back = load_controller(tmp_path / "c.safetensors")
    assert back["feature_range"] == rng
    # an older file: no range buffers, no feature_range in its metadata
    from safetensors import safe_open

    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        header = json.loads(f.metadata()["branchgate"])
    header["meta"].pop("feature_range")
    state = {k: v for k, v in load_file(str(tmp_path / "c.safetensors")).items() if not k.startswith("feature_")}
    save_file(state, str(tmp_path / "old.safetensors"), metadata={"branchgate": json.dumps(header)})
    old_net, old_meta = load_controller(tmp_path / "old.safetensors")
    assert old_meta["feature_range"] is None and old_net.feature_range() is None


@pytest.fixture(scope="module")
def exported_model(encoder):
    from export_support import exported

    return exported(encoder)["files"]


def test_exported_gate_reports_and_clamps_decisions_outside_the_training_range(exported_model, recwarn):
    from branchgate.inference.gate import Gate
    from branchgate.inference.model_file import read_metadata

    rng = json.loads(read_metadata(exported_model["fp32"])["feature_range"])
    assert set(rng) == {"depth", "order", "n_candidates", "n_retained"}
    gate = Gate.load(exported_model["fp32"], threads=1)
    state = {"root_query": "caffeine and sleep", "frame_query": "caffeine and sleep", "depth": 0}
    k, r = int(rng["n_candidates"][1]), int(rng["n_retained"][0])
    inside = gate.select(
        {**state, "depth": rng["depth"][0], "retained": [f"branch {i}" for i in range(r)]},
        [f"candidate {i}" for i in range(k)],
    )
    assert inside.out_of_range == [] and "out_of_range" not in inside.to_json() and not recwarn.list
    deep = int(rng["depth"][1])
    far = gate.select({**state, "depth": 1e9}, ["caffeine half-life", "coffee history"])
    edge = gate.select({**state, "depth": deep}, ["caffeine half-life", "coffee history"])
    assert "depth" in far.out_of_range and far.to_json()["out_of_range"] == far.out_of_range
    np.testing.assert_allclose(far.p_keep, edge.p_keep, atol=1e-6)  # clamped to the edge of the training range
    many = gate.select(state, [f"subquery number {i}" for i in range(100)])
    assert "n_candidates" in many.out_of_range and many.kept
    assert (
        sum(issubclass(w.category, RuntimeWarning) and "outside the training range" in str(w.message) for w in recwarn)
        == 1
    )  # one warning per Gate


def test_old_controller_without_ranges_loads_without_out_of_range(exported_model, tmp_path):
    from export_support import relabelled

    from branchgate.inference.gate import Gate
    from branchgate.inference.model_file import read_metadata

    props = {k: v for k, v in read_metadata(exported_model["fp32"]).items() if k != "feature_range"}
    gate = Gate.load(relabelled(exported_model["fp32"], tmp_path, props), threads=1)
    sel = gate.select({"root_query": "q", "depth": 1e9}, [f"s{i}" for i in range(100)])
    assert gate.feature_range == {} and sel.out_of_range == [] and "out_of_range" not in sel.to_json()


def test_gate_cli_json_carries_out_of_range(exported_model, monkeypatch, capsys):
    cands = [f"subquery {i}" for i in range(60)]
    rc, out = gate_cli(
        monkeypatch,
        capsys,
        json.dumps({"state": {"root_query": "q", "depth": 40}, "candidates": cands}),
        "--threads",
        "1",
        model=exported_model["fp32"],
    )
    assert rc == 0
    ans = json.loads(out.out)
    assert {"depth", "n_candidates"} <= set(ans["out_of_range"]) and len(ans["kept"]) >= 1


def test_gate_cli_root_tau_field_and_flag(exported_model, monkeypatch, capsys):
    decision = {"state": {"root_query": "q", "depth": 0}, "candidates": ["a", "b", "c"]}
    rc, out = gate_cli(
        monkeypatch, capsys, json.dumps(dict(decision, root_tau=0.0)), "--threads", "1", model=exported_model["fp32"]
    )
    assert rc == 0 and json.loads(out.out)["kept"] == [0, 1, 2]
    rc, out = gate_cli(
        monkeypatch,
        capsys,
        json.dumps(dict(decision, state={"root_query": "q", "depth": 1})),
        "--threads",
        "1",
        "--root-tau",
        "0.0",
        "--tau",
        "1.0",
        model=exported_model["fp32"],
    )
    assert rc == 0 and len(json.loads(out.out)["kept"]) == 1  # below the root: --tau 1.0, the top-1 fallback
    rc, out = gate_cli(
        monkeypatch,
        capsys,
        json.dumps(dict(decision, root_tau=0.5, run_id="r1", budget_nodes=3)),
        model=exported_model["fp32"],
    )
    assert rc == 2 and "root_tau" in out.err and "budgeted run" in out.err
    rc, out = gate_cli(monkeypatch, capsys, json.dumps(decision), "--root-tau", "2", model=exported_model["fp32"])
    assert rc == 2 and "--root-tau" in out.err


@pytest.mark.parametrize("body", ["[" * 5000 + "]" * 5000, "9" * 5000], ids=["deep", "huge-int"])
def test_openinference_span_export_that_breaks_later_is_a_skipped_file(tmp_path, body):
    write(tmp_path / "good.jsonl", run_lines())
    (tmp_path / "spans.json").write_text('[{"span_kind": "LLM", "context": {}, "a": ' + body + "}]")
    runs, report = read([tmp_path])
    assert [r.run_id for r in runs] == ["good"] and [Path(s.file).name for s in report.skipped] == ["spans.json"]


def test_a_reader_peek_that_cannot_decode_does_not_claim_the_file(tmp_path):
    """openinference's detect peeks at a .jsonl's first line with json.loads: too deep a line is not its claim."""
    f = write(
        tmp_path / "x.jsonl",
        ['{"span_kind": "LLM", "context": {}, "a": ' + "[" * 5000 + "]" * 5000 + "}", *run_lines()],
    )
    runs, report = read([f])
    assert [r.run_id for r in runs] == ["good"] and [(s.line, s.reason) for s in report.skipped] == [
        (1, "JSON nested deeper than 100 levels")
    ]
