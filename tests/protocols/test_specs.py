"""protocols/specs.py: batch files, decoded by msgspec and checked; every problem names its field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from actor_run.protocols.clouds import known_clouds, parse_settings
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import JobEnded, Leased
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec, load_batch

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"

GOOD = """\
[job]
name = "t"
command = "sh -c 'echo {seed}'"
code = "code"
inputs = { data = "data.txt" }
seeds = [1, 2]
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "data.txt").write_text("words\n")
    path = tmp_path / "batch.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_load_the_examples() -> None:
    batch = load_batch(EXAMPLES / "seeds.toml", known_clouds())
    jobs = batch.jobs()
    assert [j.seed for j in jobs] == [1, 2, 3]
    j = jobs[0]
    assert j.name == "seeds"
    assert j.key == "seeds/seed-1"
    assert j.code == str(EXAMPLES / "trainer")  # resolved against the batch file's folder
    assert j.inputs == {"data": str(EXAMPLES / "data" / "train.txt")}
    assert j.policy.concurrency == 3
    assert j.policy.poll_s == 0.5
    sls = load_batch(EXAMPLES / "serverless.toml", known_clouds()).jobs()
    assert [c.gpu for c in sls[0].candidates] == ["A100-80G", "H100"]
    assert parse_settings("runpod-serverless", sls[0].clouds["runpod-serverless"]).throttled_grace_s == 300
    sim = load_batch(EXAMPLES / "sim.toml", known_clouds()).jobs()
    assert [c.cloud for c in sim[0].candidates] == ["sim", "sim"]
    assert sim[0].candidates[0] == CandidateSpec(
        cloud="sim", gpu="H100", regions=["us-east", "eu-west"], max_hourly_usd=3.5
    )
    assert sim[0].clouds == {"sim": {"no_capacity_rate": 0.3, "launch_failure_rate": 0.1, "seed": 7}}


def test_good_file_relative_to_its_folder(tmp_path: Path) -> None:
    batch = load_batch(write(tmp_path, GOOD + "[policy]\nmax_attempts = 2\nbudget_usd = 1.5\n"), known_clouds())
    assert batch.base == str(tmp_path.resolve())
    jobs = batch.jobs()
    assert [j.seed for j in jobs] == [1, 2]
    assert jobs[1].command == "sh -c 'echo {seed}'"  # {seed} is filled in on the machine's command line
    assert jobs[0].code == str(tmp_path.resolve() / "code")
    assert jobs[0].policy == PolicySpec(max_attempts=2, budget_usd=1.5)


def test_without_candidates_a_job_runs_on_local(tmp_path: Path) -> None:
    jobs = load_batch(write(tmp_path, GOOD), known_clouds()).jobs()
    assert jobs[0].candidates == [CandidateSpec(cloud="local")]
    assert Job(name="x", command="true", seed=0).candidates == [CandidateSpec(cloud="local")]


def test_without_candidates_the_runner_leases_a_local_machine(tmp_path: Path) -> None:
    from actor_run.supervisors.api.runner import Runner  # a test may cross layers; the source may not

    spec = GOOD.replace("sh -c 'echo {seed}'", "sh -c 'cat $ACTOR_RUN_IN/data/data.txt'").replace("[1, 2]", "[1]")
    jobs = load_batch(write(tmp_path, spec + "[policy]\npoll_s = 0.1\n"), known_clouds()).jobs()
    seen: list[object] = []
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state") as r:
        r.subscribe(seen.append)
        ended = r.submit(jobs[0]).result(60)
    assert isinstance(ended, JobEnded)
    assert ended.outcome == "succeeded"
    leased = [e for e in seen if isinstance(e, Leased)]
    assert [e.machine.cloud for e in leased] == ["local"]
    assert "words" in (tmp_path / "out" / "latest" / "t" / "seed-1" / "log.txt").read_text()


BAD = [
    (GOOD + "colour = 'blue'\n", "job.colour", "unknown key"),
    (GOOD + "[policy]\nconcurrency = 'x'\n", "policy.concurrency", "expected int, got str"),
    (GOOD + "[policy]\nconcurrency = -2\n", "policy.concurrency", "expected int >= 1, got -2"),
    (GOOD + "[policy]\nmax_attempts = 0\n", "policy.max_attempts", "expected int >= 1, got 0"),
    (GOOD + "[policy]\npoll_s = 0\n", "policy.poll_s", "expected number > 0, got 0"),
    (GOOD + "[policy]\nbudget_usd = -1\n", "policy.budget_usd", "expected number > 0"),
    (GOOD + "[policy]\nretries = 3\n", "policy.retries", "unknown key"),
    (GOOD.replace('code = "code"', 'code = "nowhere"'), "job.code", "no such folder"),
    (GOOD.replace('"data.txt"', '"missing.txt"'), "job.inputs.data", "no such file or folder"),
    (GOOD.replace("{ data =", "{ resume ="), "job.inputs.resume", "reserved"),
    (GOOD.replace("[1, 2]", "[]"), "job.seeds", "non-empty"),
    (GOOD.replace("[1, 2]", "[1, 1]"), "job.seeds", "seeds repeat"),
    (GOOD.replace("[1, 2]", "['a']"), "job.seeds[0]", "expected int, got str"),
    (GOOD.replace('name = "t"', 'name = "Bad_Name"'), "job.name", "[a-z0-9-]"),
    (GOOD.replace('name = "t"', 'name = "' + "x" * 41 + '"'), "job.name", "1 to 40 characters"),
    (GOOD.replace("command = \"sh -c 'echo {seed}'\"", 'command = "  "'), "job.command", "a command"),
    (GOOD.replace("command = \"sh -c 'echo {seed}'\"\n", ""), "job.command", "required, missing"),
    (GOOD + "timeout_s = 0\n", "job.timeout_s", "expected number > 0"),
    (GOOD + "[[candidates]]\ncloud = 'nimbus'\n", "candidates[0].cloud", "unknown cloud 'nimbus'"),
    (
        GOOD + "[[candidates]]\ncloud = 'sim'\n[[candidates]]\ncloud = 'nimbus'\n",
        "candidates[1].cloud",
        "unknown cloud",
    ),
    (
        GOOD + "[[candidates]]\ncloud = 'sim'\nmax_hourly_usd = -1\n",
        "candidates[0].max_hourly_usd",
        "expected number >= 0",
    ),
    (GOOD + "[[candidates]]\ncloud = 'sim'\nzone = 'a'\n", "candidates[0].zone", "unknown key"),
    (GOOD + "[clouds.nimbus]\nx = 1\n", "clouds.nimbus", "unknown cloud"),
    ("[policy]\nconcurrency = 1\n", "job", "required, missing"),
    # issue 23: numbers are finite, a host is lost only after three heartbeats, env names are a
    # shell's and not actor-run's own, no NUL anywhere, nothing an exec would refuse
    *[(GOOD + f"[policy]\n{name} = inf\n", f"policy.{name}", "expected a finite number, got inf")
      for name in ("setup_grace_s", "deadline_margin_s", "last_grace_factor", "lost_after_s", "budget_usd",
                   "stall_after_s", "poll_s", "backoff_s", "backoff_max_s", "thrash_window_s", "capacity_wait_s")],
    (GOOD + "[policy]\nlost_after_s = nan\n", "policy.lost_after_s", "finite"),
    (GOOD + "timeout_s = inf\n", "job.timeout_s", "expected a finite number, got inf"),
    (GOOD + "max_usd = inf\n", "job.max_usd", "finite"),
    (GOOD + "[[candidates]]\ncloud = 'sim'\nmax_hourly_usd = inf\n", "candidates[0].max_hourly_usd", "finite"),
    (GOOD + "[policy]\npoll_s = 10\nlost_after_s = 10\n", "policy.lost_after_s", ">= 3 x poll_s (30)"),
    (GOOD + "env = { 'X=1; touch PWN; Y' = 'v' }\n", "job.env", "must match [A-Za-z_][A-Za-z0-9_]*"),
    (GOOD + "env = { MY-VAR = 'v' }\n", "job.env", "must match"),
    (GOOD + "env = { '' = 'v' }\n", "job.env", "must match"),
    (GOOD + "env = { ACTOR_RUN_OUT = '/tmp' }\n", "job.env", "reserved"),
    (GOOD + "env = { A = \"x\\u0000y\" }\n", "job.env.A", "NUL"),
    (GOOD + "env = { A = '" + "x" * (130 << 10) + "' }\n", "job.env.A", "at most 131071 bytes"),
    (GOOD + "".join(f"env.A{i} = '{'x' * (100 << 10)}'\n" for i in range(3)), "job.env", "in all"),
    (GOOD + "env = { A = 'v' }\npublic_env = ['B']\n", "job.public_env", "not a name in job.env"),
    (GOOD.replace("command = \"sh -c 'echo {seed}'\"", 'command = "echo \\u0000"'), "job.command", "NUL"),
    (GOOD + "[[candidates]]\ncloud = 'sim'\nregions = [\"a\\u0000\"]\n", "candidates[0].regions", "NUL"),
]


@pytest.mark.parametrize(("text", "field", "problem"), BAD, ids=[f"{i}-{f}" for i, (_, f, _) in enumerate(BAD)])
def test_bad_inputs_name_their_field(tmp_path: Path, text: str, field: str, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        load_batch(write(tmp_path, text), known_clouds())
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(info.value).startswith(f"{field}: ")
    assert "\n" not in str(info.value)


def test_the_documented_message(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^policy\.concurrency: expected int >= 1, got -2$"):
        load_batch(write(tmp_path, GOOD + "[policy]\nconcurrency = -2\n"), known_clouds())


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read batch file"):
        load_batch(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\nname=")
    with pytest.raises(SpecError, match="is not valid TOML"):
        load_batch(bad)
