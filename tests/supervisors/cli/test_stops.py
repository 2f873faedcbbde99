"""How `actor-run` stops (issue 41), with real signals to real processes: SIGHUP (the terminal
closed) stops a controller as SIGTERM does, every machine deleted first; a Ctrl-C anywhere else
(`logs -f`, `status --follow`, the `[y/N]` question) is exit 130 and one line, never a traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support.cli_inproc import CLI
from support.process_kit import Output, sleeper, sleeping
from support.terminal import Terminal
from support.waits import poll
from test_detach import ENV, Place

from actor_run.protocols.clouds.sim import sim_machines

SLEEPER = sleeper("62.913")


def interrupt(args: list[str], ready: str, timeout: float = 90) -> tuple[int, str, str]:
    """Start `actor-run ARGS`, wait until its stdout says `ready`, send it SIGINT (Ctrl-C); its exit
    code, stdout and stderr."""
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = Output(proc.stdout), Output(proc.stderr)
    try:
        out.wait_for(ready, timeout)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, out.rest(), err.rest()


def test_sighup_to_a_foreground_run_deletes_every_machine_and_exits(tmp_path: Path) -> None:
    """Its terminal closed: the controller cancels, deletes both machines (0.5 s each) and exits
    as after SIGTERM (130), within 30 s."""
    batch = tmp_path / "b.toml"
    batch.write_text(SLEEPER)
    place = Place(tmp_path)
    proc = subprocess.Popen([*CLI, "run", str(batch), *place.common(), "--out", str(tmp_path / "out")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stderr is not None
    err = Output(proc.stderr)
    try:
        poll(place.both_running, 90, "two machines alive with their jobs running")
        assert len(sim_machines(place.state / "sim")) == 2
        proc.send_signal(signal.SIGHUP)
        began = time.monotonic()
        code = proc.wait(30)
        assert time.monotonic() - began < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.rest()
    assert code == 130, text
    assert "the terminal closed (SIGHUP); canceling; deleting every machine" in text
    assert "Traceback" not in text
    assert place.sim_left() == []
    assert {m.state for m in place.machines()} == {"deleted"}
    assert sleeping("62.913", tmp_path) == []


def test_sighup_to_resume_deletes_every_machine_and_exits(tmp_path: Path) -> None:
    """`actor-run resume` of a killed controller's run is a controller too: its terminal closing
    deletes the machines it took over."""
    place = Place(tmp_path)
    dead = subprocess.Popen([*CLI, "run", str(place.batch), *place.common(), "--out", str(tmp_path / "out")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        run = poll(place.both_running, 90, "both seeds running")[0].run
    finally:
        dead.kill()
        dead.wait()
    proc = subprocess.Popen([*CLI, "resume", run, *place.common()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = Output(proc.stdout), Output(proc.stderr)
    try:
        out.wait_for("resuming 2 job(s)", 90)
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.rest() + err.rest()
    assert code == 130, text
    assert "the terminal closed (SIGHUP)" in text
    assert "Traceback" not in text
    assert place.sim_left() == []
    assert {m.state for m in place.machines()} == {"deleted"}


def test_ctrl_c_to_logs_follow_and_status_follow_is_one_line(tmp_path: Path) -> None:
    """Both follow a run another controller runs (a foreground `run` here), each until Ctrl-C."""
    place = Place(tmp_path)
    controller = subprocess.Popen([*CLI, "run", str(place.batch), *place.common(), "--out", str(tmp_path / "out")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        run = poll(place.both_running, 90, "both seeds running")[0].run
        common = ["--run", run, *place.common()]
        code, out, err = interrupt(["logs", "t/1", "-f", *common], "hi 1")
        assert code == 130, out + err
        assert err == "actor-run: interrupted\n"
        code, out, err = interrupt(["status", "--follow", "--poll", "0.2", *common], "t/seed-1")
        assert code == 130, out + err
        assert err == "actor-run: interrupted\n"
        controller.send_signal(signal.SIGINT)
        assert controller.wait(60) == 130
    finally:
        if controller.poll() is None:  # a failed test: its machines deleted all the same
            controller.send_signal(signal.SIGINT)
            try:
                controller.wait(60)
            except subprocess.TimeoutExpired:
                controller.kill()
                controller.wait()
    assert place.sim_left() == []


@pytest.mark.parametrize("command", ["offers", "plan"])
def test_ctrl_c_while_waiting_on_a_cloud_is_one_line(tmp_path: Path, command: str) -> None:
    """A provider that takes the connection and never answers (a real socket on 127.0.0.1):
    `offers` and `plan` wait on it (up to a minute) until Ctrl-C."""
    batch = tmp_path / "b.toml"
    batch.write_text('[job]\nname = "t"\ncommand = "true"\nseeds = [1]\n\n'
                     '[[candidates]]\ncloud = "runpod"\ngpu = "H100"\n')
    args = ["offers", "--cloud", "runpod"] if command == "offers" else ["plan", str(batch)]
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(90)
        user = tmp_path / "user.toml"
        user.write_text(f'[clouds.runpod]\napi_url = "http://127.0.0.1:{server.getsockname()[1]}"\n'
                        f'ssh_key = "{tmp_path}/no-such-key"\n')
        proc = subprocess.Popen([*CLI, *args, "--config", str(user), "--state-dir",
                                 str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**ENV, "RUNPOD_API_KEY": "rp-test-key"})
        try:
            conn, _ = server.accept()  # it asked, and waits for the answer
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, out + err
    assert err == "actor-run: interrupted\n"


def test_ctrl_c_at_the_confirmation_question_is_one_line(tmp_path: Path) -> None:
    """`run` on a terminal (a pty as its stdin, stdout and stderr) asks `[y/N]` above the user's
    confirm_above_usd; a Ctrl-C there starts nothing and ends the question's line with one line."""
    place = Place(tmp_path)
    user = tmp_path / "user.toml"
    user.write_text("confirm_above_usd = 0.0001\n")
    with Terminal([*CLI, "run", str(place.batch), "--config", str(user), *place.common(), "--out",
                   str(tmp_path / "out")], env=ENV) as term:
        term.wait_for("[y/N]", 120)
        term.proc.send_signal(signal.SIGINT)
        code = term.wait(120)  # all it wrote read while it ends: a writer to a full pty would wait on us
    text = term.text()
    assert code == 130, text
    assert text.split("[y/N] ", 1)[1] == "\r\nactor-run: interrupted\r\n", text
    assert not (tmp_path / "out").exists()
    assert not place.ledger.exists()
