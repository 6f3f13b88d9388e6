"""branchgate never deletes or replaces a file it did not write, at any path (issue 62: items 1-4, export and
evaluate in items 8 and 10, ``--state`` lock files).

The rule lives in ``fileio`` (``check_output_dir``, ``claim_output_dir``/``mark_output_dir``, ``atomic_dir``,
``check_file_set``/``write_file_set``); the property tests drive it with user files placed in, beside and above
output folders, for both ways a command writes (a folder replaced whole, a folder written in place), and the
CLI tests repeat the issue's probes.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from export_support import untrained_controller
from folder_support import build_argv, refused, snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import branchgate
from branchgate.cli import main
from branchgate.errors import InputError
from branchgate.fileio import (
    OUTPUT_MARK,
    atomic_dir,
    atomic_path,
    atomic_write_text,
    check_file_set,
    check_output_dir,
    claim_output_dir,
    mark_output_dir,
    write_file_set,
)

FIX = Path(branchgate.__file__).parent / "tests" / "fixtures"
TRACES = FIX / "canonical" / "two_runs.jsonl"
KIND = "dataset build"


# -- the rule itself, as a property over layouts -------------------------------------------------------------
NAMES = ("a", "b")
USER_NAMES = (
    "notes.txt",
    "dataset_dict.json",  # the old "legacy mark"
    "manifest.json",
    "report.json",
    OUTPUT_MARK,  # a file of the user's that happens to have the manifest's name (not a manifest)
    ".branchgate.journal",
    "sub/keep.txt",
    "train/data-00000.arrow",
)
WHERE = ("in", "beside", "above")


def _user_path(root: Path, out: Path, where: str, name: str, depth: int) -> Path:
    if where == "in":
        return out / name
    if where == "beside":  # next to the output, named like what a command might stage or set aside there
        return out.parent / name.replace("notes.txt", f".{out.name}.old/notes.txt").replace(
            "manifest.json", f"{out.name}.old"
        )
    return [root, *out.parents][min(depth, len(out.parents))] / f"above-{name.replace('/', '-')}"


def _first_output(out: Path, mode: str, files: dict[str, str]) -> None:
    """What an earlier run of the command left: ``files`` written into ``out`` (replaced whole, or in place)."""
    if mode == "replace":
        with atomic_dir(out, KIND) as tmp:
            for rel, text in files.items():
                atomic_write_text(tmp / rel, text)
    else:
        check_output_dir(out, (), KIND, in_place=True)
        claim_output_dir(out, KIND)
        for rel, text in files.items():
            atomic_write_text(out / rel, text)
        mark_output_dir(out, KIND)


def _second_run(out: Path, mode: str) -> None:
    """The command run again: replace the folder whole, or write in place (one file atomically, one plainly)."""
    if mode == "replace":
        with atomic_dir(out, KIND) as tmp:
            (tmp / "manifest.json").write_text("{}")
            (tmp / "train").mkdir()
            (tmp / "train" / "rows.arrow").write_text("new rows")
        return
    check_output_dir(out, (), KIND, in_place=True)
    claim_output_dir(out, KIND)
    atomic_write_text(out / "manifest.json", "{}")
    (out / "train").mkdir(exist_ok=True)
    (out / "train" / "rows.arrow").write_text("new rows")  # a writer that is not atomic (as Lightning's)
    mark_output_dir(out, KIND)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    out_parts=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
    mode=st.sampled_from(["replace", "in_place"]),
    earlier=st.booleans(),
    user=st.lists(
        st.tuples(st.sampled_from(WHERE), st.sampled_from(USER_NAMES), st.integers(0, 3)), min_size=0, max_size=4
    ),
)
def test_no_user_file_is_ever_deleted_or_replaced(out_parts, mode, earlier, user):
    """Whatever the user put in, beside or above an output folder (after an earlier run, or before the first):
    the run either succeeds, leaving every user file as it was, or is refused naming the folder and changing
    nothing; it is refused exactly when something of the user's is inside the folder."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root.joinpath(*out_parts)
        if earlier:
            _first_output(out, mode, {"manifest.json": "{}", "train/rows.arrow": "old rows", "old.txt": "old"})
        placed = {}
        for where, name, depth in user:
            p = _user_path(root, out, where, name, depth)
            if any(q.is_file() for q in p.parents) or p.exists() or (out == p or p in out.parents):
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"the user's {name}\n")
            placed[p] = p.read_bytes()
        inside = any(out in p.parents for p in placed)
        event(f"{mode}, user files inside: {inside}")
        before = snapshot(root)
        try:
            _second_run(out, mode)
        except InputError as exc:
            assert inside, f"refused with nothing of the user's inside: {exc}"
            assert str(out) in str(exc) and "did not write" in str(exc)
            assert snapshot(root) == before  # a refusal changes nothing
            return
        assert not inside, f"wrote into {out} over the user's {[str(p) for p in placed if out in p.parents]}"
        for p, data in placed.items():
            assert p.read_bytes() == data, p
        assert (out / "train" / "rows.arrow").read_text() == "new rows"
        users = {p.relative_to(out.parent).parts[0] for p in placed if out.parent in p.parents}
        left = {p.name for p in out.parent.iterdir()} - users - {out.name}
        assert not [n for n in left if n.startswith(f".{out.name}.")], left  # no staging or old folder left


@settings(deadline=None)
@given(change=st.sampled_from(["edit", "remove_mark", "add_folder", "add_link", "other_kind", "add_empty_folder"]))
def test_an_earlier_output_changed_by_the_user_is_refused_and_kept(change):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        _first_output(out, "replace", {"manifest.json": "{}", "old.txt": "old"})
        if change == "edit":
            (out / "old.txt").write_text("the user's edit")
        elif change == "remove_mark":
            (out / OUTPUT_MARK).unlink()
        elif change == "add_folder":
            (out / "myfolder").mkdir()
            (out / "myfolder" / "keep.txt").write_text("mine")
        elif change == "add_link":
            (out / "link").symlink_to(Path(tmp))
        elif change == "other_kind":
            shutil.rmtree(out)
            out.mkdir()
            (out / "old.txt").write_text("old")
            mark_output_dir(out, "simulate")
        else:
            (out / "empty").mkdir()
        before = snapshot(Path(tmp))
        for mode in ("replace", "in_place"):
            with pytest.raises(InputError, match="did not write"):
                _second_run(out, mode)
            assert snapshot(Path(tmp)) == before


def test_an_interrupted_run_resumes_and_refuses_a_file_added_since(tmp_path):
    """Files written (atomically, from any process) before a run was interrupted are in its journal: a rerun
    may continue over them; a file the user added since is refused."""
    out = tmp_path / "sim"
    claim_output_dir(out, "simulate")
    with atomic_path(out / "traces" / "r1.jsonl") as t:
        t.write_text("{}\n")  # the run is then killed: no mark_output_dir
    check_output_dir(out, (), "simulate", in_place=True)
    (out / "traces" / "mine.jsonl").write_text("the user's\n")
    with pytest.raises(InputError, match=r"traces/mine.jsonl \(not written by branchgate\)"):
        check_output_dir(out, (), "simulate", in_place=True)


def test_nested_outputs_are_recorded_in_the_folder_they_lie_in(tmp_path):
    """``evaluate``'s default folder lies in the training run's: the run's manifest records it, so the run can
    be written again; an unrecorded copy of an output is refused like any other folder."""
    run = tmp_path / "run"
    _first_output(run, "in_place", {"controller.safetensors": "w"})
    mark_output_dir(run, "train")
    with atomic_dir(run / "eval", "evaluate") as tmp:
        (tmp / "metrics.json").write_text("{}")
    check_output_dir(run, (), "train", in_place=True)
    shutil.copytree(run / "eval", run / "eval-copy")
    with pytest.raises(InputError, match="eval-copy/ .an output folder not recorded here"):
        check_output_dir(run, (), "train", in_place=True)


# -- item 1: a user folder that looks like an output ---------------------------------------------------------
def test_item1_a_folder_with_dataset_dict_json_is_not_an_output(tmp_path, capsys):
    myhf = tmp_path / "myhf"
    (myhf / "train").mkdir(parents=True)
    (myhf / "dataset_dict.json").write_text('{"splits":["train"]}')
    (myhf / "train" / "data-00000.arrow").write_text("d\n")
    (myhf / "annotations.csv").write_text("notes\n")
    before = snapshot(tmp_path)
    err = refused(build_argv(TRACES, myhf), capsys, myhf)
    assert "no .branchgate.json" in err and "annotations.csv" in err
    assert snapshot(tmp_path) == before


def test_item1_bench_refuses_a_folder_with_a_users_report(tmp_path, capsys):
    from branchgate.pipeline import env as envmod

    ids = list(envmod.load("sample").query_by_id)
    (tmp_path / "a.txt").write_text("\n".join(ids[:3]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(ids[3:6]) + "\n")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.json").write_text('{"mine": true}\n')
    (out / "data.csv").write_text("a,b\n1,2\n")
    before = snapshot(tmp_path)
    argv = ["bench", "--env", "sample", "--out", str(out), "--train-queries", str(tmp_path / "a.txt")]
    refused([*argv, "--eval-queries", str(tmp_path / "b.txt")], capsys, out)
    assert snapshot(tmp_path) == before  # nothing started in it


# -- items 2 and 3: files added to an output; a user's .NAME.old ---------------------------------------------
def test_items_2_and_3_dataset_build_keeps_added_files_and_a_users_old_folder(tmp_path, capsys):
    ds = tmp_path / "ds1"
    (tmp_path / ".ds1.old").mkdir()
    (tmp_path / ".ds1.old" / "mine.txt").write_text("the user's\n")
    assert main(build_argv(TRACES, ds)) == 0
    capsys.readouterr()
    (ds / "MY_NOTES.txt").write_text("notes\n")
    (ds / "myfolder").mkdir()
    (ds / "myfolder" / "keep.txt").write_text("keep\n")
    before = snapshot(tmp_path)
    err = refused(build_argv(TRACES, ds), capsys, ds)
    assert "MY_NOTES.txt" in err and "myfolder/keep.txt" in err
    assert snapshot(tmp_path) == before
    (ds / "MY_NOTES.txt").unlink()
    shutil.rmtree(ds / "myfolder")
    assert main(build_argv(TRACES, ds)) == 0  # its own output alone is replaced; the user's .ds1.old is not
    assert (tmp_path / ".ds1.old" / "mine.txt").read_text() == "the user's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ds1.old", "ds1"]


def test_item3_a_refused_build_leaves_a_users_old_folder_where_it_is(tmp_path, capsys):
    new = tmp_path / "newout"
    new.mkdir()
    (new / "theirs.txt").write_text("x\n")
    old = tmp_path / ".newout.old"
    old.mkdir()
    (old / "v").write_text("1\n")
    before = snapshot(tmp_path)
    refused(build_argv(TRACES, new), capsys, new)
    shutil.rmtree(new)  # even with newout gone, .newout.old is never taken for an output to put back
    before.pop("newout"), before.pop("newout/theirs.txt")
    assert main(build_argv(TRACES, new)) == 0
    assert {k: v for k, v in snapshot(tmp_path).items() if k.startswith(".newout.old")} == before


def test_item2_evaluate_keeps_files_added_to_its_output(tmp_path, capsys):
    from branchgate.data.synthetic import write_synthetic_dataset

    ds = write_synthetic_dataset(tmp_path / "ds", n_runs=16, seed=3)
    ckpt = untrained_controller(tmp_path / "run" / "controller.safetensors")
    out = tmp_path / "eval"
    argv = ["evaluate", "--checkpoint", str(ckpt), "--dataset", str(ds), "--cache", str(tmp_path / "e.sqlite")]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    (out / "MY_NOTES.txt").write_text("notes\n")
    before = snapshot(tmp_path)
    refused([*argv, "--out", str(out)], capsys, out)
    assert snapshot(tmp_path) == before


# -- evaluate --threads (item 8) -------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", ["-5", "2000"])
def test_evaluate_threads_out_of_range_is_refused_before_work(tmp_path, capsys, threads):
    ckpt = untrained_controller(tmp_path / "run" / "controller.safetensors")
    argv = ["evaluate", "--checkpoint", str(ckpt), "--dataset", str(tmp_path / "none"), "--threads", threads]
    err = refused([*argv, "--out", str(tmp_path / "eval")], capsys, "--threads")
    assert "must be an integer from 1 to" in err and not (tmp_path / "eval").exists()


# -- item 4 and the export parts of items 8 and 10 -----------------------------------------------------------
@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the export starts its work (reads the checkpoint)."""
    import branchgate.training.checkpoint as ckpt

    def load_controller(*a, **kw):
        raise AssertionError("the export started its work before refusing")

    monkeypatch.setattr(ckpt, "load_controller", load_controller)


def export_argv(ckpt, out) -> list[str]:
    return ["export", "--checkpoint", str(ckpt), "--out", str(out), "--int8"]


def test_item4_export_refuses_a_card_or_tokenizer_it_did_not_write(tmp_path, capsys, no_work):
    ckpt = tmp_path / "controller.safetensors"
    ckpt.write_bytes(b"x")
    ex2 = tmp_path / "ex2"
    ex2.mkdir()
    for name in ("mymodel.md", "mymodel.tokenizer.json"):
        (ex2 / name).write_text(f"the user's {name}\n")
        before = snapshot(tmp_path)
        err = refused(export_argv(ckpt, ex2 / "mymodel.onnx"), capsys, ex2 / name)
        assert "did not write" in err
        assert snapshot(tmp_path) == before
        (ex2 / name).unlink()


def test_export_onto_a_folder_or_an_unwritable_place_is_refused_before_work(tmp_path, capsys, no_work, monkeypatch):
    import os

    ckpt = tmp_path / "controller.safetensors"
    ckpt.write_bytes(b"x")
    (tmp_path / "dir.onnx").mkdir()
    refused(export_argv(ckpt, tmp_path / "dir.onnx"), capsys, tmp_path / "dir.onnx")
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if Path(p) == ro else real_access(p, m, *a, **k))
    err = refused(export_argv(ckpt, ro / "m.onnx"), capsys, ro)
    assert "read-only" in err and list(ro.iterdir()) == []


def test_export_options_are_checked_before_work(tmp_path, capsys, no_work):
    ckpt = tmp_path / "controller.safetensors"
    ckpt.write_bytes(b"x")
    out = tmp_path / "m.onnx"
    for extra, name in (
        (["--max-decisions", "0"], "--max-decisions"),
        (["--tol", "nan"], "--tol"),
        (["--auroc-tol", "inf"], "--auroc-tol"),
        (["--dataset", str(tmp_path / "none")], str(tmp_path / "none")),
    ):
        refused([*export_argv(ckpt, out), *extra], capsys, name)
    refused(export_argv(tmp_path / "none.safetensors", out), capsys, tmp_path / "none.safetensors")


def test_a_file_set_replaces_only_what_its_record_lists_unchanged(tmp_path):
    """The export's file rule (``check_file_set``/``write_file_set``): a rerun replaces its own files; a file it
    did not write, or one changed since, stops it; a stale twin is removed only when it is the export's."""
    record = tmp_path / ".m.onnx.branchgate.json"
    targets = [tmp_path / n for n in ("m.onnx", "m.int8.onnx", "m.md")]

    def staged(text):
        new = {}
        for t in targets:
            s = tmp_path / f".stage.{t.name}"
            s.write_text(f"{text} {t.name}")
            new[t] = s
        return new

    write_file_set(staged("one"), record, "export")
    write_file_set(staged("two"), record, "export")
    assert (tmp_path / "m.md").read_text() == "two m.md"
    (tmp_path / "m.md").write_text("the user's edit")
    with pytest.raises(InputError, match="m.md"):
        check_file_set(targets, record, "export")
    (tmp_path / "m.md").unlink()
    write_file_set({targets[0]: staged("three")[targets[0]], targets[1]: None}, record, "export")
    assert not targets[1].exists() and json.loads(record.read_text())["files"].keys() == {"m.onnx"}
    targets[1].write_text("the user's twin")
    with pytest.raises(InputError, match="m.int8.onnx"):
        write_file_set({targets[1]: None}, record, "export")
    assert targets[1].read_text() == "the user's twin"
    record.write_text("the user's notes")
    with pytest.raises(InputError, match="branchgate.json"):
        check_file_set(targets[:1], record, "export")


# -- --state leaves no lock file beside the file it is pointed at ----------------------------------------------
def test_gate_state_leaves_no_lock_file_beside_it(tmp_path, monkeypatch, capsys):
    import io

    from branchgate.export.samples import sample_decisions

    monkeypatch.setenv("BRANCHGATE_CACHE", str(tmp_path / "cache"))
    state, cands = sample_decisions()[0]
    folder = tmp_path / "mine"
    folder.mkdir()
    request = {"run_id": "r1", "budget_nodes": 4, "state": state, "candidates": cands}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request)))
    rc = main(["gate", "--pre", "pretrained:pre-model", "--state", str(folder / "runs.json")])
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["runs.json"]
    assert list((tmp_path / "cache" / "locks").glob("*.lock"))  # the lock lives in the cache folder
