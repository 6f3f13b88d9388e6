"""The decision dataset contract: splits, columns and their types, schema version (core-safe: no ``datasets``
import until ``features`` is called).

One row is one candidate at one decision point, with its search state. ``logs_to_dataset.build`` writes it,
``data.decision_batches`` reads it for training and evaluation, ``export.parity`` reads it for the parity checks
(through ``decision_batches.build_decisions``). A dataset whose manifest has a newer ``schema_version`` is refused.

Stages (``STAGES``; the manifest's ``stage``, "pre" when absent: schema version 1 datasets are all pre-retrieval):

- ``pre`` — a decision point is a frame (``logs_to_dataset.decision_points``), a candidate one of its sub-queries;
- ``read`` — a decision point is one search's result list (a ``results`` event: ``logs_to_dataset.read_points``),
  a candidate one of its hits that is new to the run (a hit read before, or in the context, gets no row: the
  runtime never scores it). Its columns are the pre stage's, with the read meaning given below, plus
  ``READ_COLUMNS`` (only read datasets have them: ``columns(teacher_names, stage)``).

| column | type | meaning (pre) | meaning (read) |
|---|---|---|---|
| run_id | string | the run; splits are by run (``data.dataset_schema.split_of``) or question | same |
| frame_id | string | the frame | the read point: ``f"{candidate_id}@{seq}"`` (the searched candidate, the seq of \
its ``results`` event) |
| candidate_id | string | the candidate | the hit id |
| root_query, frame_query, parent_goal | string | the run's question, the frame's query and goal | the run's \
question, the searched sub-query, its goal |
| retained | list of string | ``texts.candidate_text`` of the branches expanded before the frame opened | \
``texts.hit_text`` of the hits read before the search, oldest first, on the decision's first row (order 0) \
only, [] on its other rows |
| query, goal | string | the candidate | ``texts.hit_text(title, snippet)``, "" |
| depth, order, n_candidates, n_retained | int32 | ``features.FEATURE_NAMES``; order is the position 0..K-1 in \
the frame | depth of the searched frame; order the position among the list's new hits by rank; n_retained the \
length of the decision's retained list (on every row) |
| expanded | bool | the run expanded the candidate | the run read the hit |
| utility | float32 | realized marginal utility g (NaN when unknown) | the hit's (NaN: unlabelled, no full text) |
| label | int8 | 1 keep, 0 prune, −1 excluded from training | same |
| label_source, utility_kind | string | ``realized`` / ``teacher_pre`` / ``excluded``; ``keypoints``, \
``citations``, ``teacher:<name>``, ... | same |
| title, snippet, url | string | (read only) | the hit's title, snippet and url ("" when none) |
| rank | int32 | (read only) | the hit's rank in the whole result list |
| teacher_<name> | float32 | each teacher's pre-retrieval score of the candidate | each teacher's score of the \
hit's text against the read hits' texts |

Readers take a decision's state (root, frame query, goal, retained, depth) from its first row in ``order``
(``decision_batches.build_decisions``; ``export.parity`` through it): a read dataset stores ``retained`` there
only, so that a list of K new hits does not store the run's reading K times.
"""

from __future__ import annotations

import hashlib

from branchgate.errors import InputError

SPLITS = ("train", "validation", "test")


def split_of(key: str) -> str:
    """Stable split of a run by its key (its id, ``logs_to_dataset.decision_points.split_key``): sha256(key) mod 100
    → <80 train, <90 validation, else test."""
    bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"


DATASET_SCHEMA_VERSION = 2  # 2: the manifest's ``stage`` and read datasets (a version 1 dataset is a pre dataset)
STAGES = ("pre", "read")
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
READ_COLUMNS: dict[str, str] = {"title": "string", "snippet": "string", "rank": "int32", "url": "string"}
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


def check_stage(stage, where: str = "--stage") -> str:
    """``stage`` when it is one of ``STAGES``, else an ``InputError`` naming ``where``."""
    if stage not in STAGES:
        raise InputError(f"must be one of {', '.join(STAGES)}, got {stage!r}", where)
    return stage


def dataset_stage(manifest: dict, where: str = "manifest.json") -> str:
    """The stage a dataset's manifest records ("pre" when it records none: schema version 1)."""
    return check_stage(manifest.get("stage", "pre"), f"{where} stage")


def stage_columns(stage: str = "pre") -> dict[str, str]:
    """The columns a stage has beside the teachers' (``COLUMNS``, then ``READ_COLUMNS`` for ``read``)."""
    return {**COLUMNS, **(READ_COLUMNS if check_stage(stage) == "read" else {})}


def columns(teacher_names, stage: str = "pre") -> dict[str, str]:
    """Column name → type (a ``datasets`` value type, or ``list[string]``) of a ``stage`` dataset, teacher
    columns last."""
    return {**stage_columns(stage), **{f"{TEACHER_PREFIX}{n}": "float32" for n in teacher_names}}


def features(teacher_names, stage: str = "pre"):
    """The ``datasets.Features`` of a ``stage`` dataset with these teachers' columns."""
    from datasets import Features, Sequence, Value

    return Features(
        {
            name: Sequence(Value("string")) if dtype == "list[string]" else Value(dtype)
            for name, dtype in columns(teacher_names, stage).items()
        }
    )


def teacher_columns(column_names) -> list[str]:
    return [c for c in column_names if c.startswith(TEACHER_PREFIX)]
