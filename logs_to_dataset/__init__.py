"""Agent run logs → canonical traces → decision dataset.

- ``trace_schema``: the canonical trace schema (typed events, ``parse_event``, ``json_schema``; ``trace.schema.json``);
- ``traces``: ``TraceWriter`` (append-only, flush per event), ``read_events`` (streaming, tolerant) and ``Run``;
- ``readers``: one reader per log format (canonical JSONL, Search-o1, GPT-Researcher, OpenInference) → runs;
- ``decision_points``: a run's decision points (retained branches, context C_t, E(c)) and ``split_key`` (the
  split itself: ``data.dataset_schema.split_of``);
- ``labels`` / ``label_sources``: rows with realized labels and per-teacher pre-retrieval scores; ``judge``: LLM
  labels;
- ``read_points`` / ``read_rows``: a run's read decision points (one per ``results`` event) and their rows, one
  per new hit (``dataset build --stage read``);
- ``build`` / ``build_cli``: ``branchgate dataset build``; ``build_report``: its manifest and messages;
  ``row_store``: its rows on disk and the final write.
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
