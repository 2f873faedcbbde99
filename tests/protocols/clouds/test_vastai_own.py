"""Vast.ai's own CLI (`vastai` 1.9.1 from PyPI, in a venv of its own that scripts/test.sh makes:
`.venv-vast`, or $ACTOR_RUN_VAST_PYTHON) pointed at the project's Vast fake (its `--url`): the fake
speaks what Vast's own client sends and expects (search offers, create with a label, show
instances, show instance, ssh-url and a real SSH login, change bid, destroy), held to Vast's
OpenAPI document all the while. A fake written to please our adapter would not pass this."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.keys import client_key
from fakes.providers import serve
from fakes.vastai import FakeVast
from support.waits import poll

ROOT = Path(__file__).resolve().parents[3]
PIN = "1.9.1"
DRIVER = ROOT / "tests" / "support" / "vast_own.py"  # the vendor's CLI, imported once per Vast (it says how)


@pytest.fixture(scope="module")
def vastai() -> Path:
    """Vast's venv's interpreter; its absence fails the test (scripts/test.sh always makes it)."""
    python = os.environ.get("ACTOR_RUN_VAST_PYTHON") or str(ROOT / ".venv-vast" / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(f"Vast's CLI venv is missing ({python}): scripts/test.sh makes it (vastai=={PIN}), or set "
                    f"ACTOR_RUN_VAST_PYTHON")
    return Path(python)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVast]:
    yield from serve("vastai", tmp_path)


class Vast:
    """`vastai --url <fake> --api-key <key> ...`, with a home of its own (its caches). Each command is
    the vendor's console script's `sys.exit(main())` run in one process of Vast's venv started with
    that home (tests/support/vast_own.py: an import of about 1.7 s of CPU once, not per command); the
    installed version (the pin) is what that process first says."""

    def __init__(self, python: Path, url: str, home: Path, gpu_names: list[str]) -> None:
        self.url = url
        self.command = python.with_name("vastai")
        home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".state"),
                    "XDG_DATA_HOME": str(home / ".local")}
        self.env.pop("VAST_URL", None)
        # the CLI's own day-long cache of Vast's GPU names (cli/util.py _get_gpu_names): without it every
        # run's import of its instances module asks https://console.vast.ai (not --url) for the list
        cache = home / ".cache" / "vastai" / "gpu_names_cache.json"
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"gpu_names": gpu_names}))
        self.process = subprocess.Popen([str(python), str(DRIVER), str(self.command)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=self.env)
        self.buffer = b""
        try:
            hello = self._answer(180)
            assert hello.get("version") == PIN, hello
        except BaseException:
            self.close()
            raise

    def _answer(self, timeout: float) -> Any:
        """The driver's next line, within `timeout` s."""
        assert self.process.stdout is not None
        end = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"Vast's CLI driver gave no answer within {timeout} s")
                if sel.select(left):
                    chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                    if not chunk:
                        raise AssertionError(f"Vast's CLI driver ended (exit {self.process.wait(30)})")
                    self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vastai *args`: its exit status and output as a fresh process's under subprocess.run(text=True)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"argv": list(args)}).encode() + b"\n")
        self.process.stdin.flush()
        done = self._answer(180)
        assert done["left"] == [], done["left"]  # what a fresh process's exit would have cleaned up

        def text(s: str) -> str:
            return s.encode("utf-8", "surrogateescape").decode().replace("\r\n", "\n").replace("\r", "\n")

        return subprocess.CompletedProcess([str(self.command), *args], done["code"], text(done["stdout"]),
                                           text(done["stderr"]))

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(*args, "--url", self.url, "--api-key", "test-key")

    def json(self, *args: str) -> Any:
        done = self(*args, "--raw")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the driver ends at the end of its input
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def vast(tmp_path: Path, fake: FakeVast, vastai: Path) -> Iterator[Vast]:
    v = Vast(vastai, fake.url, tmp_path / "home", sorted({a["gpu_name"] for a in fake.asks.values()}))
    try:
        yield v
    finally:
        v.close()


def test_vast_s_own_cli_searches_creates_shows_logs_in_and_destroys_on_the_fake(
        tmp_path: Path, fake: FakeVast, vast: Vast) -> None:
    offers = vast.json("search", "offers", "gpu_name=A100_SXM4 num_gpus=1")
    ids = {o["id"] for o in offers}
    assert {24817000, 24817001, 24817002, 24817003} <= ids  # the CLI's `_` read as a space: "A100 SXM4"
    assert 24817004 not in ids  # unverified: the CLI's default filter, applied by the fake
    assert all(o["gpu_name"] == "A100 SXM4" for o in offers)

    key = client_key(tmp_path / "keys")
    added = vast("create", "ssh-key", key.with_name(key.name + ".pub").read_text().strip())
    assert added.returncode == 0, added.stdout + added.stderr
    made = vast.json("create", "instance", "24817001", "--image", "ubuntu:22.04", "--disk", "16", "--ssh", "--direct",
                     "--label", "cli-made")
    assert made["success"] is True
    instance = int(made["new_contract"])
    assert fake.created[-1]["runtype"] == "ssh_direc ssh_proxy"  # what the CLI really sends (vastai.md §2.3)
    assert fake.created[-1]["label"] == "cli-made"

    def running() -> Any:
        shown = vast.json("show", "instance", str(instance))
        return shown if shown and shown.get("actual_status") == "running" else None

    shown = poll(running, 60, "the instance to run", every=0.2)
    assert shown["label"] == "cli-made"
    listed = vast.json("show", "instances")
    assert [(i["id"], i["label"]) for i in listed] == [(instance, "cli-made")]
    assert listed[0]["public_ipaddr"] == fake.instances[instance]["public_ipaddr"].strip()  # the CLI strips (§2.4)

    url = vast("ssh-url", str(instance)).stdout.strip()
    host, port = url.removeprefix("ssh://").split("@", 1)[1].rsplit(":", 1)
    assert (host, int(port)) == (fake.instances[instance]["_address"], fake.instances[instance]["_port"])
    fake.boxes.open_now()
    login = poll(lambda: (r := subprocess.run(
        ["ssh", "-i", str(key), "-p", port, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"{fake.boxes.user}@{host}", "echo up"],
        capture_output=True, text=True, timeout=60)).returncode == 0 and r, 60, "an SSH login", every=0.2)
    assert login.stdout.strip() == "up"  # the key the CLI registered reached the instance made after it

    bid = vast.json("create", "instance", "24817002", "--image", "ubuntu:22.04", "--disk", "16", "--ssh", "--direct",
                    "--label", "cli-bid", "--bid_price", "0.6")
    assert fake.instances[int(bid["new_contract"])]["is_bid"] is True
    changed = vast("change", "bid", str(bid["new_contract"]), "--price", "0.7")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    for made_id in (instance, int(bid["new_contract"])):
        gone = vast("destroy", "instance", str(made_id), "-y")
        assert gone.returncode == 0, gone.stdout + gone.stderr
    assert fake.alive() == []
    assert vast.json("show", "instance", str(instance)) == {"instances": None}  # destroyed: null (§4)
    assert fake.departures["trailing-slash"] > 0  # the CLI's paths end in "/", the document's do not (§12 #1)


def test_the_cli_s_own_retry_of_an_ambiguous_create_meets_its_own_instance(fake: FakeVast, vast: Vast) -> None:
    """vastai.md §5: the CLI retries a create answered 502 by itself; the first made the instance,
    the retry finds the offer taken (no_such_ask) while that instance runs and bills. What our
    adapter must never do blind (it lists by label instead: test_vastai.py)."""
    with fake.lock:
        fake.asks[24817003]["_free"] = 1  # the host's last free GPU
        fake.create_500_made = 1
    done = vast("create", "instance", "24817003", "--image", "ubuntu:22.04", "--disk", "16", "--ssh", "--direct",
                "--label", "cli-retry", "--raw")
    assert "no_such_ask" in done.stdout + done.stderr
    assert fake.count("PUT", "/api/v0/asks/{id}", 502) == 1
    assert fake.count("PUT", "/api/v0/asks/{id}", 404) >= 1
    assert fake.alive() == ["cli-retry"]  # made, running, billing: the CLI says it failed
    [made] = list(fake.instances)
    assert vast("destroy", "instance", str(made), "-y").returncode == 0
    assert fake.alive() == []


def test_each_command_in_the_one_process_answers_as_a_fresh_vastai(tmp_path: Path, vastai: Path) -> None:
    """tests/support/vast_own.py runs each command as a fresh `vastai` process does: a refused argument's
    exit status and output are a fresh process's, and again on the next command (the parser is built
    anew: a second main() on the first one's fails); stdin is at its end (the prompt of a `destroy`
    without -y); a command's exception ends it with its traceback and status 1."""
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        vast = Vast(vastai, f"http://127.0.0.1:{closed.getsockname()[1]}", tmp_path / "home", ["A100_SXM4"])
        try:
            fresh = subprocess.run([str(vast.command), "show", "instance", "abc"], capture_output=True, text=True,
                                   timeout=180, env=vast.env, stdin=subprocess.DEVNULL)
            assert fresh.returncode == 2, fresh.stderr
            for done in (vast.run("show", "instance", "abc"), vast.run("show", "instance", "abc")):
                assert (done.returncode, done.stdout, done.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
            aborted = vast.run("destroy", "instance", "5")
            assert aborted.returncode == 0
            assert aborted.stdout.endswith("[y/N] \nAborted.\n")  # input() met the end of stdin
            refused = vast("show", "instances", "--retry", "1")
            assert refused.returncode == 1
            assert refused.stderr.startswith("Traceback (most recent call last):")
            assert refused.stderr.rstrip().splitlines()[-1].startswith("requests.exceptions.ConnectionError: ")
        finally:
            vast.close()


def test_the_test_command_makes_vast_s_venv_pinned() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert f"vastai=={PIN}" in script
    assert "ACTOR_RUN_VAST_PYTHON" in script
    assert sys.executable  # the suite's own interpreter is not Vast's
