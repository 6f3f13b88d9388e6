"""Issue 48, the gate's part: bounded reads of its input and run state (4), bounded --threads and Ctrl-C (5),
one candidate rule for ``gated`` and ``Gate.select`` (7), run ids that are not open (8), and a named error for
each bad --input / --state (13)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from export_support import exported

from branchgate.cli import main
from branchgate.errors import InputError
from branchgate.inference.agents.adapters import gated
from branchgate.inference.gate import Gate

DECISION = {
    "state": {"root_query": "Why are honeybee colonies collapsing?"},
    "candidates": [{"query": "varroa mite treatment", "goal": "parasites"}, "honey prices by country"],
}
CLI = [sys.executable, "-m", "branchgate"]


@pytest.fixture(scope="module")
def model(encoder) -> str:
    return exported(encoder)["files"]["int8"]


@pytest.fixture(scope="module")
def gate(model) -> Gate:
    return Gate.load(model, threads=1)


def _at_most_4_gib():
    """A child's address space limit: an unbounded read fails fast here instead of taking the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _gate(model, *flags, stdin=None, timeout=90, prefix=()):
    """``branchgate gate`` in a child process: (returncode, stdout, stderr); a hang fails the test."""
    cmd = [*prefix, *CLI, "gate", "--pre", model, *flags]
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, preexec_fn=_at_most_4_gib)
    except subprocess.TimeoutExpired:
        pytest.fail(f"branchgate gate {' '.join(flags)} did not finish within {timeout}s")
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _in_process(monkeypatch, capsys, model, *flags, stdin: bytes = b""):
    """``branchgate gate`` through ``cli.main``, stdin given as bytes: (returncode, answers, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    rc = main(["gate", "--pre", model, *flags])
    out = capsys.readouterr()
    return rc, [json.loads(x) for x in out.out.splitlines()], out.err


def _device_like_dev_full(path) -> str:
    """A character device reading like /dev/full at ``path`` (root), else a FIFO: never a regular file."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except (PermissionError, OSError):
        os.mkfifo(path)
    return str(path)


# -- 4: bounded reads -------------------------------------------------------------------------------------
def test_input_from_an_endless_device_is_a_bounded_read_with_a_named_error(model):
    rc, out, err = _gate(model, "--input", "/dev/full")  # the read is bounded by bytes (and 4 GiB), not by time
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "/dev/full: longer than" in err
    with open("/dev/zero", "rb") as zero:  # stdin too
        p = subprocess.run(
            [*CLI, "gate", "--pre", model], stdin=zero, capture_output=True, timeout=90, preexec_fn=_at_most_4_gib
        )
    assert p.returncode == 2 and b"<stdin>: longer than" in p.stderr and b"Traceback" not in p.stderr


def test_state_on_a_device_is_refused_without_reading_or_writing_it(model, tmp_path):
    dev = _device_like_dev_full(tmp_path / "full")
    rc, out, err = _gate(model, "--state", dev, stdin=json.dumps(dict(DECISION, run_id="r")).encode(), timeout=60)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"{dev}: is not a regular file" in err
    assert not stat.S_ISREG(os.stat(dev).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["full"]


# -- 5: --threads bounded, Ctrl-C honoured ----------------------------------------------------------------
def test_threads_beyond_four_per_core_are_refused_at_once(model):
    most = 4 * (os.cpu_count() or 1)
    rc, out, err = _gate(model, "--threads", "2000", stdin=json.dumps(DECISION).encode(), timeout=60)
    assert rc == 2 and out == "" and f"--threads: must be an integer from 1 to {most}" in err and "got 2000" in err
    # at once: the flag is refused before any work, before the controller file is even looked at
    rc, _, err = _gate(str(Path("no") / "such" / "controller.onnx"), "--threads", "2000", stdin=b"", timeout=60)
    assert rc == 2 and "--threads: must be an integer" in err and "controller.onnx" not in err
    with pytest.raises(InputError, match=f"^threads: .* 1 to {most}"):
        Gate.load(model, threads=most + 1)
    assert Gate.load(model, threads=most).session is not None  # the bound itself is allowed


def test_ctrl_c_stops_a_long_gate_job_promptly_and_keeps_the_run_state_whole(model, tmp_path):
    jobs = tmp_path / "long.jsonl"
    with jobs.open("w") as fh:
        for i in range(20_000):
            fh.write(
                json.dumps(
                    {
                        "run_id": "long",
                        "state": {"root_query": f"question {i} on bee health"},
                        "candidates": [f"candidate {i}.{j} on mites and weather" for j in range(4)],
                    }
                )
                + "\n"
            )
    state = tmp_path / "runs.json"
    most = str(4 * (os.cpu_count() or 1))
    p = subprocess.Popen(
        [*CLI, "gate", "--pre", model, "--jsonl", "--input", str(jobs), "--state", str(state), "--threads", most],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # a shell starts a background job with SIGINT ignored and its children inherit that (Python then installs
        # no KeyboardInterrupt handler): the job gets the default, as a command typed at a terminal has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not state.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)
        assert p.poll() is None, "the job ended before it could be interrupted"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)  # a safety bound, not a measured time
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and b"interrupted" in err
    done = json.loads(state.read_text())["runs"]["long"]["decisions"]  # the last write is whole
    assert 1 <= done < 20_000  # it stopped at the interrupt, not after the whole job


# -- 7: one candidate rule for gated() and Gate.select -----------------------------------------------------
def test_gated_and_select_refuse_the_same_non_lists(gate):
    async def agen(q):
        yield "varroa mites"

    async def astring(q):
        return "varroa mites\nhoney prices"

    for bad, hint in (
        ("varroa mites\nhoney prices", "splitlines"),
        ({"query": "varroa mites"}, "pass [it]"),
        (None, "pass []"),
        (b"varroa", "bytes"),
        (42, "int"),
    ):
        with pytest.raises(InputError, match=f"must be a list of candidates, got .*{re.escape(hint)}"):
            gated(lambda q, bad=bad: bad, gate)("bees")
        with pytest.raises(InputError, match=f"^candidates: must be a list of candidates, got .*{re.escape(hint)}"):
            gate.select(DECISION["state"], bad)
    with pytest.raises(InputError, match=r"\[c async for c in it\]"):
        gated(agen, gate)("bees")
    with pytest.raises(InputError, match="splitlines"):
        asyncio.run(gated(astring, gate)("bees"))
    for bad in ([{"goal": "no query"}], [["a", "b", "c"]], [None], [{"query": 7}]):
        with pytest.raises(InputError, match=r"candidates.*\[0\]"):
            gated(lambda q, bad=bad: bad, gate)("bees")
        with pytest.raises(InputError, match=r"^candidates\[0\]"):
            gate.select(DECISION["state"], bad)


def test_gated_and_select_read_every_candidate_shape_alike(gate):
    texts = ["varroa mite treatment", "honey prices by country"]
    want = gate.select({"root_query": "bees", "frame_query": "bees"}, texts).p_keep

    class Plan:
        def __init__(self, q):
            self.q = q

    shapes = (
        texts,
        [{"text": t} for t in texts],
        [{"question": t} for t in texts],
        [(t,) for t in texts],
        [Plan(t) for t in texts],
    )
    for items in shapes:
        for make in (lambda q, items=items: items, lambda q, items=items: (x for x in items)):  # a list, a generator
            seen = []
            kept = gated(make, gate, on_decision=seen.append, tau=0.0)("bees")
            np.testing.assert_allclose(seen[0].selection.p_keep, want, atol=1e-6)
            assert len(kept) == 2 and all(k is x for k, x in zip(kept, items))  # the caller's own objects
            np.testing.assert_allclose(
                gate.select({"root_query": "bees", "frame_query": "bees"}, make("")).p_keep, want, atol=1e-6
            )

    async def aplan(q):
        return texts

    assert asyncio.run(gated(aplan, gate, tau=0.0)("bees")) == texts
    assert asyncio.run(gated(lambda q: aplan(q), gate, tau=0.0)("bees")) == texts  # a coroutine is awaited


# -- 8: run ids that are not open --------------------------------------------------------------------------
def test_spend_or_revisit_for_a_run_that_is_not_open_is_an_error(monkeypatch, capsys, model, tmp_path):
    state = tmp_path / "runs.json"
    for extra, field in (
        ({"spend": 50}, "spend"),
        ({"spend": [5, 6]}, "spend"),
        ({"revisit": True}, "revisit"),
        ({"end_run": True}, "end_run"),
    ):
        request = dict(DECISION, run_id="never-started", **extra)
        if extra.get("revisit") or extra.get("end_run"):
            request["candidates"] = []
        rc, out, err = _in_process(
            monkeypatch, capsys, model, "--state", str(state), stdin=json.dumps(request).encode()
        )
        assert rc == 2 and out == [] and f"field '{field}'" in err and "'never-started' is not open" in err
    assert not state.exists() or "never-started" not in state.read_text()


def test_a_finished_run_is_not_reopened_silently(monkeypatch, capsys, model, tmp_path):
    state = str(tmp_path / "runs.json")

    def call(**fields):
        return _in_process(
            monkeypatch,
            capsys,
            model,
            "--state",
            state,
            stdin=json.dumps(dict(DECISION, run_id="r1", **fields)).encode(),
        )

    rc, [a], _ = call(budget_nodes=3)
    assert rc == 0 and a["budget"]["limit"]["nodes"] == 3
    rc, [b], _ = call(end_run=True)
    assert rc == 0 and "never_expanded" in b
    for late in ({}, {"spend": 10}, {"revisit": True, "candidates": []}, {"end_run": True, "candidates": []}):
        rc, out, err = call(**late)
        assert rc == 2 and out == [] and "'r1' has ended" in err
    runs = json.loads(open(state).read())
    assert "r1" not in runs["runs"] and "r1" in runs["ended"]
    rc, [c], _ = call(budget_nodes=5)  # a call that sets the budget anew starts it again, explicitly
    assert rc == 0 and c["budget"]["limit"]["nodes"] == 5 and c["budget"]["decision"] == 0
    rc, _, err = call(budget_nodes=9)  # and the reopened run's budget is its own again
    assert rc == 2 and "budget_nodes" in err


# -- 13: named errors for --input and --state --------------------------------------------------------------
def test_input_that_is_not_utf8_is_a_named_error(monkeypatch, capsys, model, tmp_path):
    text = json.dumps(DECISION, ensure_ascii=False).replace("varroa", "varroa é")
    for name, data, what in (
        ("bom16.json", text.encode("utf-16"), ": UTF-16 text, not UTF-8"),
        ("le16.json", text.encode("utf-16-le"), ": UTF-16 text, not UTF-8"),
        ("bom32.json", text.encode("utf-32"), ": UTF-32 text, not UTF-8"),
        ("latin1.json", text.encode("latin-1"), ":1: not UTF-8 text (byte"),
    ):
        (tmp_path / name).write_bytes(data)
        rc, out, err = _in_process(monkeypatch, capsys, model, "--input", str(tmp_path / name))
        assert rc == 2 and out == [] and f"{tmp_path / name}{what}" in err
        rc, out, err = _in_process(monkeypatch, capsys, model, stdin=data)
        assert rc == 2 and out == [] and f"<stdin>{what}" in err
    lines = (json.dumps(DECISION) + "\n").encode() * 2 + b'{"state": "\xff"}\n'
    rc, out, err = _in_process(monkeypatch, capsys, model, "--jsonl", stdin=lines)
    assert rc == 2 and "<stdin>:3: not UTF-8 text" in err
    # a UTF-8 byte-order mark is fine, and so is U+2028 inside a JSON string of a --jsonl line
    odd = "\ufeff" + json.dumps(dict(DECISION, candidates=["line\u2028separator", "b"]), ensure_ascii=False)
    rc, out, _ = _in_process(monkeypatch, capsys, model, "--jsonl", stdin=odd.encode())
    assert rc == 0 and len(out) == 1 and len(out[0]["p_keep"]) == 2
    rc, out, err = _in_process(monkeypatch, capsys, model, "--input", str(tmp_path))
    assert rc == 2 and f"{tmp_path}: is a folder" in err


def test_state_that_cannot_be_a_state_file_is_a_named_error(monkeypatch, capsys, model, tmp_path):
    request = json.dumps(dict(DECISION, run_id="r")).encode()
    folder = tmp_path / "a_folder"
    folder.mkdir()
    (tmp_path / "a_file").write_text("keep me\n")
    for state, what in (
        (folder, "is not a regular file"),
        (tmp_path / "a_file" / "runs.json", "is a file"),
        (tmp_path / "a_file", "invalid JSON"),
    ):
        rc, out, err = _in_process(monkeypatch, capsys, model, "--state", str(state), stdin=request)
        assert rc == 2 and out == [] and f"error: {state}" in err and what in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "a_folder"]  # the lock lives in the cache
    assert (tmp_path / "a_file").read_text() == "keep me\n" and not any(folder.iterdir())
    empty = tmp_path / "empty.json"
    empty.touch()  # e.g. from mktemp: no runs yet
    rc, [a], _ = _in_process(monkeypatch, capsys, model, "--state", str(empty), stdin=request)
    assert rc == 0 and "r" in json.loads(empty.read_text())["runs"]


def test_state_in_a_read_only_folder_is_a_named_error(model, tmp_path):
    prefix = ()
    if os.geteuid() == 0:  # root writes anywhere: drop the capability that lets it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    ro = tmp_path / "read_only"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, out, err = _gate(
            model,
            "--state",
            str(ro / "runs.json"),
            stdin=json.dumps(dict(DECISION, run_id="r")).encode(),
            prefix=prefix,
        )
        assert rc == 2 and out == "" and "Traceback" not in err
        assert f"{ro / 'runs.json'}: cannot write the run state (permission denied" in err
        assert not any(ro.iterdir())
    finally:
        ro.chmod(0o755)
