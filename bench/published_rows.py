"""The published step-time rows moved to the testing kit, ``tests/testkit/published_rows.py``;
this name stays for ``bench/published_rank.py`` until it imports ``testkit.published_rows``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from testkit.published_rows import sc21_table1  # noqa: E402,F401
