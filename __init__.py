"""branchgate: a learned pre-retrieval controller for deep-research agents.

Installed, the repository's folders import as ``branchgate.<folder>``:
``logs_to_dataset``, ``data``, ``models``, ``training``, ``inference``, ``pipeline``.
"""

# Every module below this one refuses to be imported under any name but branchgate.<folder>.<module> (pytest
# imports this file itself under the checkout's folder name, which is harmless: it defines only the version).
__version__ = "0.1.0"
