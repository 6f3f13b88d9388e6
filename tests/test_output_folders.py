"""Output folders: no command deletes or replaces anything it did not create (issue 48 items 1 and 13; item 14,
the small bench, is in test_bench.py).

Every folder-writing command refuses, with exit 2 and the path named, an ``--out`` that is equal to, inside or
a parent of an input, an existing file, a non-empty folder another command (or the user) wrote, or a folder it
cannot write; a previous output of the same command is still replaced (atomically) or resumed, unless it holds
anything its manifest does not list unchanged (issue 62; more in test_never_delete.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from export_support import untrained_controller
from folder_support import build_argv, refused, snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import branchgate
from branchgate.cli import main
from branchgate.pipeline.sample import SAMPLE_DIR

FIX = Path(branchgate.__file__).parent / "tests" / "fixtures"  # also right for a copy of this file elsewhere
TRACES = FIX / "canonical" / "two_runs.jsonl"
MUSIQUE = json.loads((FIX / "musique" / "one_question.json").read_text())  # one two-hop question


@pytest.fixture
def traces(tmp_path) -> Path:
    """A folder holding one canonical trace file (two runs) and a note of the user's."""
    t = tmp_path / "t"
    t.mkdir()
    shutil.copy(TRACES, t / "runs.jsonl")
    (t / "notes.txt").write_text("the user's own file\n")
    return t


# -- item 1: dataset build / env build over their inputs --------------------------------------------------------
def test_dataset_build_out_equal_to_traces_is_refused(traces, capsys):
    before = snapshot(traces)
    refused(build_argv(traces, traces), capsys, traces)
    assert snapshot(traces) == before


def test_dataset_build_out_parent_of_traces_is_refused(tmp_path, capsys):
    p = tmp_path / "p"
    (p / "traces").mkdir(parents=True)
    shutil.copy(TRACES, p / "traces" / "runs.jsonl")
    (p / "other.txt").write_text("unrelated\n")
    before = snapshot(p)
    err = refused(build_argv(p / "traces", p), capsys, p)
    assert "contains the input" in err
    assert snapshot(p) == before


def test_dataset_build_out_inside_traces_is_refused(traces, capsys):
    before = snapshot(traces)
    refused(build_argv(traces, traces / "ds"), capsys, traces / "ds")
    assert snapshot(traces) == before


def test_env_build_out_equal_to_src_is_refused(tmp_path, capsys):
    src = tmp_path / "m"
    src.mkdir()
    (src / "musique_x.json").write_text(json.dumps([MUSIQUE]))
    before = snapshot(src)
    refused(["env", "build", "--format", "musique", "--src", str(src), "--out", str(src)], capsys, src)
    assert snapshot(src) == before


def test_existing_file_as_out_is_refused_and_kept(tmp_path, traces, capsys):
    f = tmp_path / "report.txt"
    f.write_text("precious\n")
    err = refused(build_argv(traces, f), capsys, f)
    assert "existing file" in err
    assert f.read_text() == "precious\n" and not (tmp_path / ".report.txt.old").exists()


def test_atomic_dir_never_hides_a_file(tmp_path):
    """The ``.NAME.old`` rename never turns a user's regular file into a hidden file."""
    from branchgate.fileio import atomic_dir

    f = tmp_path / "data"
    f.write_text("precious\n")
    with pytest.raises(Exception, match="data"):
        with atomic_dir(f) as tmp:
            (tmp / "x").write_text("new\n")
    assert f.read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_foreign_folder_is_refused_previous_output_is_replaced(tmp_path, traces, capsys):
    inputs = snapshot(traces)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine\n")
    before = snapshot(foreign)
    err = refused(build_argv(traces, foreign), capsys, foreign)
    assert "did not write" in err and snapshot(foreign) == before

    ds = tmp_path / "ds"
    assert main(build_argv(traces, ds)) == 0
    first = json.loads((ds / "manifest.json").read_text())
    (ds / "notes.txt").write_text("the user's, added to the output\n")  # not the build's: the rebuild is refused
    err = refused(build_argv(traces, ds), capsys, ds)
    assert "notes.txt (not written by branchgate)" in err and (ds / "notes.txt").is_file()
    (ds / "notes.txt").unlink()
    assert main(build_argv(traces, ds)) == 0  # its own output alone: replaced whole
    assert json.loads((ds / "manifest.json").read_text())["n_decisions"] == first["n_decisions"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "foreign", "t"]  # nothing left aside
    assert snapshot(traces) == inputs  # untouched throughout
    # another command's output is not a dataset build's to replace
    refused(["simulate", "--env", "sample", "--runs", "1", "--out", str(ds), "--no-progress"], capsys, ds)
    assert (ds / "dataset_dict.json").is_file()


def test_dataset_folder_without_its_manifest_is_refused(tmp_path, traces, capsys):
    """No "legacy mark": a ``dataset_dict.json`` does not make a folder the build's to replace (issue 62 item 1)."""
    from branchgate.fileio import OUTPUT_MARK

    ds = tmp_path / "ds"
    assert main(build_argv(traces, ds)) == 0
    (ds / OUTPUT_MARK).unlink()
    before = snapshot(ds)
    refused(build_argv(traces, ds), capsys, ds)
    assert snapshot(ds) == before


# -- item 13: the output folders' errors are named, not tracebacks ---------------------------------------------
def _read_only(monkeypatch, folder: Path) -> None:
    """Make ``folder`` read-only: chmod 555, or (as root, who writes anyway) refuse creating anything in it."""
    if os.geteuid() != 0:
        folder.chmod(0o555)  # the test restores it
        return
    real_access, real_mkdir = os.access, os.mkdir
    ro = folder.resolve()

    def inside(path) -> bool:
        p = Path(os.path.abspath(path))
        return p == ro or ro in p.parents

    def access(path, mode, *a, **kw):
        if mode & os.W_OK and inside(path):
            return False
        return real_access(path, mode, *a, **kw)

    def mkdir(path, *a, **kw):
        if inside(Path(os.path.abspath(path)).parent):
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "mkdir", mkdir)


def test_dataset_build_in_a_read_only_folder(tmp_path, traces, monkeypatch, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    try:
        _read_only(monkeypatch, ro)
        err = refused(build_argv(traces, ro / "ds"), capsys, ro / "ds")
        assert "read-only" in err
    finally:
        ro.chmod(0o755)
    assert list(ro.iterdir()) == []


def test_simulate_out_file_is_refused(tmp_path, capsys):
    f = tmp_path / "runs.txt"
    f.write_text("precious\n")
    refused(["simulate", "--env", "sample", "--runs", "1", "--out", str(f), "--no-progress"], capsys, f)
    assert f.read_text() == "precious\n"


def test_simulate_out_equal_to_env_is_refused(tmp_path, capsys):
    env = tmp_path / "env"
    shutil.copytree(SAMPLE_DIR, env)
    before = snapshot(env)
    refused(["simulate", "--env", str(env), "--runs", "1", "--out", str(env), "--no-progress"], capsys, env)
    assert snapshot(env) == before


def test_simulate_previous_output_resumes(tmp_path):
    out = tmp_path / "sim"
    argv = ["simulate", "--env", "sample", "--runs", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    runs = snapshot(out / "traces")
    assert main(argv) == 0 and snapshot(out / "traces") == runs


def test_evaluate_out_file_and_overlap_are_refused(tmp_path, capsys):
    from branchgate.data.synthetic import write_synthetic_dataset

    ds = write_synthetic_dataset(tmp_path / "ds", n_runs=16, seed=3)
    ckpt = untrained_controller(tmp_path / "run" / "controller.safetensors", max_length=128)
    f = tmp_path / "metrics.txt"
    f.write_text("precious\n")
    before = snapshot(tmp_path)
    base = ["evaluate", "--checkpoint", str(ckpt), "--dataset", str(ds), "--cache", str(tmp_path / "emb.sqlite")]
    refused([*base, "--out", str(f)], capsys, f)
    refused([*base, "--out", str(ckpt.parent)], capsys, ckpt.parent)  # the run folder holds the checkpoint
    refused([*base, "--out", str(ds)], capsys, ds)
    assert snapshot(tmp_path) == before


def test_train_out_file_foreign_folder_and_overlap_are_refused(tmp_path, capsys):
    """``train --out`` gets the same guard, before Lightning creates anything in it."""
    from branchgate.data.synthetic import write_synthetic_dataset

    ds = write_synthetic_dataset(tmp_path / "ds", n_runs=16, seed=3)
    f = tmp_path / "run.txt"
    f.write_text("precious\n")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.md").write_text("the user's\n")
    before = snapshot(tmp_path)
    base = [
        "train",
        "--config",
        "quickstart",
        "--data.dataset",
        str(ds),
        "--data.encoder",
        "packaged",
        "--data.cache",
        str(tmp_path / "emb.sqlite"),
        "--wandb.mode",
        "disabled",
    ]
    for out in (f, ds, foreign, ds / "train"):
        refused([*base, "--out", str(out)], capsys, out)
    assert snapshot(tmp_path) == before


# -- the guard itself: a property over layouts of inputs and output ---------------------------------------------
NAMES = ("a", "b", "c")
path_parts = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)
STATES = ("absent", "empty", "file", "foreign", "own", "other")  # what is at --out before the command


def _make(root: Path, inputs: list[tuple[tuple, str]], out: tuple, state: str) -> None:
    for parts, kind in inputs:
        p = root.joinpath(*parts)
        if p.exists() or any(q.is_file() for q in [*p.parents, p]):
            continue  # already made by an earlier input (or under a file): keep the first
        if kind == "file":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"input {'/'.join(parts)}\n")
        else:
            p.mkdir(parents=True, exist_ok=True)
            (p / "data.jsonl").write_text(f"input {'/'.join(parts)}\n")
    o = root.joinpath(*out)
    if o.exists() or any(q.is_file() for q in o.parents) or state == "absent":
        return
    if state == "file":
        o.parent.mkdir(parents=True, exist_ok=True)
        o.write_text("user file\n")
        return
    o.mkdir(parents=True)
    if state == "foreign":
        (o / "sub").mkdir()
        (o / "sub" / "keep.txt").write_text("user file\n")
    elif state in ("own", "other"):
        from branchgate.fileio import mark_output_dir

        (o / "old.txt").write_text("previous output\n")
        mark_output_dir(o, "dataset build" if state == "own" else "simulate")  # the manifest lists old.txt


def _expected_refusal(root: Path, inputs: list[tuple[tuple, str]], out: tuple) -> bool:
    """The oracle, by path components: overlap with an input, else what is at ``out`` now."""
    if any(out[: len(p)] == p or p[: len(out)] == out for p, _ in inputs):
        return True
    o = root.joinpath(*out)
    if any(q.is_file() for q in o.parents):
        return True
    if o.is_file():
        return True
    if o.is_dir():
        mark = o / ".branchgate.json"
        own = mark.is_file() and json.loads(mark.read_text()).get("command") == "dataset build"
        return not own and any(o.iterdir())
    return False


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # examples: the profile's (conftest.py)
@given(
    inputs=st.lists(st.tuples(path_parts, st.sampled_from(["file", "dir"])), min_size=1, max_size=3),
    out=path_parts,
    state=st.sampled_from(STATES),
)
def test_guard_refuses_exactly_the_unsafe_layouts(inputs, out, state):
    from branchgate.errors import InputError
    from branchgate.fileio import atomic_dir, check_output_dir

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _make(root, inputs, out, state)
        expect = _expected_refusal(root, inputs, out)
        event("refused" if expect else "accepted")
        given_inputs = [root.joinpath(*p) for p, _ in inputs]
        before = snapshot(root)
        kept = {
            k: v
            for k, v in before.items()
            if any(Path(root, k) == i or i in Path(root, k).parents for i in given_inputs)
        }
        o = root.joinpath(*out)
        try:
            check_output_dir(o, given_inputs, "dataset build")
        except InputError as exc:
            assert expect, f"refused a safe layout: {exc}"
            assert str(o) in str(exc)
            assert snapshot(root) == before  # a refusal changes nothing
            return
        assert not expect, f"accepted an unsafe layout: {out} over {inputs} ({state})"
        with atomic_dir(o, "dataset build") as t:  # what the command then does: replace the folder whole
            (t / "manifest.json").write_text("{}")
        after = snapshot(root)
        assert {k: after.get(k) for k in kept} == kept  # no input removed or changed
        assert sorted(p.name for p in o.iterdir()) == [".branchgate.json", "manifest.json"]


def test_guard_on_hand_made_layouts(tmp_path):
    from branchgate.errors import InputError
    from branchgate.fileio import check_output_dir

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.jsonl").write_text("{}\n")
    ok = [tmp_path / "out", tmp_path / "new" / "deep" / "out", tmp_path / "in2"]
    for out in ok:
        assert check_output_dir(out, [tmp_path / "in"], "dataset build") == out
    link = tmp_path / "alias"
    link.symlink_to(tmp_path / "in")
    for out, words in [
        (tmp_path / "in", "is the input"),
        (tmp_path / "in" / "o", "is inside"),
        (tmp_path, "contains the input"),
        (link, "is the input"),
        (tmp_path / "in" / "x.jsonl" / "o", "is inside"),
    ]:
        with pytest.raises(InputError, match=words):
            check_output_dir(out, [tmp_path / "in"], "dataset build")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "in"]
