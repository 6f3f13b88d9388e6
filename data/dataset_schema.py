"""The decision dataset contract: splits, columns and their types, schema version (core-safe: no ``datasets``
import until ``features`` is called).

One row is one candidate at one decision point (a frame), with its search state. ``logs_to_dataset.build``
writes it, ``data.decision_batches`` reads it for training and evaluation, ``export.parity`` reads it for the parity
checks. A dataset whose manifest has a newer ``schema_version`` is refused.

| column | type | meaning |
|---|---|---|
| run_id, frame_id, candidate_id | string | where the row comes from; splits are by run \
(``logs_to_dataset.decision_points.split_of``) |
| root_query, frame_query, parent_goal | string | the decision's state texts |
| retained | list of string | ``texts.candidate_text`` of the branches expanded before the frame opened |
| query, goal | string | the candidate |
| depth, order, n_candidates, n_retained | int32 | ``features.FEATURE_NAMES``; order is the position 0..K-1 in the \
frame |
| expanded | bool | the run expanded the candidate |
| utility | float32 | realized marginal utility g (NaN when unknown) |
| label | int8 | 1 keep, 0 prune, −1 excluded from training |
| label_source, utility_kind | string | ``realized`` / ``teacher_pre`` / ``excluded``; ``keypoints`` or \
``teacher:<name>`` |
| teacher_<name> | float32 | each teacher's pre-retrieval score of the candidate |
"""

from __future__ import annotations

SPLITS = ("train", "validation", "test")
DATASET_SCHEMA_VERSION = 1
TEACHER_PREFIX = "teacher_"
COLUMNS: dict[str, str] = {
    "run_id": "string",
    "frame_id": "string",
    "candidate_id": "string",
    "root_query": "string",
    "frame_query": "string",
    "parent_goal": "string",
    "retained": "list[string]",
    "query": "string",
    "goal": "string",
    "depth": "int32",
    "order": "int32",
    "n_candidates": "int32",
    "n_retained": "int32",
    "expanded": "bool",
    "utility": "float32",
    "label": "int8",
    "label_source": "string",
    "utility_kind": "string",
}
REQUIRED_COLUMNS = tuple(COLUMNS)
# what decision points are built from (``data.decision_batches.build_decisions``, the export's parity decisions)
DECISION_COLUMNS = (
    "run_id",
    "frame_id",
    "root_query",
    "frame_query",
    "parent_goal",
    "retained",
    "query",
    "goal",
    "depth",
    "order",
    "label",
    "utility",
)


def columns(teacher_names) -> dict[str, str]:
    """Column name → type (a ``datasets`` value type, or ``list[string]``), teacher columns last."""
    return {**COLUMNS, **{f"{TEACHER_PREFIX}{n}": "float32" for n in teacher_names}}


def features(teacher_names):
    """The ``datasets.Features`` of a dataset with these teachers' columns."""
    from datasets import Features, Sequence, Value

    return Features(
        {
            name: Sequence(Value("string")) if dtype == "list[string]" else Value(dtype)
            for name, dtype in columns(teacher_names).items()
        }
    )


def teacher_columns(column_names) -> list[str]:
    return [c for c in column_names if c.startswith(TEACHER_PREFIX)]
