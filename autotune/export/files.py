"""Every export is written atomically: to a temporary file in the same folder, then renamed."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomically(path: Path, data: dict) -> None:
    def write(f) -> None:
        json.dump(data, f, indent=2)
        f.write("\n")

    _write_atomically(path, write)


def write_text_atomically(path: Path, text: str) -> None:
    _write_atomically(path, lambda f: f.write(text))


def _write_atomically(path: Path, write) -> None:
    """Write to a temporary file in the same folder, then rename: an interrupted export never
    leaves a half-written file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only; a plain file is not
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
