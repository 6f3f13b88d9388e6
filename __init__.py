"""branchgate: a learned pre-retrieval controller for deep-research agents.

Installed, the repository's folders import as ``branchgate.<folder>``:
``logs_to_dataset``, ``data``, ``models``, ``training``, ``inference``, ``pipeline``.
"""

__version__ = "0.1.0"
