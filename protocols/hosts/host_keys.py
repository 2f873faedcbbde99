"""Our own known-hosts file (OpenSSH format, so `ssh -o UserKnownHostsFile=<it>` agrees): a host's
key is pinned at the first successful login and held to afterwards (hosts/ssh.py says when), and
asyncssh's check of a host key against it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import asyncssh


def known_hosts_pattern(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class HostKeys:
    """Our own known-hosts file: first sight pins, a pinned address keeps its key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self, pattern: str) -> list[asyncssh.SSHKey]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        keys = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 3 or fields[0].startswith("#") or pattern not in fields[0].split(","):
                continue
            try:
                keys.append(asyncssh.import_public_key(f"{fields[1]} {fields[2]}"))
            except asyncssh.KeyImportError:
                continue
        return keys

    def trusted(self, address: str, port: int) -> list[asyncssh.SSHKey]:
        return self._read(known_hosts_pattern(address, port))

    def pin(self, address: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Pin `key` if the address has no key yet; False if it has another one (changed)."""
        pattern = known_hosts_pattern(address, port)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two controllers pinning at once write one line
            pinned = self._read(pattern)
            if pinned:
                return key in pinned
            algorithm, data = key.export_public_key("openssh").decode().split()[:2]
            os.write(fd, f"{pattern} {algorithm} {data}\n".encode())
            return True
        finally:
            os.close(fd)


class PinningClient(asyncssh.SSHClient):
    """Called by asyncssh for a host key that is not among the pinned ones: with none pinned for
    the address yet it is taken for this connection and pinned once the login succeeds (`seen`);
    with another one pinned it is refused (`changed_to`)."""

    def __init__(self, keys: HostKeys, address: str, port: int) -> None:
        self.keys, self.address, self.port = keys, address, port
        self.changed_to = ""  # the fingerprint of the key that replaced a pinned one
        self.seen: asyncssh.SSHKey | None = None  # the key to pin when the login succeeds

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        pinned = self.keys.trusted(self.address, self.port)
        if key in pinned:
            return True  # pinned by another connection since this one began (several logins to a new host at once)
        if pinned:
            self.changed_to = key.get_fingerprint()
            return False
        self.seen = key
        return True
