"""protocols/hosts/scripts.py OOM_EVIDENCE: the wrapper's reader of the machine's own evidence that the
kernel's OOM killer ended a job, run by `sh` on the exact text the kernel writes. Each text is cited
from the kernel's source; a real OOM kill (a job in a memory cgroup of its own) is in
tests/supervisors/cli/test_verdict_oom_kill.py."""

# ruff: noqa: E501  (the kernel writes its lines whole: they are quoted exactly, not folded)
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from actor_run.protocols.hosts.scripts import OOM_EVIDENCE

# cgroup v2 memory.events after one OOM kill: mm/memcontrol.c memory_events_show() prints
# "low %lu", "high %lu", "max %lu", "oom %lu", "oom_kill %lu", "oom_group_kill %lu" (one a line;
# Documentation/admin-guide/cgroup-v2.rst, "memory.events")
MEMORY_EVENTS = "low 0\nhigh 0\nmax 27\noom 1\noom_kill 1\noom_group_kill 0\n"
# cgroup v1 memory.oom_control: mm/memcontrol-v1.c mem_cgroup_oom_control_read() prints
# "oom_kill_disable %d", "under_oom %d", "oom_kill %lu" (as this machine's kernel wrote it for a real kill)
OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
# one OOM kill in the kernel log (dmesg), from mm/oom_kill.c: dump_header()'s
# pr_warn("%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, oom_score_adj=%hd\n"),
# dump_oom_victim()'s pr_info("oom-kill:constraint=%s,nodemask=%*pbl", ...) with the memcg context
# pr_cont'ed, and __oom_kill_process()'s pr_err("%s: Killed process %d (%s) total-vm:%lukB,
# anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd\n"),
# where %s is "Out of memory" (the whole machine) or "Memory cgroup out of memory" (a cgroup's limit)
KERNEL_LOG = """\
[14275.479512] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[14275.479530] CPU: 1 UID: 0 PID: 20789 Comm: python3 Not tainted 6.18.44 #1
[14275.479783] [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name
[14275.479796] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=20789,uid=0
[14275.479814] Memory cgroup out of memory: Killed process 20789 (python3) total-vm:540844kB, anon-rss:65280kB, file-rss:6712kB, shmem-rss:0kB, UID:0 pgtables:192kB oom_score_adj:0
[14302.100201] Out of memory: Killed process 913 (trainer) total-vm:91234kB, anon-rss:80120kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:300kB oom_score_adj:0
"""
# lines that are not the OOM killer's (a job's own words in the kernel log must not count)
NOT_OOM = "[1.000] EXT4-fs (vda): mounted filesystem\n[2.000] memory: usage 65536kB, limit 65536kB, failcnt 412\n"


def _sh(script: str, stdin: str = "", path: str | None = None) -> str:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    done = subprocess.run(["sh", "-c", OOM_EVIDENCE + script], input=stdin, capture_output=True, text=True,
                          env=env, timeout=30, check=False)  # as the wrapper: a status is not read
    return done.stdout


def test_the_cgroup_counters_are_read_from_the_kernels_own_files(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS)
    (tmp_path / "memory.oom_control").write_text(OOM_CONTROL)
    assert _sh(f'oom_kills "{tmp_path}/memory.events"') == "1"
    assert _sh(f'oom_kills "{tmp_path}/memory.oom_control"') == "2"
    assert _sh(f'oom_kills "{tmp_path}/absent"') == "-"  # no such file (no cgroup of that version): nothing


def test_the_kernel_logs_newest_oom_killer_line_is_read_and_nothing_else() -> None:
    # the newest OOM killer line (the machine-wide kill's), as its checksum; the job's own words are none
    newest = KERNEL_LOG.splitlines()[-1]
    assert _sh("kernel_oom", KERNEL_LOG) == _sh("kernel_oom", newest + "\n" + NOT_OOM) != "-"
    assert _sh("kernel_oom", KERNEL_LOG) != _sh("kernel_oom", KERNEL_LOG.splitlines()[-2])
    assert _sh("kernel_oom", NOT_OOM) == "-"


def test_ooms_moves_when_the_kernel_log_gains_an_oom_kill(tmp_path: Path) -> None:
    """`ooms` as the wrapper runs it before and after the job, with `dmesg` printing what the kernel
    logged (a stand-in for the kernel's log, on PATH); the counts differ only once a kill is logged."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "kmsg"
    (bin_ / "dmesg").write_text(f'#!/bin/sh\ncat "{log}"\n')
    (bin_ / "dmesg").chmod(0o755)
    path = f"{bin_}:{os.environ['PATH']}"
    log.write_text(NOT_OOM)
    before = _sh("ooms", path=path)
    assert _sh("ooms", path=path) == before
    log.write_text(NOT_OOM + KERNEL_LOG)
    after = _sh("ooms", path=path)
    assert after != before
    assert _sh(f'oom_moved "{before}" "{after}" && echo moved') == "moved\n"
    assert _sh(f'oom_moved "{after}" "{after}" || echo still') == "still\n"


def _stand_in_dmesg(tmp_path: Path) -> tuple[Path, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "kmsg"
    (bin_ / "dmesg").write_text(f'#!/bin/sh\ncat "{log}"\n')
    (bin_ / "dmesg").chmod(0o755)
    return log, f"{bin_}:{os.environ['PATH']}"


def test_a_full_kernel_log_that_drops_an_old_oom_report_as_it_gains_a_new_one_still_moves(tmp_path: Path) -> None:
    """The kernel log is a ring: the report of a new kill pushes the oldest lines out, an old kill's among
    them, and the count of OOM lines stays the same. The reader still sees the new kill."""
    log, path = _stand_in_dmesg(tmp_path)
    old = KERNEL_LOG.replace("20789", "20001").replace("14275.", "13001.")
    new = KERNEL_LOG.replace("20789", "30555").replace("14275.", "15999.").replace("14302.", "16000.")
    log.write_text(old + NOT_OOM)
    before = _sh("ooms", path=path)
    log.write_text(NOT_OOM + new)  # as many OOM lines as before: the old report rotated out
    after = _sh("ooms", path=path)
    assert _sh(f'oom_moved "{before}" "{after}" && echo moved') == "moved\n", (before, after)


def test_a_kernel_log_that_lost_its_old_oom_lines_and_gained_none_is_no_evidence(tmp_path: Path) -> None:
    """A SIGKILL from elsewhere while the log turned over (its old OOM lines rotated out, none new): no OOM."""
    log, path = _stand_in_dmesg(tmp_path)
    log.write_text(KERNEL_LOG + NOT_OOM)
    before = _sh("ooms", path=path)
    log.write_text(NOT_OOM + NOT_OOM)
    after = _sh("ooms", path=path)
    assert after != before
    assert _sh(f'oom_moved "{before}" "{after}" || echo none') == "none\n", (before, after)
