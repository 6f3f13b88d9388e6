"""Every bound branchgate puts on one input, in one place (core-safe: constants only).

A list or a number past its bound is refused with ``errors.LimitError`` (an ``InputError`` whose message names the
field, the bound and the constant here), never cut silently, except where a cap is part of a contract and what it
leaves out is counted (a dataset's decision points: the manifest's ``run_problems``; replay: ``replay.json``'s
``left_out``).

- ``MAX_ITEMS``: the items of one decision — its candidates or hits, and each list of its state (retained texts,
  texts read, read ids). ``Gate.select`` / ``TeacherGate.select`` (``inference.inputs``), ``branchgate gate``,
  ``branchgate serve`` (a 413) and budgeted runs refuse more; a dataset's decision point keeps the first
  ``MAX_CANDIDATES`` candidates (the rest counted), and so does replay.
- ``MAX_RETAINED``, ``MAX_CONTEXT``, ``MAX_EVIDENCE``, ``MAX_HITS``: what a dataset's decision point keeps
  (``logs_to_dataset.decision_points``, ``read_points``): the newest retained branches and context items, the first
  evidence items of a candidate and hits of a result list; what they leave out is counted.
- ``MAX_COUNT``: any count a log or a request gives — tokens, nodes, costs, spends, ranks, depths, orders. Past
  it (or negative) a trace event is a skipped line naming its file and line (``trace_schema``), a gate decision or
  a run state file an ``InputError`` naming the field. 10^12 tokens is far beyond any run, and sums of a million
  such counts stay exact in float64 and int64.
- ``MAX_TOTAL``: a number in a run state file (sums of counts such as the tokens a run spent): past it, or not
  finite, the file is refused, naming the field.
- ``MAX_BOOTSTRAP``: resamples of one bootstrap interval (``replay --bootstrap``).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

MAX_CANDIDATES = 256  # candidates (or hits) of one decision
MAX_ITEMS = MAX_CANDIDATES  # items of any list of one decision (candidates, hits, retained, read, read_ids)
MAX_RETAINED = 128  # retained branches (or texts read) a dataset's decision point keeps (the newest)
MAX_CONTEXT = 512  # evidence items in a decision point's context C_t (the newest)
MAX_EVIDENCE = 64  # evidence items of one candidate's E(c) (the first retrieved)
MAX_HITS = 64  # hits of one result list a read decision point keeps (the first, by rank)
MAX_COUNT = 10**12  # any count: tokens, nodes, costs, spends, ranks, depths, orders
MAX_TOTAL = 2**53  # a sum of counts kept across calls (a run state's spent tokens): exact in float64
MAX_BOOTSTRAP = 100_000  # bootstrap resamples of one interval
