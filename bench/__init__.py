"""``branchgate bench``: the whole held-out experiment in one command (see ``bench/cli.py``).

Modules: ``cli.py`` (the command), ``settings.py`` (the config read and checked; what every step shares),
``run_order.py`` (the steps in order, the report assembled), ``gate_steps.py`` (one label source's gate:
dataset, train, export, closed loop, offline and real scores), ``budget_step.py`` (the run-budgets step),
``steps.py`` (cached steps with fingerprints; intervals and offline metrics: ``training/stats.py``),
``sweeps.py`` (the closed-loop policy families and their sweeps), ``closed_loop.py``
(running them and pairing by query), ``report.py`` (report.json, report.md, the PNG), ``read_report.py`` (its
read-gate section). ``branchgate replay``: ``replay.py`` (the walk over a log), ``replay_cli.py``, ``replay_report.py``.
"""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
