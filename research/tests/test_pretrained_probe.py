"""research.pretrained_real: the default rule (the model only when its paired interval is above the best teacher)."""

from __future__ import annotations

from research.pretrained_real import decide_default


def _table(model, teachers):
    per = {"model": {"auroc": model, "ci95": [0, 1], "delta_vs_model": None}}
    for name, (auroc, lo, hi) in teachers.items():
        per[name] = {"auroc": auroc, "ci95": [0, 1], "delta_vs_model": {"mean": model - auroc, "ci95": [lo, hi]}}
    per["teacher_gate:dpp"] = {"auroc": 0.99, "ci95": [0, 1], "delta_vs_model": {"mean": -0.1, "ci95": [-0.2, 0]}}
    return {"rows": 10, "runs": 5, "per_row": per}


def test_model_wins_only_above_the_best_teacher():
    won = decide_default(_table(0.85, {"dpp": (0.82, 0.01, 0.05), "mmr": (0.80, 0.02, 0.08)}))
    assert won["default"] == "model" and won["teacher"] == "dpp"  # the teacher gate columns are not candidates
    tie = decide_default(_table(0.82, {"dpp": (0.823, -0.01, 0.005), "mmr": (0.80, 0.0, 0.04)}))
    assert tie["default"] == "teacher" and tie["teacher"] == "dpp" and "not above" in tie["why"]
