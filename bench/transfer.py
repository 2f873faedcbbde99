"""Upload of a 256 MiB random file to a loopback OpenSSH sshd, two ways:

  (a) `rsync -rlt -e "ssh ..."` (the everyday tool, our pinned known-hosts file),
  (b) our upload: ShellWorkspace.publish_input over SSHHost (the have-check, the transfer, the
      sha256 check on arrival and the atomic publish),

then the same input published again (content-addressed: nothing should be sent).

Prints a table, then as its last line one JSON object:
{"rsync_mib_s": a, "ours_mib_s": b, "ratio": b / a, "second_upload_bytes": n}.

    python bench/transfer.py [--mib 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
from loguru import logger

from actor_run.protocols.hosts.aio import open_asyncio_loop
from actor_run.protocols.hosts.content import file_sha256
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.hosts.workspace import ShellWorkspace
from tests.support.sshd import Sshd


def make_file(path: Path, mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def rsync_once(sshd: Sshd, known_hosts: Path, src: Path, dest: Path) -> float:
    ssh = (f"ssh -p {sshd.port} -i {sshd.user_key} -o UserKnownHostsFile={known_hosts} "
           "-o StrictHostKeyChecking=yes -o BatchMode=yes")
    t = time.perf_counter()
    subprocess.run(["rsync", "-rlt", "-e", ssh, str(src), f"{sshd.user}@{sshd.address}:{dest}"], check=True)
    return time.perf_counter() - t


def new_host(sshd: Sshd, known_hosts: Path) -> SSHHost:
    return SSHHost("bench", sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
                   known_hosts=known_hosts)


async def pin(sshd: Sshd, known_hosts: Path) -> None:
    """Connect once: the host key goes into our known-hosts file, which rsync then holds to."""
    async with open_asyncio_loop():
        host = new_host(sshd, known_hosts)
        try:
            await host.run("true")
        finally:
            await host.aclose()


async def ours_once(
    sshd: Sshd, known_hosts: Path, src: Path, digest: str, root: Path, tag: str,
) -> tuple[float, int, int]:
    """Seconds of a first publish on a fresh root, its bytes, then the bytes of a second publish."""
    async with open_asyncio_loop():
        ws = ShellWorkspace(new_host(sshd, known_hosts), str(root))
        try:
            await ws.prepare()
            t = time.perf_counter()
            first = await ws.publish_input("data", src, digest, tag)
            seconds = time.perf_counter() - t
            again = await ws.publish_input("data", src, digest, tag + "-again")
            return seconds, first, again
        finally:
            await ws.aclose()


def measure(sshd: Sshd, tmp: Path, mib: int, runs: int) -> tuple[list[float], list[float], int, int]:
    """Seconds of each rsync and of each of our uploads; bytes of our first and second publish."""
    src = tmp / "input.bin"
    make_file(src, mib)
    digest = file_sha256(src)  # the caller hashes an input before it uploads it
    known_hosts = tmp / "known_hosts"
    trio.run(pin, sshd, known_hosts)
    rsync_s: list[float] = []
    ours_s: list[float] = []
    sent_first = sent_again = -1
    for i in range(runs):  # interleaved: a slow spell of the machine falls on both sides
        dest, root = tmp / f"rsync{i}", tmp / f"root{i}"
        rsync_s.append(rsync_once(sshd, known_hosts, src, dest))
        seconds, sent_first, sent_again = trio.run(ours_once, sshd, known_hosts, src, digest, root, f"run{i}")
        ours_s.append(seconds)
        dest.unlink()
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)  # published objects are read-only
        shutil.rmtree(root)
    return rsync_s, ours_s, sent_first, sent_again


def report(mib: int, rsync_s: list[float], ours_s: list[float], sent_first: int, sent_again: int) -> None:
    a = mib / statistics.median(rsync_s)
    b = mib / statistics.median(ours_s)
    print(f"{'upload of ' + str(mib) + ' MiB':40} {'median s':>9} {'MiB/s':>8}   runs (s)")
    print(f"{'(a) rsync -rlt -e ssh':40} {statistics.median(rsync_s):9.2f} {a:8.1f}   "
          + " ".join(f"{x:.2f}" for x in rsync_s))
    print(f"{'(b) ours: publish_input over SSHHost':40} {statistics.median(ours_s):9.2f} {b:8.1f}   "
          + " ".join(f"{x:.2f}" for x in ours_s))
    print(f"ratio b/a = {b / a:.2f} (target >= 0.9); a first publish sent {sent_first} bytes")
    print(f"a second publish of the same input sent {sent_again} bytes (target 0)")
    print(json.dumps({"rsync_mib_s": round(a, 1), "ours_mib_s": round(b, 1), "ratio": round(b / a, 2),
                      "second_upload_bytes": sent_again}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="median of this many runs each")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory(prefix="actor-run-bench-") as tmp, Sshd(Path(tmp) / "sshd") as sshd:
        figures = measure(sshd, Path(tmp), args.mib, args.runs)
    report(args.mib, *figures)


if __name__ == "__main__":
    main()
