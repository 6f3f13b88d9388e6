"""Synthetic decision datasets with a planted signal (tests, benchmarks, trying the trainer).

Each run researches one topic. Every frame offers candidates of three kinds:
- novel: the run's topic, a facet not yet retained → worth expanding (label 1, utility 1–3 key points);
- redundant: the run's topic, a facet already retained, phrased differently → label 0, utility 0;
- off-topic: another topic → label 0, utility 0.
So y = 1 exactly when the candidate text is semantically close to the root query and far from the
retained branches (plus ``noise`` label flips). Expanded novel candidates join the retained set and
open child frames. Rows follow the decision-dataset contract (``data.dataset_schema``) and the split-by-run rule.
``teacher_lexical`` is a lexical MMR score (word overlap), a stand-in for the real teacher columns.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

from branchgate import __version__
from branchgate.data.dataset_schema import DATASET_SCHEMA_VERSION, SPLITS, split_of
from branchgate.data.dataset_schema import features as schema_features
from branchgate.data.decision_batches import TextTable, build_decisions
from branchgate.data.embedding_cache import EmbeddingCache
from branchgate.fileio import atomic_dir, atomic_write_json
from branchgate.texts import candidate_text

TOPICS = [
    "electric cars",
    "coffee consumption",
    "social media",
    "nuclear power",
    "remote work",
    "honey bees",
    "microplastics",
    "video games",
    "urban gardening",
    "cryptocurrency",
    "antibiotic resistance",
    "high-speed rail",
    "ocean acidification",
    "online education",
    "wind turbines",
    "sleep deprivation",
    "fast fashion",
    "space tourism",
    "minimum wage",
    "lithium mining",
    "plant-based meat",
    "wildfires",
    "artificial sweeteners",
    "smartphone addiction",
]
FACETS = [
    "health effects",
    "economic costs",
    "environmental impact",
    "history",
    "government regulation",
    "public opinion",
    "technological progress",
    "effects on children",
    "job market",
    "future outlook",
    "safety risks",
    "scientific controversy",
]
QUERY_TEMPLATES = [
    "{facet} of {topic}",
    "what is known about the {facet} of {topic}",
    "{topic}: evidence on {facet}",
    "how does {topic} relate to {facet}",
]
GOAL_TEMPLATES = [
    "Find evidence on the {facet} of {topic}.",
    "Summarise research about {topic} and its {facet}.",
    "Collect data describing {facet} linked to {topic}.",
]
ROOT_TEMPLATES = [
    "What are the main consequences of {topic}?",
    "Should society worry about {topic}?",
    "How is {topic} changing the world?",
]
PLACES = [
    "in Norway",
    "in Brazil",
    "in Kenya",
    "in Japan",
    "in Canada",
    "in India",
    "in Germany",
    "in Chile",
    "in Vietnam",
    "in Egypt",
    "in Poland",
    "in Mexico",
    "in Australia",
    "in Spain",
    "in Nigeria",
    "in Peru",
]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _lexical_mmr(text: str, root: str, retained: list[str], lam: float = 0.6) -> float:
    def jac(a, b):
        a, b = _words(a), _words(b)
        return len(a & b) / max(1, len(a | b))

    red = max((jac(text, r) for r in retained), default=0.0)
    return lam * jac(text, root) - (1 - lam) * red


def synthetic_rows(
    n_runs: int = 60,
    seed: int = 0,
    frames_per_run: tuple[int, int] = (2, 4),
    candidates: tuple[int, int] = (3, 6),
    noise: float = 0.05,
    unique_texts: bool = False,
) -> list[dict]:
    """Contract rows for ``n_runs`` synthetic runs. ``unique_texts`` adds a per-run place/year qualifier so
    almost every text is distinct (to measure cold-cache embedding)."""
    rng = random.Random(seed)
    rows: list[dict] = []
    for r in range(n_runs):
        run_id = f"syn-{seed}-{r:06d}"
        topic = rng.choice(TOPICS)
        qual = f" {rng.choice(PLACES)} since {rng.randint(1950, 2020)}" if unique_texts else ""
        root = rng.choice(ROOT_TEMPLATES).format(topic=topic + qual)
        covered: list[str] = []  # facets retained so far
        retained: list[str] = []
        open_frames = [("f0", 0, root, "")]
        n_frames = rng.randint(*frames_per_run)
        made = 0
        while open_frames and made < n_frames:
            frame_id, depth, frame_query, parent_goal = open_frames.pop(0)
            made += 1
            k = rng.randint(*candidates)
            cands = []
            for order in range(k):
                kind = rng.choices(["novel", "redundant", "offtopic"], weights=[0.4, 0.3 if covered else 0.0, 0.3])[0]
                if kind == "novel":
                    free = [f for f in FACETS if f not in covered]
                    facet, t = rng.choice(free or FACETS), topic
                elif kind == "redundant":
                    facet, t = rng.choice(covered), topic
                else:
                    facet, t = rng.choice(FACETS), rng.choice([x for x in TOPICS if x != topic])
                query = rng.choice(QUERY_TEMPLATES).format(facet=facet, topic=t + qual)
                goal = rng.choice(GOAL_TEMPLATES).format(facet=facet, topic=t + qual)
                y = 1 if kind == "novel" else 0
                if rng.random() < noise:
                    y = 1 - y
                utility = float(rng.randint(1, 3)) if y else 0.0
                cands.append((order, kind, facet, query, goal, y, utility))
            text_retained = list(retained)
            for order, _kind, _facet, query, goal, y, utility in cands:
                ctext = candidate_text(query, goal)
                rows.append(
                    {
                        "run_id": run_id,
                        "frame_id": frame_id,
                        "candidate_id": f"{frame_id}c{order}",
                        "root_query": root,
                        "frame_query": frame_query,
                        "parent_goal": parent_goal,
                        "retained": text_retained,
                        "query": query,
                        "goal": goal,
                        "depth": depth,
                        "order": order,
                        "n_candidates": k,
                        "n_retained": len(text_retained),
                        "expanded": True,
                        "utility": utility,
                        "label": y,
                        "label_source": "realized",
                        "utility_kind": "keypoints",
                        "teacher_lexical": _lexical_mmr(ctext, root, text_retained),
                    }
                )
            for order, kind, facet, query, goal, y, _utility in cands:
                if y == 1:
                    retained.append(candidate_text(query, goal))
                    if kind == "novel" and facet not in covered:
                        covered.append(facet)
                    open_frames.append((f"{frame_id}.{order}", depth + 1, query, goal))
    return rows


def synthetic_dataset(
    n_runs: int = 60, seed: int = 0, encoder_id: str = "sentence-transformers/all-MiniLM-L6-v2", **kwargs
):
    """``(DatasetDict, manifest)`` following the decision-dataset contract."""
    import datasets

    rows = synthetic_rows(n_runs=n_runs, seed=seed, **kwargs)
    features = schema_features(["lexical"])
    by_split: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for row in rows:
        by_split[split_of(row["run_id"])].append(row)
    dsd = datasets.DatasetDict(
        {
            name: datasets.Dataset.from_list(part, features=features)
            if part
            else datasets.Dataset.from_dict({k: [] for k in features}, features=features)
            for name, part in by_split.items()
        }
    )
    runs = {name: len({r["run_id"] for r in part}) for name, part in by_split.items()}
    frames = {name: len({(r["run_id"], r["frame_id"]) for r in part}) for name, part in by_split.items()}
    manifest = {
        "schema_version": DATASET_SCHEMA_VERSION,
        "stage": "pre",
        "n_runs": {**runs, "total": sum(runs.values())},
        "n_decisions": {name: len(part) for name, part in by_split.items()},
        "n_frames": {**frames, "total": sum(frames.values())},
        "n_files": 0,
        "skipped": [],
        "teacher": "synthetic",
        "label_threshold": 1,
        "label_kind": "keypoints",
        "encoder": encoder_id,
        "source_sha256": hashlib.sha256(f"synthetic:{n_runs}:{seed}:{sorted(kwargs.items())}".encode()).hexdigest(),
        "teachers": ["lexical"],
        "created_by": f"branchgate {__version__} (synthetic)",
    }
    return dsd, manifest


def write_synthetic_dataset(out, n_runs: int = 60, seed: int = 0, **kwargs):
    """Write a synthetic decision dataset to ``out`` (atomically) and return its path."""
    dsd, manifest = synthetic_dataset(n_runs=n_runs, seed=seed, **kwargs)
    with atomic_dir(out) as tmp:
        dsd.save_to_disk(str(tmp))
        atomic_write_json(Path(tmp) / "manifest.json", manifest)
    return Path(out)


def warm_cache(dataset_dir, cache_path, encoder) -> None:
    """Embed every text of a decision dataset's decision points into the embedding cache at ``cache_path``
    with ``encoder``, so that training on it never loads an encoder."""
    import datasets

    texts = TextTable()
    dsd = datasets.load_from_disk(str(dataset_dir))
    for name in dsd:
        build_decisions(name, dsd[name], texts)
    EmbeddingCache(encoder, cache_path).get(texts.texts[1:])
