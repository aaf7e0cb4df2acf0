"""The tests of the benchmark scripts import them as the scripts import each other (``import
gpu_table``, ``import common``): run as ``python bench/NAME.py``, a script's folder is first on
the path, so here it is put there too. Only these tests import ``bench/``; what other tests
share with the benchmarks is the testing kit, ``tests/testkit``."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
