"""Research probes (issue 22 and the speed probes): offline questions about the gate, not part of the product.

Not installed with branchgate (pyproject lists only ``branchgate.*`` packages). Run a probe from the repository
root as a module, e.g. ``python3 -m research.real_inputs DATASET TRACES``; its tests with
``python3 -m pytest research/tests``. What each probe found, with the command and commit that reproduce it, is in
docs/research/. ``research.common`` holds what several probes share.
"""
