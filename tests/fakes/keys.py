"""A client key pair for fake providers' machines (its public half is what the adapter sends)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def client_key(dir: Path) -> Path:
    """A fresh ed25519 key pair under `dir`: the private key's path (the public one beside it, .pub)."""
    dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = dir / "id_ed25519"
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "actor-run-test", "-f", str(path)],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return path
