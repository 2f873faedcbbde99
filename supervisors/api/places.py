"""Where a Runner keeps things on disk: the state folder (private: 0700) and the default ledger in
it, a run's short id, and the results folder, made and written to before anything starts."""

from __future__ import annotations

import contextlib
import os
import secrets
import uuid
from pathlib import Path

import platformdirs

from actor_run.protocols.failures import SpecError


def default_state_dir() -> Path:
    return Path(platformdirs.user_state_dir("actor-run"))


def default_ledger_path() -> Path:
    return default_state_dir() / "ledger.sqlite"


def new_run_id() -> str:
    """A run's short id: 8 hex digits."""
    return secrets.token_hex(4)


PROBE_BYTES = 4096


def check_out_dir(out_dir: Path) -> None:
    """Make the results folder and write to it (a few KiB, removed again): a file in its place, a
    read-only folder or a full disk is a SpecError naming `out_dir` before anything starts."""
    probe = out_dir / f".actor-run-probe-{uuid.uuid4().hex[:8]}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SpecError("out_dir", f"cannot write results in {out_dir}: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def private_dir(path: Path) -> None:
    """The state folder (ledger, logs, known hosts, sandboxes): made 0700, and made so if it was not."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError as exc:
        raise SpecError("state_dir", f"cannot use {path}: {exc.strerror}") from exc

