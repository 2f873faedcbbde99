"""Files only the user may read (protocols/files.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from actor_run.protocols.files import write_private


def test_write_private_makes_the_whole_file_private_and_replaces_what_was_there(tmp_path: Path) -> None:
    path = tmp_path / "response.json"
    write_private(path, b'{"a": 1}\n' * 10_000)
    assert path.read_bytes() == b'{"a": 1}\n' * 10_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # an existing file, readable by others: made private, its content replaced whole
    write_private(path, b"short\n")
    assert path.read_bytes() == b"short\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    write_private(path, b"")
    assert path.read_bytes() == b""
