"""Content addressing: a code folder's snapshot and hash, an input's sha256.

The code is copied into a private snapshot first and hashed from the copy: a file saved while an
upload is under way changes the source, never the snapshot, so nothing is filed under a hash it
does not have. Links in the code folder are kept as links. What is never sent: `.git`, `.venv`
and caches (`_IGNORED`), and what the code folder's `.actor-runignore` and `.gitignore` list
(gitignore's patterns: `*.ckpt`, `data/`, `/build`, `logs/*.txt`; a `!` line is not read).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20
_IGNORED = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", "actor-run-out"}  # the last: `run`s results
IGNORE_FILES = (".actor-runignore", ".gitignore")


def ignore_rules(root: Path) -> list[str]:
    """The patterns of the ignore files at the code folder's top (comments, blanks and `!` lines left out)."""
    rules: list[str] = []
    for name in IGNORE_FILES:
        try:
            text = (root / name).read_text(errors="replace")
        except OSError:
            continue
        rules += [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith(("#", "!"))]
    return rules


def is_ignored(rel: str, is_dir: bool, rules: list[str]) -> bool:
    """Whether the path `rel` (relative to the code folder, `/`-separated) is left out of the code."""
    name = rel.rpartition("/")[2]
    if name in _IGNORED:
        return True
    for rule in rules:
        if rule.endswith("/") and not is_dir:
            continue
        pattern = rule.rstrip("/")
        if "/" in pattern:  # anchored at the folder's top
            if fnmatch.fnmatchcase(rel, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def _ignore_in(root: Path) -> Callable[[str, list[str]], set[str]]:
    """shutil.copytree's `ignore` for the code folder `root`."""
    rules = ignore_rules(root)

    def ignore(folder: str, names: list[str]) -> set[str]:
        base = Path(folder).relative_to(root).as_posix()
        out = set()
        for n in names:
            rel = n if base == "." else f"{base}/{n}"
            if is_ignored(rel, os.path.isdir(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n)),
                          rules):
                out.add(n)
        return out

    return ignore


def code_size(root: Path, stop_at: int | None = None) -> int:
    """The bytes of the code folder `root` as it would be sent (ignored paths left out); the walk
    stops once past `stop_at` (a home folder is not read whole to say it is too big)."""
    rules, total = ignore_rules(root), 0
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()

        def rel(n: str, base: str = base) -> str:
            return n if base == "." else f"{base}/{n}"

        dirnames[:] = [d for d in dirnames if not is_ignored(rel(d), True, rules)]
        for n in filenames:
            if is_ignored(rel(n), False, rules):
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, n))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
            if stop_at is not None and total > stop_at:
                return total
    return total


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
    shutil.copytree(src, dest, symlinks=True, ignore=_ignore_in(src))
    return tree_sha256(dest)


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
