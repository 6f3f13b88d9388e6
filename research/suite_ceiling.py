"""Can anything learned on the packaged encoder order the common-sense suite's pre-retrieval pairs at ≥ 0.95?

    python3 -m research.suite_ceiling --real-pre real_pre --real-read real_read [--epochs 2] [--json OUT]

``real_pre`` / ``real_read``: ``dataset build`` of the Search-o1 dev traces (docs/research/honest-simulator.md). Their
rows give the real agents' own sub-queries for 378 questions: (question, one of its agent's queries) is a relevant
pair. Irrelevant pairs: a query another question's agent wrote that shares a content word with this question (a
word-sharing trap, as the suite's are: "honey prices by country 2023" for a question on honeybees), and two
queries of random other questions. The suite is only ever scored, never trained on. Figures (pair accuracy on the
suite's 32 pre-retrieval decisions, as ``bench/common_sense.check`` counts it):

- ``cosine``: the packaged encoder's cosine similarity of question and sub-query;
- ``probe_*``: a logistic regression and a one-layer MLP on the frozen embeddings' interaction features
  ``[q·c, |q−c|, cos]`` (what a controller's MLP sees of the two texts), trained on the pairs, with and without
  the word-sharing traps;
- ``finetuned_epoch_k``: the encoder itself fine-tuned on the pairs (in-batch negatives plus the trap as a hard
  negative, AdamW 2e-5, batch 32), its cosine after each epoch.

Needs the train extra and the real datasets (``../shared``); DeepResearchGym text stays out of the repository.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

SEED = 0


def real_pairs(dataset_dirs: list[str]) -> dict[str, list[str]]:
    """Question → the sorted sub-queries its agent searched, over every split of the given datasets."""
    from datasets import load_from_disk

    own: dict[str, set] = {}
    for path in dataset_dirs:
        dsd = load_from_disk(path)
        for split in dsd:
            for r in dsd[split].select_columns(["root_query", "query"]):
                own.setdefault(r["root_query"], set()).add(r["query"])
    return {q: sorted(v) for q, v in sorted(own.items())}


def training_pairs(own: dict[str, list[str]], traps_per_question: int, rng: random.Random) -> list[tuple]:
    """(question, sub-query, label, trap) rows: every own query relevant; ``traps_per_question`` word-sharing
    queries of other questions and two random other questions' queries irrelevant. ``trap`` is a word-sharing
    query of another question for the fine-tuning's hard negative."""
    from branchgate.pipeline.textutil import content_words

    roots = list(own)
    words = {r: set(content_words(r)) for r in roots}
    qwords = {r: [(q, set(content_words(q))) for q in own[r]] for r in roots}
    rows = []
    for r in roots:
        shared = [q for o in roots if o != r for q, w in qwords[o] if w & words[r]]
        anyq = shared or [q for o in roots if o != r for q in own[o]]
        for q in own[r]:
            rows.append((r, q, 1, rng.choice(anyq)))
        for q in rng.sample(shared, min(len(shared), traps_per_question)):
            rows.append((r, q, 0, ""))
        for o in rng.sample([o for o in roots if o != r], 2):
            rows.append((r, rng.choice(own[o]), 0, ""))
    return rows


def suite_order(embed) -> float:
    """Pair accuracy on the suite's pre-retrieval decisions of a scorer ``embed(question, items) → scores``."""
    from branchgate.bench.common_sense import load

    right = total = 0.0
    for d in load("pre"):
        s = embed(d.question, d.items)
        rel = [v for v, r in zip(s, d.relevant) if r]
        irr = [v for v, r in zip(s, d.relevant) if not r]
        right += sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in rel for b in irr)
        total += len(rel) * len(irr)
    return round(right / total, 4)


def features(q: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.hstack([q * c, np.abs(q - c), (q * c).sum(1, keepdims=True)])


def probes(st, own: dict, rng: random.Random) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    def enc(xs):
        return np.asarray(st.encode(list(xs), batch_size=64, normalize_embeddings=True))

    out = {}
    for traps in (0, 3):
        rows = training_pairs(own, traps, random.Random(rng.random()))
        x = features(enc([r[0] for r in rows]), enc([r[1] for r in rows]))
        y = np.array([r[2] for r in rows])
        for name, clf in (
            ("lr", LogisticRegression(C=1.0, max_iter=3000)),
            ("mlp", MLPClassifier((256,), alpha=1e-3, max_iter=300, random_state=SEED)),
        ):
            clf.fit(x, y)

            def score(question, items, clf=clf):
                return clf.predict_proba(features(enc([question] * len(items)), enc(items)))[:, 1]

            out[f"probe_{name}_traps{traps}"] = suite_order(score)
        out[f"pairs_traps{traps}"] = len(rows)
    return out


def finetune(st, own: dict, epochs: int, rng: random.Random) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(SEED)
    rows = [r for r in training_pairs(own, 0, random.Random(rng.random())) if r[2] == 1]
    for p in st.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(list(st.parameters()), lr=2e-5)

    def emb(xs):
        return F.normalize(st(st.tokenize(xs))["sentence_embedding"], dim=-1)

    def cosine(question, items):
        with torch.no_grad():
            return (emb(items) @ emb([question]).T).ravel().numpy()

    out = {}
    order = list(range(len(rows)))
    for epoch in range(epochs):
        st.train()
        rng.shuffle(order)
        for b in range(0, len(order), 32):
            batch = [rows[i] for i in order[b : b + 32]]
            a = emb([r[0] for r in batch])
            c = emb([r[1] for r in batch] + [r[3] for r in batch])
            loss = F.cross_entropy(a @ c.T * 20.0, torch.arange(len(batch)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        st.eval()
        out[f"finetuned_epoch_{epoch + 1}"] = suite_order(cosine)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-pre", required=True)
    ap.add_argument("--real-read", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    from branchgate.models.encoder import Encoder

    torch.set_num_threads(2)
    rng = random.Random(SEED)
    own = real_pairs([a.real_pre, a.real_read])
    st = Encoder.load("packaged").st
    res = {"questions": len(own), "queries": sum(len(v) for v in own.values())}
    res["cosine"] = suite_order(
        lambda q, items: (
            np.asarray(st.encode(items, normalize_embeddings=True))
            @ np.asarray(st.encode([q], normalize_embeddings=True))[0]
        )
    )
    res.update(probes(st, own, rng))
    res.update(finetune(st, own, a.epochs, rng))
    text = json.dumps(res, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
