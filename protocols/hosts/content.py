"""Content addressing: a code folder's snapshot and hash, an input's sha256.

The code is copied into a private snapshot first and hashed from the copy: a file saved while an
upload is under way changes the source, never the snapshot, so nothing is filed under a hash it
does not have. Links in the code folder are kept as links.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

CHUNK = 1 << 20
_IGNORED = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache"}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_sha256(root: Path) -> str:
    """Sorted relative paths, kinds and bytes: two folders with the same tree hash are the same."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                h.update(b"L\0" + rel.encode() + b"\0" + os.readlink(p).encode() + b"\0")
            elif stat.S_ISREG(st.st_mode):
                h.update(b"F\0" + rel.encode() + b"\0" + (b"x" if st.st_mode & 0o100 else b"-") + b"\0")
                h.update(bytes.fromhex(file_sha256(p)))
    return h.hexdigest()


def input_sha256(path: Path) -> str:
    return tree_sha256(path) if path.is_dir() else file_sha256(path)


def snapshot_code(src: Path, dest: Path) -> str:
    """Copy `src` into `dest` (which must not exist) and return the hash of the copy."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(*_IGNORED))
    return tree_sha256(dest)


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
