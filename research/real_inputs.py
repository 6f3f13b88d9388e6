"""Other inputs on the real decisions: do they carry signal DPP lacks? (issue 22)

`real_ceiling.py` fits models on a sequential agent's real decisions from what a pre-retrieval gate sees
(teachers, scalars, embeddings) and finds nothing beyond DPP. This probe adds three inputs, each to
`real_ceiling.py`'s scalars, and fits them the same way (logistic regression, 5 folds over runs, paired
interval against the best teacher):

- *query words*: the search query's words, one binary column each (words in at least ``min_df`` queries;
  not standardised), over a small grid of ``min_df`` and regularisation (all printed; none chosen);
- *the agent's reasoning*: the text the agent wrote just before the search (its last ``N`` characters) —
  available before retrieval to any agent that thinks aloud (Search-o1, ReAct): its cosine to the question and
  to the query, and the query read together with it;
- *the result list* (after the search, before reading: not pre-retrieval): the opening words of each
  returned document (``common.opening``, as in ``result_inputs.py``), as a search API's snippet would show
  them — their cosine to the question and to the query, how many documents came back and how many are new to
  the run. This measures what moving the decision after the search call (paying for the search, not for
  reading its results) could know.

    python3 -m research.real_inputs DATASET TRACES [--cache PATH] [--reps 5] [--boot 1000]

DATASET: a decision dataset built from Search-o1 traces (`branchgate dataset build --format searcho1`);
TRACES: the folder of those traces (`<qid>.a`), read again for the reasoning and the result lists.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from .common import compare, load_real, opening

REASONING_CHARS = (200, 500, 1500)
WORD_GRID = [(min_df, c) for min_df in (3, 10) for c in (0.03, 0.1, 0.3, 1.0)]


def search_index(candidate_id: str) -> int:
    """The Search-o1 reader names the i-th search's candidate ``c<i>``."""
    m = re.fullmatch(r"c(\d+)", candidate_id)
    if m is None:
        raise ValueError(f"not a Search-o1 candidate id: {candidate_id!r}")
    return int(m.group(1))


class Traces:
    """Each run's parsed trace, read once: the text before each search and its result documents."""

    def __init__(self, folder: Path):
        self.folder, self.parsed = folder, {}

    def _parse(self, run: str):
        from branchgate.logs_to_dataset.drgym import parse_documents, parse_trace

        if run not in self.parsed:
            prefix, searches, _orphans, _truncated = parse_trace((self.folder / f"{run}.a").read_text("utf-8"))
            docs = [parse_documents(s.result) if s.result else [] for s in searches]
            self.parsed[run] = (prefix, searches, docs)
        return self.parsed[run]

    def reasoning(self, run: str, i: int) -> str:
        prefix, searches, _ = self._parse(run)
        return prefix if i == 0 else searches[i - 1].after

    def results(self, run: str, i: int) -> tuple[list, set[str]]:
        """The i-th search's documents and the ids of every document returned before it in the run."""
        _, _, docs = self._parse(run)
        return docs[i], {d.id for earlier in docs[:i] for d in earlier}


def word_columns(queries: list[str], min_df: int) -> np.ndarray:
    from sklearn.feature_extraction.text import CountVectorizer

    vec = CountVectorizer(binary=True, min_df=min_df, token_pattern=r"[a-z0-9]+")
    return vec.fit_transform([q.lower() for q in queries]).toarray().astype(np.float64)


def reasoning_columns(emb, traces: Traces, keys, queries, cand, root, chars: int) -> np.ndarray:
    from branchgate.texts import candidate_text

    text = [traces.reasoning(run, i)[-chars:] for run, i in keys]
    r = emb.get(text)
    with_query = emb.get([candidate_text(q, t) for q, t in zip(queries, text)])
    return np.column_stack(
        [(r * root).sum(1), (r * cand).sum(1), (with_query * root).sum(1), np.log1p([len(t.split()) for t in text])]
    )


def result_columns(emb, traces: Traces, keys, cand, root) -> np.ndarray:
    cols = []
    for k, (run, i) in enumerate(keys):
        docs, seen = traces.results(run, i)
        if not docs:
            cols.append([0.0, 0.0, 0.0, 0.0, 0.0])
            continue
        snip = emb.get([opening(d.text) for d in docs])
        to_root, to_cand = snip @ root[k], snip @ cand[k]
        new = sum(d.id not in seen for d in docs)
        cols.append(
            [float(to_root.max()), float(to_root.mean()), float(to_cand.max()), np.log1p(len(docs)), new / len(docs)]
        )
    return np.asarray(cols, np.float64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("traces", type=Path, help="the Search-o1 trace folder the dataset was built from")
    ap.add_argument("--cache", default=None, help="embedding cache (default: the branchgate cache folder's)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--boot", type=int, default=1000)
    args = ap.parse_args()

    y, runs, teachers, scalars, cand, root, rows, emb = load_real(args.dataset, args.cache)
    traces = Traces(args.traces)
    keys = [(run, search_index(cid)) for run, cid in zip(rows["run_id"], rows["candidate_id"])]
    queries = list(rows["query"])

    models = {"LR teachers + scalars": (scalars, 1.0)}
    for min_df, c in WORD_GRID:
        words = word_columns(queries, min_df)
        models[f"+ query words (min_df {min_df}: {words.shape[1]}, C={c})"] = (
            np.column_stack([scalars, words]),
            c,
            scalars.shape[1],
        )
    for chars in REASONING_CHARS:
        models[f"+ reasoning before the search ({chars} chars)"] = (
            np.column_stack([scalars, reasoning_columns(emb, traces, keys, queries, cand, root, chars)]),
            1.0,
        )
    results = result_columns(emb, traces, keys, cand, root)
    models["result list alone: best opening's cosine to Q"] = (results[:, :1], 1.0)  # one column: its own ranking
    models["+ result list (post-search: snippets)"] = (np.column_stack([scalars, results]), 1.0)
    compare(models, y, runs, teachers, args.reps, args.boot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
