"""The attack list (issue 23): each attack an adversarial review ran on the CLI, the clouds, the
hosts and the report, as one case here. Every case runs the real `actor-run` (or the real part at
the edge) and checks the promise it attacked: bad input is one line naming the field and exit 2,
a user's text reaches a shell only as data, no secret reaches any output, a delete kills only what
it started.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fakes.keys import client_key

CLI = [sys.executable, "-m", "actor_run"]
KEY = "rp_live_0123456789abcdef"  # what the echoing provider must never get us to print


def actor_run(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """Exit `code`, and stderr is one line (no traceback) holding every word."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def batch(tmp: Path, extra: str = "", *, job: str = "", policy: str = "", command: str = "echo hi") -> Path:
    path = tmp / "batch.toml"
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "t"
        command = {json.dumps(command)}
        seeds = [1]
        {job}
        [policy]
        poll_s = 0.2
        {policy}
        """) + extra)
    return path


# --- the echoing provider: its error bodies repeat the request's headers (the key) ----------------


class _Echo(BaseHTTPRequestHandler):
    status = 401

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        echo = json.dumps({"error": "bad request", "headers": dict(self.headers), "body": body}).encode()
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(echo)))
        self.end_headers()
        self.wfile.write(echo)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(params=[400, 401, 500])
def echo(request: pytest.FixtureRequest) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.status = request.param  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="echo-provider", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def everything_written(state: Path) -> str:
    """Every file under the state folder (ledger, logs), as text, and the ledger's rows."""
    texts = [p.read_bytes().decode(errors="replace") for p in state.rglob("*") if p.is_file()]
    ledger = state / "ledger.sqlite"
    if ledger.exists():
        con = sqlite3.connect(ledger)
        try:
            for (table,) in con.execute("select name from sqlite_master where type = 'table'").fetchall():
                texts += [repr(row) for row in con.execute(f'select * from "{table}"').fetchall()]
        finally:
            con.close()
    return "\n".join(texts)


def test_attack_a_provider_echoes_the_key_in_its_error_body(tmp_path: Path, echo: str) -> None:
    env = {"RUNPOD_API_KEY": KEY, "MY_GITHUB_PAT": "ghp_plain_named_value_42"}
    settings = f'[clouds.runpod]\napi_url = "{echo}"\nssh_key = "{client_key(tmp_path / "keys")}"\n'
    path = batch(tmp_path, "\n[[candidates]]\ncloud = \"runpod\"\ngpu = \"H100\"\n" + settings,
                 job='env = { GITHUB_PAT = "ghp_plain_named_value_42" }', policy="max_attempts = 1")
    check = actor_run(tmp_path, "clouds", "check", "--batch", str(path), "--state-dir", str(tmp_path / "state"),
                      env=env)
    assert check.returncode != 0
    assert "HTTP" in check.stdout + check.stderr  # the body was shown
    assert KEY not in check.stdout + check.stderr
    run = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                    str(tmp_path / "state"), env=env, timeout=180)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "HTTP" in run.stdout + run.stderr + everything_written(tmp_path / "state")  # the body was used
    for secret in (KEY, "ghp_plain_named_value_42"):
        assert secret not in run.stdout + run.stderr
        assert secret not in everything_written(tmp_path / "state")
        assert secret not in everything_written(tmp_path / "out")


# --- input reaches a shell only as data; bad input is one line naming the field -----------------


@pytest.mark.parametrize(("job", "policy", "field"), [
    ("env = { 'X=1; touch PWN; Y' = 'v' }", "", "job.env"),
    ("env = { MY-VAR = 'v' }", "", "job.env"),
    ("env = { '' = 'v' }", "", "job.env"),
    ("env = { ACTOR_RUN_OUT = '/tmp' }", "", "job.env"),
    ('env = { A = "x\\u0000y" }', "", "job.env.A"),
    ("timeout_s = inf", "", "job.timeout_s"),
    ("", "budget_usd = inf", "policy.budget_usd"),
    ("", "setup_grace_s = inf", "policy.setup_grace_s"),
    ("", "deadline_margin_s = inf", "policy.deadline_margin_s"),
    ("", "last_grace_factor = inf", "policy.last_grace_factor"),
    ("", "lost_after_s = inf", "policy.lost_after_s"),
    ("", "lost_after_s = 0.5", "policy.lost_after_s"),  # poll_s 0.2: less than three heartbeats
])
def test_attack_bad_input_is_refused_before_anything_starts(tmp_path: Path, job: str, policy: str, field: str) -> None:
    path = batch(tmp_path, job=job, policy=policy, command="touch PWN0")
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    one_line_error(done, 2, field)
    assert not list(tmp_path.rglob("PWN*"))


def test_attack_a_command_longer_than_an_exec_takes(tmp_path: Path) -> None:
    filler = "x" * (200 << 10)
    path = batch(tmp_path, command=f": {filler}\necho ran > \"$ACTOR_RUN_OUT/ran\"")
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "t" / "seed-1" / "out" / "ran").read_text() == "ran\n"


def test_attack_the_wrappers_own_variable_in_the_env(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = batch(tmp_path, job=f'env = {{ w = "{elsewhere}", pid = "1" }}',
                 command='echo "$w" > "$ACTOR_RUN_OUT/w"')
    done = actor_run(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), "--state-dir",
                     str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "t" / "seed-1" / "out" / "w").read_text() == f"{elsewhere}\n"
    assert list(elsewhere.iterdir()) == []  # the wrapper wrote its pid, log and response where it should


# --- the report: hostile names and paths are data, the timeline still draws ----------------------

PWN = "<svg onload=\"document.body.setAttribute('data-pwned','1')\"></svg>"
HOSTILE_REPORT = """\
[job]
name = "t"
command = "echo ok"
seeds = [1, 2]

[policy]
poll_s = 0.1
max_attempts = 2

[[candidates]]
cloud = "sim"
gpu = "H100"

[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.05

[[clouds.sim.regions]]
name = "<!--<script>"
gpus = { H100 = { stock = 1, hourly_usd = 1.0 } }

[[clouds.sim.regions]]
name = %s
gpus = { H100 = { stock = 1, hourly_usd = 1.0 } }
"""


def test_attack_the_report_of_hostile_names_and_paths(tmp_path: Path) -> None:
    from chromium import chromium_dom

    path = tmp_path / "batch.toml"
    path.write_text(HOSTILE_REPORT % json.dumps(PWN + "\u2028</script>&amp;"))
    state = ["--state-dir", str(tmp_path / "state")]
    done = actor_run(tmp_path, "run", str(path), "--json", "--out", "./{{data}}", *state)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[0])["run"]
    page = tmp_path / "report.html"
    made = actor_run(tmp_path, "report", run, "--out", str(page), *state)
    assert made.returncode == 0, made.stderr
    dom = chromium_dom(page, tmp_path / "chromium")
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    assert "data-pwned" not in body.group(0)  # no script of the data ran
    assert "<svg" not in dom  # nor any element made of it
    assert 'data-ready="1"' in dom  # the page's own script ran to its end
    assert sorted(re.findall(r'<div class="tl-row" data-job="([^"]+)"', dom)) == ["t/seed-1", "t/seed-2"]
    assert "/{{data}}" in dom  # the folder's name, shown as it is


ATTACKS: list[Callable[..., None]] = [
    test_attack_a_provider_echoes_the_key_in_its_error_body,
    test_attack_bad_input_is_refused_before_anything_starts,
    test_attack_a_command_longer_than_an_exec_takes,
    test_attack_the_wrappers_own_variable_in_the_env,
    test_attack_the_report_of_hostile_names_and_paths,
]
