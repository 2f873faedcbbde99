"""tests/support/pg.py keeps one initdb'd cluster to copy; a kept folder another account could write to is
not trusted (a planted cluster's configuration would run as the tests' PostgreSQL)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from support.pg import _template


def test_a_kept_folder_others_may_write_to_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    home = tmp_path / f"actor-run-pg-initdb-{os.geteuid()}"
    home.mkdir()
    home.chmod(0o777)
    assert _template([]) is None
    assert list(home.iterdir()) == []  # nothing made, nothing taken from it
