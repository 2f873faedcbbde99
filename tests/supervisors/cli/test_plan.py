"""supervisors/cli/plan.py: `actor-run plan BATCH`, `run --dry-run` and the question `run` asks on
a terminal (issue 29.2), through the real command line (a pseudo-terminal for the question)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from support.cli_inproc import CLI, run_cli
from support.terminal import Terminal

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

SIM = """\
[job]
name = "p"
command = "true"
seeds = [1, 2, 3, 4]
timeout_s = 600

[policy]
max_attempts = 4
concurrency = 4
budget_usd = 5.0
setup_grace_s = 60
poll_s = 0.1

[[candidates]]
cloud = "sim"
gpu = "H100"
regions = ["us-east", "eu-west"]

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.05
"""


def write(tmp: Path, body: str = SIM) -> Path:
    path = tmp / "b.toml"
    path.write_text(textwrap.dedent(body))
    return path


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=120, env=ENV, cwd=tmp)


def test_plan_shows_offers_walk_and_worst_case_and_leases_nothing(tmp_path: Path) -> None:
    done = cli(tmp_path, "plan", str(write(tmp_path)))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # candidate 0's offers before candidate 1's, each cheapest first, with stock
    first, second = out.index("candidate 0: sim H100"), out.index("candidate 1: sim A100")
    assert first < out.index("sim  us-east  H100  $2.90/h  stock 4") < out.index("sim  eu-west  H100  $3.20/h") < second
    assert second < out.index("sim  ap-south  A100  $1.50/h  stock 2")
    # the most an attempt holds: $3.20/h x (600 s timeout + 60 s grace) = $0.5867; 4 seeds x 4 attempts
    assert "one attempt reserves at most $0.5867" in out
    assert "worst case of the whole batch: $9.39" in out
    assert "passes budget_usd $5.00" in out
    assert not (tmp_path / "state" / "ledger.sqlite").exists()  # nothing recorded, nothing leased
    dry = run_cli(["run", str(write(tmp_path)), "--dry-run", "--state-dir", str(tmp_path / "state"),
                          "--out", str(tmp_path / "out")], timeout=120, env=ENV)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == out
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "state" / "ledger.sqlite").exists()


def test_plan_of_a_batch_that_fits(tmp_path: Path) -> None:
    done = cli(tmp_path, "plan", str(write(tmp_path, SIM.replace("budget_usd = 5.0", "budget_usd = 50.0"))))
    assert done.returncode == 0, done.stderr
    assert "fits budget_usd $50.00" in done.stdout


def _on_a_terminal(tmp: Path, args: list[str], answer: bytes | None) -> tuple[int, str]:
    """Run `actor-run` with a pseudo-terminal as its stdin and stdout; type `answer` when it asks."""
    with Terminal([*CLI, *args], env=ENV, cwd=tmp) as term:
        if answer is not None:
            term.wait_for("[y/N]", 120)
            term.write(answer)
        code = term.wait(120)
    return code, term.text()

def test_run_on_a_terminal_asks_above_the_users_threshold(tmp_path: Path) -> None:
    batch = write(tmp_path)
    user = tmp_path / "user.toml"
    user.write_text("confirm_above_usd = 2.0\n")
    common = [str(batch), "--config", str(user), "--state-dir", str(tmp_path / "state"), "--ledger",
              str(tmp_path / "l.sqlite"), "--out", str(tmp_path / "out")]
    code, text = _on_a_terminal(tmp_path, ["run", *common], b"n\n")
    assert "plan: 4 job(s) x up to 4 attempt(s), first sim H100 us-east at $2.90/h; worst case $9.39" in text
    assert "run it? [y/N]" in text
    assert code == 2, text
    assert "not started" in text
    assert not (tmp_path / "out").exists()
    code, text = _on_a_terminal(tmp_path, ["run", *common, "--yes"], None)
    assert "[y/N]" not in text
    assert "plan: 4 job(s)" in text
    assert code == 0, text


def test_run_without_a_terminal_never_asks(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text("confirm_above_usd = 0.01\n")
    done = run_cli(["run", str(write(tmp_path)), "--config", str(user), "--state-dir",
                           str(tmp_path / "state"), "--ledger", str(tmp_path / "l.sqlite"), "--out",
                           str(tmp_path / "out")], timeout=180, env=ENV,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "[y/N]" not in done.stdout + done.stderr


def test_a_bad_threshold_in_the_user_config_is_one_line(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text('confirm_above_usd = "lots"\n')
    done = cli(tmp_path, "plan", str(write(tmp_path)), "--config", str(user))
    assert done.returncode == 2
    assert done.stderr.startswith("actor-run: confirm_above_usd: expected a number >= 0")


def test_plan_of_a_vast_batch_shows_on_demand_and_interruptible_prices_side_by_side(tmp_path: Path) -> None:
    import os

    from fakes.batch_kit import write_batch
    from fakes.vastai import FakeVast

    fake = FakeVast(tmp_path / "fake").start()
    try:
        batch = write_batch(tmp_path, "vastai", fake.url, gpus=["A100-80G", "H100"], seeds=[1],
                            settings=fake.settings())
        batch.write_text(batch.read_text().replace('gpu = "H100"\n', 'gpu = "H100"\ninterruptible = true\n', 1))
        done = run_cli(["plan", str(batch), "--state-dir", str(tmp_path / "state")], timeout=120,
                       env={**os.environ, "VAST_API_KEY": "test-key"}, cwd=tmp_path)
    finally:
        fake.stop()
    assert fake.violations == []
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "vastai  Texas, US  A100-80G  $1.12/h (interruptible $0.4700/h)" in out  # on-demand, the bid price beside
    assert "vastai  Texas, US  H100  $0.9900/h interruptible" in out  # a bid: min_bid 0.90 and the margin
    assert fake.created == []  # a plan rents nothing
