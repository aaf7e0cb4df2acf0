"""The testing kit: what the tests and the benchmarks share, importable as ``testkit``.

- ``replay_table``: measured tables (the shared CSV format, ``bench/cpu_sweep.py``'s JSON), the
  table executor and the replayed search;
- ``strategies``: the baseline strategies the shipped ones are measured against;
- ``published_rows`` and ``published_memory``: the published A100 runs as step-time and memory
  rows (``tests/validation/data/published-a100``).

Tests import it because pytest puts ``tests/`` on the path (the rootdir conftest's folder, and
``tests/conftest.py``); the benchmarks because ``bench/common.py`` (or the script itself) puts
it there. No product module imports it: it is not in the packages pyproject.toml installs."""
