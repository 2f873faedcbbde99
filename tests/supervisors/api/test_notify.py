"""supervisors/api/notify.py: webhooks on loopback receive the documented bodies (a failed job, a run's
end through the CLI; 50/80/100 % of a budget), a receiver that answers 500 twice gets the event on
the third try while the run is unaffected, and no body or log line holds the webhook's secret path."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.waits import poll

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Charged, JobEnded
from actor_run.supervisors.api.notify import Notifier, NotifySettings, Webhook, parse_notify

SECRET_PATH = "/services/T000/B000/XXXXsecretXXXX"


class Receiver:
    """A webhook receiver on 127.0.0.1: keeps each body; answers 500 to the first `fail_first`."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.tries = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.tries += 1
                if receiver.tries <= fail_first:
                    self.send_response(500)
                    self.end_headers()
                    return
                receiver.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-receiver")
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def receiver_of() -> Iterator[Any]:
    made: list[Receiver] = []

    def make(fail_first: int = 0) -> Receiver:
        made.append(Receiver(fail_first))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def test_budget_shares_are_told_once_each_and_a_500_twice_arrives_on_the_third_try(receiver_of: Any) -> None:
    flaky, slack = receiver_of(fail_first=2), receiver_of()
    notifier = Notifier(NotifySettings(webhooks=[Webhook(url=flaky.url, events=["budget"]),
                                                 Webhook(url=slack.url, format="slack", events=["budget"])]),
                        run="r1")
    try:
        for spent in (1.0, 4.0, 5.5, 8.5, 8.6, 10.0, 12.0):
            notifier.event(Charged(job="t", seed=1, usd=0.1, reserved=0.2, spent_usd=spent, budget_usd=10.0))
        poll(lambda: len(flaky.bodies) == 3 and len(slack.bodies) == 3, 60, "three budget notices each")
    finally:
        notifier.close()
    assert [b["percent"] for b in flaky.bodies] == [50, 80, 100]
    assert flaky.tries == 5  # the first body on its third try, then one try each
    assert flaky.bodies[1] | {"t": 0} == {"kind": "budget", "run": "r1", "t": 0, "percent": 80, "spent_usd": 8.5,
                                          "budget_usd": 10.0}
    assert slack.bodies[1] == {"text": "actor-run r1: 80 % of the budget spent ($8.50 of $10.00)"}
    assert notifier.delivered == 6
    assert notifier.failed == 0


def test_a_receiver_that_never_answers_costs_the_caller_nothing(receiver_of: Any) -> None:
    dead = receiver_of(fail_first=10**6)
    notifier = Notifier(NotifySettings(webhooks=[Webhook(url=dead.url)]), run="r2")
    try:
        notifier.event(JobEnded(job="t", seed=1, outcome="failed", failure=None, detail="boom"))  # type: ignore[arg-type]
        poll(lambda: notifier.failed == 1, 60, "the delivery to be given up")
    finally:
        notifier.close()
    assert dead.tries == 5
    assert dead.bodies == []


def test_bad_settings_name_their_field() -> None:
    with pytest.raises(SpecError, match=r"^notify.webhooks\[0\].url: expected an http"):
        parse_notify({"webhooks": [{"url": "ftp://x"}]})
    with pytest.raises(SpecError, match=r"^notify.webhooks\[0\].events: unknown job_done"):
        parse_notify({"webhooks": [{"url": "http://x", "events": ["job_done"]}]})
    with pytest.raises(SpecError, match=r"^notify"):
        parse_notify({"webhooks": [{"url": "http://x", "format": "teams"}]})


def test_a_cli_run_tells_a_failed_job_and_the_runs_end(tmp_path: Path, receiver_of: Any) -> None:
    hook = receiver_of(fail_first=2)
    config = tmp_path / "config.toml"
    config.write_text(f'[[notify.webhooks]]\nurl = "{hook.url}"\nevents = ["job_failed", "run_ended"]\n')
    batch = tmp_path / "batch.toml"
    batch.write_text(textwrap.dedent("""\
        [job]
        name = "told"
        command = "exit $(( {seed} == 2 ))"
        seeds = [1, 2]
        [policy]
        max_attempts = 1
        poll_s = 0.2
        [[candidates]]
        cloud = "local"
        """))
    done = subprocess.run([sys.executable, "-m", "actor_run", "run", str(batch), "--config", str(config),
                           "--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "out"), "--yes"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr  # seed 2 failed; the webhook's 500s changed nothing
    kinds = [b["kind"] for b in hook.bodies]
    assert kinds == ["job_failed", "run_ended"]
    failed, ended = hook.bodies
    assert (failed["job"], failed["code"], failed["attempts"]) == ("told/seed-2", "job_failed", 1)
    assert (ended["succeeded"], ended["failed"], ended["canceled"]) == (1, 1, 0)
    assert failed["run"] == ended["run"]
    assert ended["run"]
    logs = "".join(p.read_text() for p in (tmp_path / "state" / "runs").rglob("controller.log*"))
    assert "notify: job_failed to http://127.0.0.1" in logs  # each delivery is in the controller's log
    assert "secret" not in logs + done.stderr + done.stdout + json.dumps(hook.bodies)
