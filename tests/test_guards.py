"""Issue 48, items 5-10, through the CLI as a user runs it: bad values refused before anything
starts, a sweep that proves before it closes, Ctrl-C that stops renting at once, secrets in every
encoding, a job's escape sequences never obeyed by the terminal, `actor-run ssh` with the job's own
settings."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from fakes.keys import client_key
from support.cli_inproc import run_cli
from support.sshd import Sshd
from support.terminal import Terminal

CLI = [sys.executable, "-m", "actor_run"]
KEY = 'rp_live/0123+4567"89abcdef=='  # a key with characters every encoding spells differently


def actor_run(tmp: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli(args, timeout=timeout, cwd=tmp, env={**os.environ, "NO_COLOR": "1", **(env or {})})


def batch(tmp: Path, extra: str = "", *, job: str = "", policy: str = "", command: str = "echo hi",
          seeds: str = "[1]") -> Path:
    path = tmp / "batch.toml"
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "t"
        command = {json.dumps(command)}
        seeds = {seeds}
        {job}
        [policy]
        poll_s = 0.2
        {policy}
        """) + extra)
    return path


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# --- 5: every number has a range that fits where it goes; names without separators -----------------


@pytest.mark.parametrize(("job", "policy", "seeds", "field"), [
    ("", "", "[1, 2, 9223372036854775808]", "job.seeds[2]"),  # 2**63: an OverflowError in the ledger's thread
    ("", "", "[-9223372036854775808]", "job.seeds[0]"),
    ("timeout_s = 1e308", "", "[1]", "job.timeout_s"),  # 300-digit machine names
    ("max_usd = 1e300", "", "[1]", "job.max_usd"),
    ("", "budget_usd = 1e300", "[1]", "policy.budget_usd"),
    ("", "setup_grace_s = 1e12", "[1]", "policy.setup_grace_s"),
    ("", "max_attempts = 9223372036854775807", "[1]", "policy.max_attempts"),
    ("", "concurrency = 9223372036854775807", "[1]", "policy.concurrency"),
])
def test_numbers_past_their_range_are_exit_2_naming_the_field(tmp_path: Path, job: str, policy: str, seeds: str,
                                                             field: str) -> None:
    path = batch(tmp_path, job=job, policy=policy, seeds=seeds, command="touch PWN")
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    one_line_error(done, field)
    assert not list(tmp_path.rglob("PWN"))


def test_an_ssh_host_named_with_a_slash_is_exit_2(tmp_path: Path) -> None:
    path = batch(tmp_path, '\n[[candidates]]\ncloud = "ssh"\n[clouds.ssh.hosts."gpu/1"]\naddress = "127.0.0.1"\n')
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    one_line_error(done, "clouds.ssh.hosts", "gpu/1")


def test_a_candidate_host_with_a_control_character_is_exit_2(tmp_path: Path) -> None:
    path = batch(tmp_path, '\n[[candidates]]\ncloud = "ssh"\nhosts = ["a\\u001bb"]\n'
                           '[clouds.ssh.hosts.a]\naddress = "127.0.0.1"\n')
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    one_line_error(done, "candidates[0].hosts[0]")


@pytest.mark.parametrize("grace", ["-1", "nan", "inf", "-100000", "1e300"])
def test_sweep_grace_is_a_finite_number_at_least_0(tmp_path: Path, grace: str) -> None:
    done = actor_run(tmp_path, "sweep", "--dry-run", f"--grace={grace}", "--state-dir", str(tmp_path / "state"))
    one_line_error(done, "--grace")


@pytest.mark.parametrize(("args", "flag"), [
    (["run", "b.toml", "--concurrency", "99999999999"], "--concurrency"),
    (["cancel", "t", "--wait", "nan"], "--wait"),
    (["logs", "t", "--attempt", "-1"], "--attempt"),
])
def test_command_line_numbers_have_ranges(tmp_path: Path, args: list[str], flag: str) -> None:
    done = actor_run(tmp_path, *args, "--state-dir", str(tmp_path / "state"))
    one_line_error(done, flag)


# --- 8: secrets in every encoding; no key across origins; a clean environment for local jobs -------


class _Spelling(BaseHTTPRequestHandler):
    """A provider whose error body spells the key it was sent URL-encoded, JSON-escaped, in base64."""

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        auth = self.headers.get("authorization", "").removeprefix("Bearer ")
        body = json.dumps({"error": "bad key", "url": f"https://x.example/?key={quote(auth, safe='')}",
                           "echo": auth, "basic": base64.b64encode(f"user:{auth}".encode()).decode(),
                           "start": auth[:12] + "..."}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        return None


class _Redirect(BaseHTTPRequestHandler):
    """Every request is sent on to another origin (307: the same method, the same body)."""

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(307)
        self.send_header("location", f"{self.server.to}{self.path}")  # type: ignore[attr-defined]
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        return None


class _Recorder(BaseHTTPRequestHandler):
    """The other origin: records every request's headers, answers 401."""

    def _answer(self) -> None:
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        self.send_response(401)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    made: list[ThreadingHTTPServer] = []
    threads: list[threading.Thread] = []
    yield made
    for server in made:
        server.shutdown()
        server.server_close()
    for t in threads:
        t.join(10)


def serve(made: list[ThreadingHTTPServer], handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, name="fake-provider", daemon=True).start()
    made.append(server)
    return server


def written(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_the_key_in_any_encoding_of_an_error_body_reaches_no_output(tmp_path: Path,
                                                                    servers: list[ThreadingHTTPServer]) -> None:
    server = serve(servers, _Spelling)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings = f'[clouds.runpod]\napi_url = "{url}"\nssh_key = "{client_key(tmp_path / "keys")}"\n'
    path = batch(tmp_path, "\n[[candidates]]\ncloud = \"runpod\"\ngpu = \"H100\"\n" + settings,
                 policy="max_attempts = 1\ncapacity_wait_s = 0")
    env = {"RUNPOD_API_KEY": KEY}
    run = actor_run(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                    str(tmp_path / "state"), env=env, timeout=180)
    shown = run.stdout + run.stderr + written(tmp_path / "state") + written(tmp_path / "out")
    assert "HTTP 401" in shown  # the body was used
    forms = {KEY, quote(KEY, safe=""), json.dumps(KEY)[1:-1], KEY[:12],
             base64.b64encode(f"user:{KEY}".encode()).decode()[8:-4]}
    for form in forms:
        assert form not in shown, form


def test_a_redirect_to_another_origin_never_carries_the_api_key_header(tmp_path: Path,
                                                                       servers: list[ThreadingHTTPServer]) -> None:
    elsewhere = serve(servers, _Recorder)
    elsewhere.seen = []  # type: ignore[attr-defined]
    provider = serve(servers, _Redirect)
    provider.to = f"http://127.0.0.1:{elsewhere.server_address[1]}"  # type: ignore[attr-defined]
    path = batch(tmp_path, f'\n[[candidates]]\ncloud = "hyperstack"\ngpu = "H100"\n[clouds.hyperstack]\n'
                           f'api_url = "http://127.0.0.1:{provider.server_address[1]}"\n'
                           f'ssh_key = "{client_key(tmp_path / "keys")}"\n')
    done = actor_run(tmp_path, "clouds", "check", "hyperstack", "--batch", str(path), "--state-dir",
                     str(tmp_path / "state"), env={"HYPERSTACK_API_KEY": "hs-0123456789abcdef-key"})
    assert done.returncode != 0
    seen = elsewhere.seen  # type: ignore[attr-defined]
    assert seen, done.stdout + done.stderr  # the redirect was followed ...
    for headers in seen:  # ... without the key
        assert "api_key" not in {k.lower() for k in headers}, headers
        assert "hs-0123456789abcdef-key" not in json.dumps(headers)


def test_a_short_key_is_refused_as_a_key(tmp_path: Path) -> None:
    path = batch(tmp_path, '\n[[candidates]]\ncloud = "runpod"\ngpu = "H100"\n'
                           f'[clouds.runpod]\nssh_key = "{client_key(tmp_path / "keys")}"\n')
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"), env={"RUNPOD_API_KEY": "abc1"})
    one_line_error(done, "clouds.runpod.api_key_env")


def test_a_local_job_gets_none_of_the_controllers_secrets(tmp_path: Path) -> None:
    path = batch(tmp_path, job='env = { MINE = "given" }', command="env")
    env = {"RUNPOD_API_KEY": KEY, "PGPASSWORD": "pg-secret-password-1", "LAMBDA_API_KEY": "lambda-secret-0001"}
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"), env=env)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "out" / "latest" / "t" / "seed-1" / "log.txt").read_text()
    assert "MINE=given" in log  # the batch's env is there ...
    assert "PATH=" in log
    for name in ("RUNPOD_API_KEY", "PGPASSWORD", "LAMBDA_API_KEY"):  # ... the controller's is not
        assert name not in log, log


# --- 9: a job's escape sequences are shown, never obeyed ------------------------------------------

OSC52 = "\x1b]52;c;ZXZpbA==\x07"
CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"


def read_pty(args: list[str], env: dict[str, str], cwd: Path) -> bytes:
    """What `actor-run ARGS` writes to a terminal (a pseudo-terminal), all of it, bounded: 60 s."""
    with Terminal([*CLI, *args], env=env, cwd=cwd, stdin=False) as term:
        term.wait(60)
    return bytes(term.raw)

def test_escape_sequences_in_a_jobs_output_never_reach_a_terminal_raw(tmp_path: Path) -> None:
    progress = '{"stage": "s\\\\u001b[2J", "k\\\\u001b]52;c;QQ==\\\\u0007": 1}'
    command = f"printf '{OSC52}{CLEAR}{TITLE}hello\\n'; printf '{progress}\\n' > \"$ACTOR_RUN_PROGRESS\""
    path = batch(tmp_path, command=command)
    env = {**os.environ, "NO_COLOR": "1"}
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "out" / "latest" / "t" / "seed-1" / "log.txt").read_bytes()
    assert OSC52.encode() in log  # the file keeps the job's bytes as they are
    for args in (["logs", "t"], ["status"], ["runs"]):
        shown = read_pty([*args, "--state-dir", str(tmp_path / "state")], env, tmp_path)
        assert b"\x1b]" not in shown, (args, shown)
        assert b"\x1b[2J" not in shown, (args, shown)
        if args[0] == "logs":
            assert b"hello" in shown
            assert b"\\x1b]52;c;ZXZpbA==" in shown  # shown, made visible
    piped = actor_run(tmp_path, "logs", "t", "--state-dir", str(tmp_path / "state"))
    assert "\x1b" not in piped.stdout  # a pipe gets it inert too ...
    assert "\\x1b]52" in piped.stdout
    raw = actor_run(tmp_path, "logs", "t", "--raw", "--state-dir", str(tmp_path / "state"))
    assert OSC52 in raw.stdout  # ... unless it asks for the bytes as they are
    refused = read_pty(["logs", "t", "--raw", "--state-dir", str(tmp_path / "state")], env, tmp_path)
    assert b"--raw" in refused  # never to a terminal
    assert b"\x1b]" not in refused


def test_the_live_view_shows_a_progress_key_and_stage_inert(tmp_path: Path) -> None:
    progress = '{"stage": "s\\\\u001b]0;pwned\\\\u0007", "k\\\\u001b]52;c;QQ==\\\\u0007": 1, "step": 1}'
    # the job lives 6 s after its line: the view draws it within a poll and a frame, on a busy machine too
    # (a job of 2 s once ended before its line was drawn, in a full run)
    path = batch(tmp_path, command=f"printf '{progress}\\n' > \"$ACTOR_RUN_PROGRESS\"; sleep 6")
    shown = read_pty(["run", str(path), "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")],
                     {**os.environ, "COLUMNS": "200"}, tmp_path)
    assert b"52;c;QQ==" in shown  # the key was drawn ...
    assert b"\x1b]" not in shown  # ... with no OSC sequence of the job's reaching the terminal


# --- 7: Ctrl-C stops renting at once ----------------------------------------------------------------

MANY = """\
[job]
name = "many"
command = "true"
seeds = [1]

[policy]
concurrency = 100000
max_attempts = 1

[[candidates]]
cloud = "sim"
gpu = "H100"

[clouds.sim]
virtual = true
virtual_job_s = 600
launch_latency_s = 1.0
delete_latency_s = 0.01

[[clouds.sim.regions]]
name = "r"
gpus = { H100 = { stock = 100000, hourly_usd = 1.0 } }
"""
LAUNCH_LATENCY_S = 1.0


def test_ctrl_c_at_100000_queued_seeds_creates_nothing_after_the_signal(tmp_path: Path) -> None:
    """100,000 seeds, all allowed at once, on the sim's virtual machines: once machines are being
    made, SIGINT; no create starts after it (the sim's store dates each create: its start is
    `created_at` less the launch latency), every machine is deleted, exit 130."""
    import signal
    import time

    from support.waits import poll

    from actor_run.protocols.clouds.simstore import billing

    (tmp_path / "b.toml").write_text(MANY)
    sim = tmp_path / "state" / "sim"
    proc = subprocess.Popen([*CLI, "run", "b.toml", "--seeds", "1-100000", "--state-dir", str(tmp_path / "state"),
                             "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, start_new_session=True)
    try:
        poll(lambda: len(list((sim / "machines").glob("*.json"))) >= 20, 300, "machines being made")
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        took = time.time() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert not list((sim / "machines").glob("*.json"))  # every machine deleted
    bills = billing(sim)
    assert bills
    late = [b.name for b in bills if b.created_at - LAUNCH_LATENCY_S > signalled + 0.5]
    assert late == [], late  # no create started after the signal
    assert "not submitted (interrupted)" in err  # the seeds still queued were never submitted
    # 560 s at first, 80-266 s before the batch and the jobs looked at the run's stop themselves and
    # the summary stopped drawing a row per canceled job; README "Stopping" gives what the exit waits for
    assert took < 30, took


# --- 10: `actor-run ssh` with the job's own settings ------------------------------------------------

HOLD = (r"""sh -c 'for i in $(seq 1 1200); do [ -e \"$GATE\" ] && exit 0; sleep 0.1; done'""")


def ssh_run(tmp: Path, sshd: Sshd, name: str, host: str, root: Path, command: str, gate: Path) -> str:
    return f"""
[job]
name = "{name}"
command = "{command}"
seeds = [1]
env = {{ GATE = "{gate}" }}

[policy]
poll_s = 0.2

[[candidates]]
cloud = "ssh"
hosts = ["{host}"]

[clouds.ssh]
known_hosts = "{tmp / 'known_hosts'}"

[clouds.ssh.hosts.{host}]
address = "{sshd.address}"
port = {sshd.port}
user = "{sshd.user}"
key = "{sshd.user_key}"
root = "{root}"
"""


def test_ssh_uses_the_jobs_own_run_settings_when_another_run_used_another_host(tmp_path: Path, sshd: Sshd) -> None:
    from support.waits import poll

    gate = tmp_path / "gate"
    environ = {**os.environ, "NO_COLOR": "1"}
    (tmp_path / "a.toml").write_text(ssh_run(tmp_path, sshd, "a", "one", tmp_path / "root-a", HOLD, gate))
    (tmp_path / "b.toml").write_text(ssh_run(tmp_path, sshd, "b", "two", tmp_path / "root-b", "true", gate))
    state = ["--state-dir", str(tmp_path / "state")]
    first = subprocess.Popen([*CLI, "run", "a.toml", *state, "--out", str(tmp_path / "out")], cwd=tmp_path,
                             env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        poll(lambda: list((tmp_path / "root-a").glob("work/*/a/1/a0/pid")), 120, "run a's job started")
        second = actor_run(tmp_path, "run", "b.toml", *state, "--out", str(tmp_path / "out"))
        assert second.returncode == 0, second.stderr  # another run, another host: the newest settings now
        done = subprocess.run([*CLI, "ssh", "a/1", *state, "--", "pwd"], capture_output=True, text=True,
                              timeout=60, env=environ, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().startswith(str((tmp_path / "root-a").resolve())), done.stdout
    finally:
        gate.touch()
        try:
            first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()


# --- 6: a sweep proves before it closes -------------------------------------------------------------


def local_run(name: str, sandboxes: Path, command: str) -> str:
    return f"""
[job]
name = "{name}"
command = {json.dumps(command)}
seeds = [1]

[policy]
poll_s = 0.2

[[candidates]]
cloud = "local"

[clouds.local]
state_dir = "{sandboxes}"
"""


def test_a_plain_sweep_leaves_a_live_machines_row_open_that_its_batch_sweeps(tmp_path: Path) -> None:
    """Two runs of `local` under different settings (another sandbox folder); the second's controller
    is killed with its machine live. A plain sweep builds `local` from the first run's settings,
    which do not list that machine: the row stays open, saying which batch would ask; `sweep
    --batch` with the second run's batch finds the machine, its owner dead, and deletes it."""
    import signal

    from support.waits import poll

    from actor_run.supervisors.ledger import LedgerReader

    state = ["--state-dir", str(tmp_path / "state")]
    (tmp_path / "one.toml").write_text(local_run("one", tmp_path / "boxes-one", "true"))
    (tmp_path / "two.toml").write_text(local_run("two", tmp_path / "boxes-two", "sleep 600"))
    first = actor_run(tmp_path, "run", "one.toml", *state, "--out", str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    second = subprocess.Popen([*CLI, "run", "two.toml", *state, "--out", str(tmp_path / "out")], cwd=tmp_path,
                              env={**os.environ, "NO_COLOR": "1"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        poll(lambda: list((tmp_path / "boxes-two").glob("*/work/two/1/a0/pid")), 60, "run two's job started")
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(30)

    def alive() -> list[str]:
        reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
        try:
            return [m.name for m in reader.machines(alive_only=True)]
        finally:
            reader.close()

    machine = alive()
    assert len(machine) == 1
    plain = actor_run(tmp_path, "sweep", *state)
    assert plain.returncode == 0, plain.stderr
    assert alive() == machine, plain.stdout  # not closed as gone: its own settings were never asked
    assert "not proven gone" in plain.stdout
    assert "--batch" in plain.stdout
    assert list((tmp_path / "boxes-two").glob("*/work/two/1/a0/pid"))  # the machine lives
    swept = actor_run(tmp_path, "sweep", "--batch", "two.toml", *state)
    assert swept.returncode == 0, swept.stderr
    assert alive() == [], swept.stdout
    assert "deleted" in swept.stdout
    assert not list((tmp_path / "boxes-two").glob("*/work"))  # the sandbox is gone with it
