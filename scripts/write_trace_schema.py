"""Regenerate ``logs_to_dataset/trace.schema.json`` from the event models after changing them.

python3 scripts/write_trace_schema.py
"""

from __future__ import annotations

from branchgate.fileio import atomic_write_text
from branchgate.logs_to_dataset.trace_schema import SCHEMA_FILE, schema_text

if __name__ == "__main__":
    print(atomic_write_text(SCHEMA_FILE, schema_text()))
