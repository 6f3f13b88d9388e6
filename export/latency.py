"""Latency of one gating decision: torch (checkpoint encoder + ValueNet, fp32) vs the ONNX Gate (fp32, int8).

Same decisions, same number of CPU threads, one process, each runtime with its default thread-pool
behaviour (torch's OpenMP, onnxruntime's spinning pool). Methods run in blocks (all decisions, both
states, after a short pause and one untimed call) whose order rotates each round, so a change in machine
load hits them alike and no idle pool of one method competes with another's run. Two states:

- cold: no embedding cached — every text of the decision is encoded (both sides);
- warm: the state texts (root, frame query, parent goal, retained) are cached, as they are within one
  run; only the candidate texts are new (both sides keep the same cache).

Ratios are torch p50 / ONNX p50 of the same state; ``speedup_*_ci95`` is a bootstrap 95% interval of that
ratio over rounds (rounds resampled with replacement, each keeping all its timings), i.e. how far the figure
moves with the machine's speed from round to round. The ONNX Gates run as they load by default: with
skippable parts and ≥ 2 threads, a decision's new texts are encoded as two groups at once
(``onnx_text_groups``), then the head runs.

A read controller (metadata ``stage`` = ``read``) is timed on read decisions (``inputs.as_read_decision``;
default: ``samples.sample_read_decisions``, 10 new hits each after 3 or 5 texts read): cold, every text is
encoded; warm (cached), the state texts — the question, the sub-query, its goal and the texts read — are, and
only the hits are new. The figures add ``stage`` and ``read_texts_per_decision``; ``candidates_per_decision`` is
then the hits per decision.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from branchgate.errors import MismatchError
from branchgate.export.samples import sample_decisions, sample_read_decisions
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_decision, as_read_decision, decision_texts

SETTLE_S = 0.1  # pause before each block: onnxruntime and OpenMP workers spin for a while after a run


def measure_latency(
    model: str,
    checkpoint: str,
    int8_model: str | None = None,
    threads: int = 2,
    reps: int = 10,
    decisions: Sequence | None = None,
    warmup: int = 1,
    progress: bool = False,
) -> dict:
    """The latency figures (module docstring) of torch and the ONNX Gates on ``decisions`` (``(state, candidates)``,
    or ``(read state, hits)`` for a read controller; default: the built-in samples of the model's stage), with each
    Gate's max |Δp_keep| vs torch on them."""
    int8_model = int8_model or _int8_sibling(model)
    methods, encoder_id = _methods(model, checkpoint, int8_model, threads)
    stage = methods["onnx_fp32"].stage
    decisions = predict_inputs(stage, decisions)
    parity = _parity(methods, decisions)
    for _ in range(warmup):
        for s, c in decisions:
            for m in methods.values():
                _clear(m)
                m.predict(s, c)
    load_start = os.getloadavg()[0]
    times = _timings(methods, decisions, reps, progress)
    out = {
        "threads": int(threads),
        "reps": int(reps),
        "decisions": len(decisions),
        "load_avg_1min_start": round(load_start, 2),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "candidates_per_decision": float(np.mean([len(c) for _, c in decisions])) if decisions else 0.0,
        "encoder": encoder_id,
        "model": str(model),
        "int8_model": int8_model,
        "onnx_text_groups": methods["onnx_fp32"].text_groups,
    }
    if stage != "pre":
        out["stage"] = stage
        out["read_texts_per_decision"] = float(np.mean([len(s.retained) for s, _ in decisions])) if decisions else 0.0
    out.update(_figures(times, list(methods), reps))
    out.update(parity)
    return out


def predict_inputs(stage: str, decisions: Sequence | None) -> list:
    """``(DecisionState, candidate texts)`` of each decision as a Gate of ``stage`` scores it (the Gate's input
    rules: ``as_decision``; ``as_read_decision``, the hits to score in rank order); default: the stage's samples."""
    if stage == "read":
        reads = [as_read_decision(s, hits) for s, hits in (sample_read_decisions() if decisions is None else decisions)]
        return [(r.state, r.texts) for r in reads]
    return [as_decision(s, cands) for s, cands in (sample_decisions() if decisions is None else decisions)]


def _methods(model: str, checkpoint: str, int8_model: str | None, threads: int) -> tuple[dict, str]:
    """({method name: what predicts a decision}, the encoder id): the checkpoint's torch model, the ONNX Gate
    and its int8 twin, all with ``threads`` CPU threads."""
    import torch

    from branchgate.export.controller import load_encoder
    from branchgate.export.torch_ref import TorchController
    from branchgate.training.checkpoint import load_controller

    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    net, meta = load_controller(checkpoint)
    encoder = load_encoder(meta)
    methods = {
        "torch": TorchController(net, encoder, cache=True),
        "onnx_fp32": Gate.load(model, expected_encoder=meta["encoder"], threads=threads),
    }
    if (meta.get("stage") or "pre") != methods["onnx_fp32"].stage:
        raise MismatchError(
            f"{checkpoint} is a {meta.get('stage') or 'pre'!r}-stage controller but {model} a "
            f"{methods['onnx_fp32'].stage!r}-stage one: time a model against the checkpoint it was exported from"
        )
    if int8_model:
        methods["onnx_int8"] = Gate.load(int8_model, expected_encoder=meta["encoder"], threads=threads)
    return methods, meta["encoder"]


def _parity(methods: dict, decisions: list) -> dict:
    """Each ONNX method's max |Δp_keep| vs torch on these very decisions (cold)."""
    outs = {name: [m.predict(s, c) for s, c in decisions] for name, m in methods.items()}
    return {
        f"{name}_max_abs_diff_p_keep": float(max(np.abs(a[0] - b[0]).max() for a, b in zip(outs[name], outs["torch"])))
        for name in methods
        if name != "torch"
    }


def _timings(methods: dict, decisions: list, reps: int, progress: bool) -> dict:
    """{(state, method): ms per call}, ``reps`` rounds of every decision in each state, the methods' order
    rotating each round (module docstring)."""
    times = {(state, name): [] for state in ("cold", "warm") for name in methods}  # reps x decisions, round by round
    names = list(methods)
    bar = _bar(progress, reps * len(names))
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            m = methods[name]
            _clear(m)
            time.sleep(SETTLE_S)  # the previous method's idle threads stop spinning
            m.predict(*decisions[0])  # untimed: wakes this method's thread pool
            for state in ("cold", "warm"):
                for s, c in decisions:
                    _clear(m)
                    if state == "warm":
                        m.embed(decision_texts(s, []))  # the state texts, cached as within one run
                    t = time.perf_counter()
                    m.predict(s, c)
                    times[(state, name)].append((time.perf_counter() - t) * 1000.0)
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return times


def _figures(times: dict, names: list[str], reps: int) -> dict:
    """p50 / p95 per state and method, and each ONNX method's speedup over torch with its 95% interval."""
    out = {}
    for (state, name), ts in times.items():
        prefix = name if state == "cold" else f"warm_{name}"
        out[f"{prefix}_ms_p50"] = round(float(np.percentile(ts, 50)), 3)
        out[f"{prefix}_ms_p95"] = round(float(np.percentile(ts, 95)), 3)
    for state, prefix in (("cold", ""), ("warm", "warm_")):
        for name in names[1:]:
            key = f"{prefix}speedup_{name.split('_', 1)[1]}"
            out[key] = round(out[f"{prefix}torch_ms_p50"] / out[f"{prefix}{name}_ms_p50"], 2)
            lo, hi = ratio_interval(times[(state, "torch")], times[(state, name)], reps)
            out[f"{key}_ci95"] = [round(lo, 2), round(hi, 2)]
    return out


def ratio_interval(
    base: Sequence[float], other: Sequence[float], rounds: int, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap 95% interval of p50(base) / p50(other), resampling whole rounds (both lists hold ``rounds``
    equal blocks of timings, in round order)."""
    base = np.asarray(base, np.float64).reshape(rounds, -1)
    other = np.asarray(other, np.float64).reshape(rounds, -1)
    picks = np.random.default_rng(seed).integers(0, rounds, size=(resamples, rounds))
    ratios = np.median(base[picks].reshape(resamples, -1), 1) / np.median(other[picks].reshape(resamples, -1), 1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def _clear(method) -> None:
    method.clear_cache()


def _int8_sibling(model: str) -> str | None:
    from branchgate.export.controller import paths_for

    path = Path(model)
    if path.is_dir():
        path = path / "controller.onnx"
    twin = paths_for(path)["int8"] if path.suffix == ".onnx" else None
    return str(twin) if twin and twin.is_file() else None


def _bar(enabled: bool, total: int):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    return tqdm(total=total, desc="bench-gate", file=sys.stderr, disable=not sys.stderr.isatty())
