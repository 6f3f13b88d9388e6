"""`branchgate simulate`: run the reference deep-research pipeline and write canonical traces."""

from __future__ import annotations

import argparse
import os
import re
import sys

from branchgate.inference.options import deprecated_alias
from branchgate.pipeline.config import Config
from branchgate.pipeline.simulate import simulate

POLICY_HELP = (
    "none | <teacher>[:k=v,...] (mmr, grn, cd, dpp, sc, lexical, hybrid; e.g. mmr:threshold=0.4, "
    "sc:max_items=10) | random:RATE | gate:PATH[,tau=T] | shallow:NODES (pre only); run budgets (pre only, "
    "any policy): ,budget_nodes=N and/or ,budget_tokens=T (T or P%% of the query's --budget-reference run), "
    "gate:PATH,budget_tokens=T,defer=1 for deferral"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, help="environment folder (branchgate env build), or 'sample'")
    parser.add_argument(
        "--out", required=True, help="output folder (traces/, simulate.json, summary.json); reruns resume"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="number of runs (default: every query once); "
        "queries are taken in order and cycled with a new repetition index",
    )
    parser.add_argument(
        "--queries", default=None, metavar="FILE", help="query ids to run, one per line (or JSON lines with 'id')"
    )
    parser.add_argument(
        "--pre-policy", dest="pre", default="none", metavar="SPEC", help=f"pre-retrieval policy: {POLICY_HELP}"
    )
    parser.add_argument(
        "--read-policy",
        dest="read",
        default="none",
        metavar="SPEC",
        help="read stage: which hits new to the run of each search's result list to read, seen as snippets "
        "before any is read (skipped hits are not processed and may be offered again); none (default: read "
        "all) | <teacher>[:threshold=X,max_items=K,...] (each hit scored against the hits read before; "
        "max_items=K alone keeps the top K of each list) | random:RATE | gate:PATH[,tau=T][,floor=root] "
        "(a read controller); a list may be read not at all: the branch then ends",
    )
    parser.add_argument(
        "--snippet-words",
        type=int,
        default=20,
        metavar="N",
        help="a hit's snippet at the read stage: the first N words of its passage (default 20)",
    )
    parser.add_argument(
        "--post-policy",
        dest="post",
        default="none",
        metavar="SPEC",
        help="post-retrieval policy (same syntax, no shallow)",
    )
    parser.add_argument(
        "--synth-policy",
        dest="synth",
        default="none",
        metavar="SPEC",
        help="pre-synthesis policy (same syntax, no shallow)",
    )
    for stage in ("pre", "read", "post", "synth"):  # the old spellings, kept for one release (inference/options.py)
        deprecated_alias(parser, f"--{stage}", f"--{stage}-policy", stage)
    parser.add_argument(
        "--breadth", type=int, default=4, help="breadth at the first level; halves per level, floor 2 (default 4)"
    )
    parser.add_argument("--depth", type=int, default=3, help="tree depth (default 3)")
    parser.add_argument(
        "--oversample",
        type=float,
        default=1.5,
        help="candidates per frame = ceil(breadth × this), so choosing matters (default 1.5)",
    )
    parser.add_argument("--top-k", type=int, default=10, help="passages retrieved per subquery (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (with the run id)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes over queries (default 1)")
    parser.add_argument(
        "--retriever",
        choices=["bm25", "dense"],
        default="bm25",
        help="bm25 (default) or dense (needs `env build --dense` with the same --encoder)",
    )
    parser.add_argument(
        "--encoder", default="auto", help="encoder for teachers and dense retrieval (auto | packaged | id | dir)"
    )
    parser.add_argument(
        "--generator",
        choices=["offline", "chat"],
        default="offline",
        help="candidate generator: offline (deterministic, default) or chat (OpenAI-compatible endpoint)",
    )
    parser.add_argument("--llm-url", default=None, help="chat generator: base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--llm-model", default=None, help="chat generator: model name")
    parser.add_argument(
        "--budget-reference",
        default="",
        metavar="FILE",
        help="JSON {query id: {nodes, tokens}} (e.g. the unpruned runs' totals): what budget_*=P%% "
        "budgets are a share of",
    )
    parser.add_argument(
        "--protect",
        choices=["none", "plan"],
        default="none",
        help="plan: the root question's plan-search passages join the context as protected items, "
        "never removed by post-retrieval or pre-synthesis pruning (default none)",
    )
    parser.add_argument(
        "--shape",
        choices=["tree", "chain"],
        default="tree",
        help="tree (default: breadth halving per level) or chain: one candidate per decision and its "
        "follow-up the next, as a sequential agent (Search-o1, ReAct) searches; --depth searches",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    cfg = Config(
        breadth=args.breadth,
        depth=args.depth,
        oversample=args.oversample,
        top_k=args.top_k,
        seed=args.seed,
        pre=args.pre,
        read=args.read,
        post=args.post,
        synth=args.synth,
        generator=args.generator,
        retriever=args.retriever,
        encoder=args.encoder,
        budget_reference=args.budget_reference,
        protect=args.protect,
        shape=args.shape,
        snippet_words=args.snippet_words,
    )
    gen_kw = (
        {"base_url": args.llm_url, "model": args.llm_model, "api_key": os.environ.get("OPENAI_API_KEY")}
        if args.generator == "chat"
        else {}
    )
    s = simulate(
        args.env,
        cfg,
        args.out,
        runs=args.runs,
        queries_file=args.queries,
        workers=args.workers,
        gen_kw=gen_kw,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    if not s["n_runs"]:
        print("no run finished", file=sys.stderr)
        return 1
    m = lambda k: s[k]["mean"]  # noqa: E731
    reads = (  # runs written before the read stage have no read counts
        f"hits read {m('hits_read'):.1f} of {m('hits_offered'):.1f} offered in {m('search_calls'):.1f} searches, "
        if "hits_read" in s
        else ""
    )
    print(
        f"{s['n_runs']} runs in {args.out}: nodes {m('nodes'):.2f}, retrieval calls {m('retrieval_calls'):.2f}, "
        f"tokens {m('tokens') / 1000:.1f}k, KPR {m('kpr'):.3f} (before synthesis {m('kpr_before_synthesis'):.3f}), "
        f"{reads}wall {m('wall_s'):.2f}s/run; expansions adding ≥1 key point: {s['frac_expansions_with_gain'] or 0:.1%}"
    )
    for warning in stage_drops(s, {"pre": args.pre, "read": args.read, "post": args.post, "synth": args.synth}):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


# per stage: the summary's count of what the stage sees and of what it lets through
STAGE_COUNTS = {
    "pre": ("n_candidates", "n_expanded", "candidate sub-queries"),
    "read": ("hits_offered", "hits_read", "hits"),
    "post": ("n_evidence", "n_context", "passages read"),
    "synth": ("n_context", "n_final", "context passages"),
}


def stage_drops(summary: dict, specs: dict[str, str], limit: float = 0.9) -> list[str]:
    """A warning per stage whose policy runs at its default threshold (no threshold=, tau=, max_items= or budget
    in its spec) and drops more than ``limit`` of what it sees: its default is likely the wrong knob here."""
    out = []
    for stage, spec in specs.items():
        seen_key, kept_key, what = STAGE_COUNTS[stage]
        if spec in ("", "none") or re.search(r"\b(threshold|tau|max_items|budget_nodes|budget_tokens)=", spec):
            continue
        if seen_key not in summary or kept_key not in summary or not summary[seen_key]["mean"]:
            continue
        seen, kept = summary[seen_key]["mean"], summary[kept_key]["mean"]
        if 1 - kept / seen > limit:
            out.append(
                f"--{stage}-policy {spec} at its default threshold dropped {1 - kept / seen:.0%} of the {what} it saw "
                f"({kept:.1f} of {seen:.1f} a run kept); give it its knob: {_knob(spec)}"
            )
    return out


def _knob(spec: str) -> str:
    """How to loosen ``spec``: a gate's τ, a teacher's threshold or keep-top-k."""
    sep = "," if ":" in spec else ":"
    if spec.startswith("gate:"):
        return f"{spec}{sep}tau=T with T below the controller's τ"
    return f"{spec}{sep}threshold=T or {spec}{sep}max_items=K"
