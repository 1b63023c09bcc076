"""Importing this puts benchmarks/ on sys.path, so that tests can import benchmarks/harness.py (the model zoo)."""

import sys
from pathlib import Path

_BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)
