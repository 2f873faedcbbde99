"""protocols/heldio.py: small file calls through libc with the GIL kept, with os's errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from protocols import heldio


def test_libc_is_called_on_linux() -> None:
    # the plain os fallback would pass every test below while bringing the convoy back
    assert heldio.HELD is sys.platform.startswith("linux")


def test_a_written_file_reads_back_and_is_truncated_when_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(200_000)  # several read chunks, NUL bytes included
    heldio.write_file(path, data)
    assert heldio.read_file(path) == data == path.read_bytes()
    heldio.write_file(path, b"short")
    assert path.read_bytes() == b"short"
    heldio.write_file(path, b"")
    assert heldio.read_file(path) == b""


def test_errors_are_os_errors_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such.txt"
    with pytest.raises(FileNotFoundError, match="such.txt"):
        heldio.read_file(missing)
    with pytest.raises(FileNotFoundError):
        heldio.write_file(missing, b"x")
    with pytest.raises(FileNotFoundError):
        heldio.unlink(missing)
    heldio.unlink(missing, missing_ok=True)
    with pytest.raises(FileNotFoundError):
        heldio.rename(missing, tmp_path / "elsewhere")


def test_makedirs_makes_every_level_and_accepts_a_folder_that_exists(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    heldio.makedirs(deep)
    assert deep.is_dir()
    heldio.makedirs(deep)  # exists already: fine
    (tmp_path / "a" / "file").write_bytes(b"x")
    with pytest.raises(OSError):  # a file in the way is not a folder
        heldio.makedirs(tmp_path / "a" / "file")
    with pytest.raises(OSError):
        heldio.makedirs(tmp_path / "a" / "file" / "below")


def test_rename_replaces_and_exists_follows_the_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"new")
    dst.write_bytes(b"old")
    heldio.rename(src, dst)
    assert not heldio.exists(src)
    assert heldio.exists(dst)
    assert dst.read_bytes() == b"new"
    heldio.unlink(dst)
    assert not heldio.exists(dst)


def test_write_all_appends_to_an_open_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        heldio.write_all(fd, b"one\n")
        heldio.write_all(fd, b"two\n" * 50_000)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"one\n" + b"two\n" * 50_000
    with pytest.raises(OSError):
        heldio.write_all(fd, b"closed")  # the descriptor is closed: EBADF
