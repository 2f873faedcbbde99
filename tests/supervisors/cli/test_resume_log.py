"""`actor-run resume` after a `kill -9` of `actor-run run` (issue 29.7): the reattached attempt's
log.txt holds the job's output once, under its header once and one takeover line, whatever the
killed controller had written of it and whatever the job printed while no controller watched; and
a resumer killed in its turn is resumed onto the same attempt (one takeover line each)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import CLI, run_cli
from support.waits import poll

ENV = {**os.environ, "NO_COLOR": "1"}
LINES = 40
# as a TOML basic string: lines 1-20 one each 0.05 s (the controller is killed among them), then,
# once the gate opens (after the resume took over: bounded, 120 s), lines 21-40
JOB = (r"""sh -c 'for i in $(seq 1 20); do echo line-$i; sleep 0.05; done; """
       r"""for i in $(seq 1 2400); do [ -e \"$GATE\" ] && break; sleep 0.05; done; """
       rf"""for i in $(seq 21 {LINES}); do echo line-$i; sleep 0.02; done'""")



def logged(out: Path) -> Path | None:
    """The seed's log.txt once it holds the job's third line."""
    found = [p for p in out.glob("*/lines/seed-1/log.txt") if p.parent.parent.parent.name != "latest"]
    return found[0] if found and "line-3\n" in found[0].read_text() else None



@pytest.mark.parametrize("cloud", ["local", "ssh"])
def test_resume_after_kill_9_writes_the_reattached_attempts_log_once(
        tmp_path: Path, cloud: str, request: pytest.FixtureRequest) -> None:
    gate = tmp_path / "gate"
    batch = tmp_path / "b.toml"
    batch.write_text(f'[job]\nname = "lines"\ncommand = "{JOB}"\nseeds = [1]\nenv = {{ GATE = "{gate}" }}\n'
                     "[policy]\npoll_s = 0.1\nlost_after_s = 60\n"
                     + (request.getfixturevalue("sshd").cloud_toml(tmp_path) if cloud == "ssh" else ""))
    common = ["--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "out")]
    proc = subprocess.Popen([*CLI, "run", str(batch), "--json", *common], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, cwd=tmp_path)
    try:
        log = poll(lambda: logged(tmp_path / "out"), 60, "the first lines in log.txt")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    # the job goes on printing with no controller watching, and after the resume took over
    resume = subprocess.Popen([*CLI, "resume", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV, cwd=tmp_path)
    try:
        poll(lambda: "taken over by controller" in log.read_text(), 60, "the takeover line")
        gate.touch()
        out, err = resume.communicate(timeout=120)
    finally:
        if resume.poll() is None:
            resume.kill()
            resume.communicate()
    assert resume.returncode == 0, out + err
    assert "lines/seed-1 (reattached)" in out
    text = log.read_text()
    run = log.parent.parent.parent.name
    body = [line for line in text.splitlines() if not line.startswith("--- ")]
    assert body == [f"line-{i}" for i in range(1, LINES + 1)], text
    headers = [line for line in text.splitlines() if line.startswith("--- ")]
    assert len(headers) == 2, text
    assert re.fullmatch(rf"--- run {run} attempt 0 on {cloud} .*---", headers[0]), text
    assert re.fullmatch(r"--- attempt 0 taken over by controller \S+ \(.*\); its log goes on from byte \d+ ---",
                        headers[1]), text


# lines 1-5, then 6-10 after GATE, then 11-15 after GATE2 (each wait bounded: 120 s)
TWICE = (r"""sh -c 'for i in 1 2 3 4 5; do echo line-$i; done; """
         r"""for i in $(seq 1 2400); do [ -e \"$GATE\" ] && break; sleep 0.05; done; """
         r"""for i in 6 7 8 9 10; do echo line-$i; done; """
         r"""for i in $(seq 1 2400); do [ -e \"$GATE2\" ] && break; sleep 0.05; done; """
         r"""for i in 11 12 13 14 15; do echo line-$i; done'""")


def test_a_resumer_killed_while_it_watches_is_resumed_again_onto_the_same_attempt(tmp_path: Path) -> None:
    """The adopter's own row of the machine says the job runs there (it said `launched` once the
    adopter reconnected, and the next resume ran the job again on a fresh machine)."""
    gate, gate2 = tmp_path / "gate", tmp_path / "gate2"
    batch = tmp_path / "b.toml"
    batch.write_text(f'[job]\nname = "lines"\ncommand = "{TWICE}"\nseeds = [1]\n'
                     f'env = {{ GATE = "{gate}", GATE2 = "{gate2}" }}\npublic_env = ["GATE", "GATE2"]\n'
                     "[policy]\npoll_s = 0.1\nlost_after_s = 60\n")
    common = ["--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "out")]
    procs = [subprocess.Popen([*CLI, "run", str(batch), "--json", *common], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=ENV, cwd=tmp_path)]
    try:
        log = poll(lambda: logged(tmp_path / "out"), 60, "the first lines in log.txt")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(30)  # reaped: a zombie's pid still looks alive to the resume
        procs.append(subprocess.Popen([*CLI, "resume", *common], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=ENV, cwd=tmp_path))
        poll(lambda: "taken over by controller" in log.read_text(), 60, "the first takeover line")
        gate.touch()
        poll(lambda: "line-10\n" in log.read_text(), 60, "line 10 in log.txt")
        procs[1].send_signal(signal.SIGKILL)  # the resumer dies too, while it watches
        procs[1].wait(30)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
    gate2.touch()
    again = run_cli(["resume", *common], timeout=120, env=ENV,
                           cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "lines/seed-1 (reattached)" in again.stdout
    text = log.read_text()
    assert [line for line in text.splitlines() if not line.startswith("--- ")] == [
        f"line-{i}" for i in range(1, 16)], text
    headers = [line.split(" (")[0] for line in text.splitlines() if line.startswith("--- ")]
    assert [h.split(" by ")[0] for h in headers] == [
        f"--- run {log.parent.parent.parent.name} attempt 0 on local this-computer", "--- attempt 0 taken over",
        "--- attempt 0 taken over"], text
