"""``autotune ARGS`` through ``autotune.cli.main.main`` in the test's own process, in a given
directory: for input refused before Ray starts, where an interpreter per case would only add its
own start (0.5-2.4 s each, with torch)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from autotune.cli.main import main


def run_in_process(capsys, monkeypatch, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The command's exit code, stdout and stderr, as ``subprocess.run`` would give them."""
    monkeypatch.chdir(cwd)
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["autotune", *args], code, out, err)
