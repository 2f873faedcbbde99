"""Round trip of one command to an SSH host, three ways, against a loopback OpenSSH sshd:

  (a) spawning `ssh host true` (a new process and connection per command),
  (b) an asyncssh exec channel on an open connection (`conn.run("true")`: a new session each),
  (c) our SSHHost.run("true") (one long-lived remote sh on one channel: hosts/shell.py).

Prints a table, then as its last line one JSON object:
{"ssh_spawn_ms": a, "exec_channel_ms": b, "host_call_ms": c, "ratio": a / c, "host_call_cpu_ms": ...}
(the last: this process's CPU time per (c), both its threads: steadier than the wall time on a busy
machine). asyncssh runs on the asyncio loop beside the reactor (protocols/hosts/aio.py).

    python bench/host_rtt.py [--samples 40]
"""

from __future__ import annotations

import argparse
import json
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
from actor_run.protocols.hosts.ssh import SSHHost
from tests.support.sshd import Sshd


def spawn_ms(sshd: Sshd, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        subprocess.run([*sshd.ssh_args(), "true"], check=True, stdin=subprocess.DEVNULL)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def channel_and_host_ms(
    sshd: Sshd, known_hosts: Path, samples: int, cpu_ms: list[float],
) -> tuple[list[float], list[float]]:
    host = SSHHost("bench", sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
                   known_hosts=known_hosts)
    try:
        await host.run("true")  # connect, pin, start the shell
        conn = host._conn  # the same connection, for the exec-channel figure
        assert conn is not None
        loop = host._aio()
        exec_ms, host_ms = [], []
        for _ in range(3):
            await loop.run(conn.run, "true", check=True)
        for _ in range(samples):
            t = time.perf_counter()
            await loop.run(conn.run, "true", check=True)
            exec_ms.append((time.perf_counter() - t) * 1000)
        for _ in range(10):
            await host.run("true")
        cpu = time.process_time()
        for _ in range(samples * 5):
            t = time.perf_counter()
            res = await host.run("true")
            host_ms.append((time.perf_counter() - t) * 1000)
            assert res.exit_code == 0
        cpu_ms.append((time.process_time() - cpu) * 1000 / (samples * 5))
        return exec_ms, host_ms
    finally:
        await host.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory(prefix="actor-run-bench-") as tmp, Sshd(Path(tmp) / "sshd") as sshd:
        spawn = spawn_ms(sshd, args.samples)
        cpu_ms: list[float] = []  # this process's CPU per SSHHost.run, both threads (less noisy on a busy machine)

        async def measure() -> tuple[list[float], list[float]]:
            async with open_asyncio_loop():
                return await channel_and_host_ms(sshd, Path(tmp) / "known_hosts", args.samples, cpu_ms)

        exec_ms, host_ms = trio.run(measure)
    rows = [("(a) spawn `ssh host true`", spawn), ("(b) asyncssh exec channel", exec_ms),
            ("(c) SSHHost.run (persistent sh)", host_ms)]
    print(f"{'round trip of `true`':36} {'n':>5} {'median ms':>10} {'p10':>8} {'p90':>8}")
    for label, xs in rows:
        q = statistics.quantiles(xs, n=10)
        print(f"{label:36} {len(xs):5d} {statistics.median(xs):10.2f} {q[0]:8.2f} {q[-1]:8.2f}")
    a, b, c = (statistics.median(xs) for _, xs in rows)
    print(f"ratio a/c = {a / c:.0f}x (target >= 100); CPU of this process per (c): {cpu_ms[0]:.3f} ms")
    figures = {"ssh_spawn_ms": round(a, 3), "exec_channel_ms": round(b, 3), "host_call_ms": round(c, 3),
               "ratio": round(a / c, 1), "host_call_cpu_ms": round(cpu_ms[0], 3)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
