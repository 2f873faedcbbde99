"""Notifications: webhooks told when something a person should hear of happens (a job failed, a run
ended, spend at 50/80/100 % of a budget, a machine alive past its deadline, a controller's lease on a
shared ledger lost), from the user's settings:

    [[notify.webhooks]]
    url = "https://hooks.slack.com/services/..."     # a secret: never logged whole, never in a body
    format = "slack"                                   # "slack" (a Slack-compatible {"text": ...}) or "json"
    events = ["job_failed", "run_ended", "budget"]     # default: every kind

A `Notifier` is an event subscriber (`Runner.subscribe(notifier.event)`): it only puts what it
makes on a bounded queue and returns, so it never blocks or fails a run. One thread of its own
(`actor-run-notify`) delivers each body to each webhook, retrying a failed delivery (a refused
connection, a timeout, a 429 or 5xx) with backoff up to ATTEMPTS tries; every delivery and every
failure is a log record (the controller's log). What a body holds is the event's plain facts (job,
run, code, detail, dollars), redacted like every log line: no setting, key or URL.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Literal

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Charged, Event, JobEnded, Leased, Released, Reserved
from actor_run.protocols.redact import redact
from actor_run.protocols.specs import job_key

KINDS = ("job_failed", "run_ended", "budget", "past_deadline", "lease_lost")
THRESHOLDS = (0.5, 0.8, 1.0)  # the shares of a budget that are told, each once
ATTEMPTS = 5  # tries per delivery; between them BACKOFF_S doubled each time
BACKOFF_S = 0.5
QUEUE_MOST = 1000  # undelivered bodies kept; past it the newest are dropped (and counted)


class Webhook(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str
    format: Literal["slack", "json"] = "json"
    events: list[str] = msgspec.field(default_factory=lambda: list(KINDS))


class NotifySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    webhooks: list[Webhook] = msgspec.field(default_factory=list)


def parse_notify(raw: Any, where: str = "") -> NotifySettings:
    """The `[notify]` table, checked: SpecError naming the field for a bad one."""
    try:
        settings = msgspec.convert(raw, NotifySettings)
    except msgspec.ValidationError as exc:
        path = str(exc).rpartition(" - at `$")[2].rstrip("`")
        field = "notify" + (path if path.startswith(("[", ".")) else "")
        raise SpecError(field, f"{str(exc).partition(' - at ')[0]}{where}") from exc
    for i, hook in enumerate(settings.webhooks):
        if not hook.url.startswith(("http://", "https://")):
            raise SpecError(f"notify.webhooks[{i}].url", f"expected an http:// or https:// URL{where}")
        unknown = sorted(set(hook.events) - set(KINDS))
        if unknown:
            raise SpecError(f"notify.webhooks[{i}].events",
                            f"unknown {', '.join(unknown)}{where} (known: {', '.join(KINDS)})")
    return settings


def _where(url: str) -> str:
    """A webhook as a log line names it: its scheme and host, never its path (a Slack URL's secret)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}"


class Notifier:
    """Makes the bodies (on the emitting thread: quick) and delivers them (on its own thread)."""

    def __init__(self, settings: NotifySettings, *, run: str = "") -> None:
        self.settings = settings
        self.run = run
        self.dropped = 0
        self.delivered = 0
        self.failed = 0
        self._told: set[tuple[str, float]] = set()  # (budget kind, threshold) told
        self._machines: dict[str, tuple[float, str]] = {}  # machine -> (deadline, job) while leased
        self._late: set[str] = set()
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(QUEUE_MOST)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if settings.webhooks:
            self._thread = threading.Thread(target=self._deliver_all, name="actor-run-notify", daemon=True)
            self._thread.start()

    # --- what is told (any thread) --------------------------------------------------------------

    def event(self, e: Event) -> None:
        """A Runner subscriber: quick, never raises on a webhook's account."""
        match e:
            case JobEnded(outcome="failed", failure=failure, detail=detail, attempts=attempts, usd=usd):
                self.tell("job_failed", {"job": job_key(e.job, e.seed), "code": str(failure or ""),
                                         "detail": detail, "attempts": attempts, "usd": round(usd, 4)})
            case Reserved(spent_usd=spent, budget_usd=budget) | Charged(spent_usd=spent, budget_usd=budget):
                if budget:
                    self._budget(spent, budget)
            case Leased(machine=m):
                with self._lock:
                    self._machines[m.name] = (m.deadline, job_key(e.job, e.seed))
            case Released(machine=name):
                with self._lock:
                    self._machines.pop(name, None)
            case _:
                pass

    def _budget(self, spent: float, budget: float) -> None:
        for share in THRESHOLDS:
            if spent >= share * budget:
                with self._lock:
                    if ("budget", share) in self._told:
                        continue
                    self._told.add(("budget", share))
                self.tell("budget", {"percent": int(share * 100), "spent_usd": round(spent, 4),
                                     "budget_usd": round(budget, 4)})

    def run_ended(self, *, succeeded: int, failed: int, canceled: int = 0, usd: float = 0.0) -> None:
        self.tell("run_ended", {"succeeded": succeeded, "failed": failed, "canceled": canceled,
                                "usd": round(usd, 4)})

    def lease_lost(self, jobs: int) -> None:
        self.tell("lease_lost", {"jobs": jobs})

    def tell(self, kind: str, facts: dict[str, Any]) -> None:
        """Queue `kind` with its facts for every webhook that wants it; never blocks."""
        if not any(kind in h.events for h in self.settings.webhooks):
            return
        body = {"kind": kind, "run": self.run, "t": time.time(),
                **{k: redact(v) if isinstance(v, str) else v for k, v in facts.items()}}
        try:
            self._queue.put_nowait((kind, body))
        except queue.Full:
            self.dropped += 1

    # --- delivery (its own thread) -------------------------------------------------------------

    def _deliver_all(self) -> None:
        import httpx

        with httpx.Client(timeout=10.0, follow_redirects=False) as client:
            while True:
                try:
                    item = self._queue.get(timeout=1.0)
                except queue.Empty:
                    self._check_deadlines()
                    continue
                if item is None:
                    return
                kind, body = item
                for hook in self.settings.webhooks:
                    if kind in hook.events:
                        self._deliver(client, hook, kind, body)
                self._check_deadlines()

    def _check_deadlines(self) -> None:
        now = time.time()
        with self._lock:
            late = [(name, job) for name, (deadline, job) in self._machines.items()
                    if deadline < now and name not in self._late]
            self._late.update(name for name, _ in late)
        for name, job in late:
            self.tell("past_deadline", {"machine": name, "job": job})

    def _deliver(self, client: Any, hook: Webhook, kind: str, body: dict[str, Any]) -> None:
        import httpx

        from actor_run.protocols.logs import logger

        payload = {"text": slack_text(body)} if hook.format == "slack" else body
        wait = BACKOFF_S
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = client.post(hook.url, json=payload)
                if answer.status_code < 300:
                    self.delivered += 1
                    logger.info("notify: {} delivered to {} (try {})", kind, _where(hook.url), attempt)
                    return
                why = f"HTTP {answer.status_code}"
                if answer.status_code < 500 and answer.status_code != 429:
                    break  # the receiver refuses this body: trying again changes nothing
            except httpx.HTTPError as exc:
                why = type(exc).__name__
            logger.warning("notify: {} to {} failed ({}), try {} of {}", kind, _where(hook.url), why, attempt,
                           ATTEMPTS)
            if attempt < ATTEMPTS:
                time.sleep(wait)  # this thread's own backoff: nothing of a run waits on it
                wait *= 2
        self.failed += 1
        logger.warning("notify: {} to {} given up", kind, _where(hook.url))

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued (within `timeout` seconds), then stop the thread."""
        if self._thread is None:
            return
        self._check_deadlines()
        with contextlib.suppress(queue.Full):  # a full queue's thread ends at the join's bound anyway (daemon)
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._thread = None


def slack_text(body: dict[str, Any]) -> str:
    """A one-line message for Slack-compatible receivers."""
    kind, run = body["kind"], body.get("run") or "?"
    if kind == "job_failed":
        return f"actor-run {run}: {body['job']} failed ({body['code']}): {body['detail']}"
    if kind == "run_ended":
        return (f"actor-run {run} ended: {body['succeeded']} succeeded, {body['failed']} failed, "
                f"{body['canceled']} canceled, ${body['usd']:.4f}")
    if kind == "budget":
        return (f"actor-run {run}: {body['percent']} % of the budget spent "
                f"(${body['spent_usd']:.2f} of ${body['budget_usd']:.2f})")
    if kind == "past_deadline":
        return f"actor-run {run}: machine {body['machine']} ({body['job']}) is alive past its deadline"
    return f"actor-run {run}: lease lost, {body.get('jobs', 0)} job(s) let go"
