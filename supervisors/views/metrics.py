"""Prometheus metrics of a ledger, read at each scrape (the dashboard's `/metrics`, a worker's
`--metrics-port`), in the text format of the official client library (prometheus_client).

Names follow Prometheus's conventions (`actor_run_` prefix, base units: seconds, dollars; `_total`
for counters). Labels are bounded: job states, outcomes, failure codes, clouds, regions, and the run
id only for runs still running; never a job's seed, a machine's name or anything secret.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actor_run.supervisors.ledger import LedgerReader, owner_is_alive


def families(ledger: str | Path) -> list[Any]:
    """The metric families of the ledger now (prometheus_client's core types)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    reader = LedgerReader(ledger)
    try:
        jobs = reader.jobs()
        attempts = reader.attempts()
        machines = reader.machines(alive_only=True)
        reservations = reader.reservations()
        owners = reader.owners()
        runs = reader.runs()
        live = reader.live_owners()
        budgets = reader.run_budgets()
    finally:
        reader.close()
    now = time.time()
    by_state = GaugeMetricFamily("actor_run_jobs", "Jobs in the ledger by state.", labels=["state"])
    states: dict[str, int] = {s: 0 for s in ("queued", "running", "succeeded", "failed", "canceled")}
    for j in jobs:
        state = "canceled" if j["state"] == "failed" and j["failure"] == "canceled" else j["state"]
        states[state] = states.get(state, 0) + 1
    for state, n in sorted(states.items()):
        by_state.add_metric([state], n)
    ended = CounterMetricFamily("actor_run_attempts_ended", "Attempts that ended, by outcome and failure code.",
                                labels=["outcome", "code"])
    counts: dict[tuple[str, str], int] = {}
    for a in attempts:
        if a["ended"] is None:
            continue
        key = ("succeeded" if not a["failure"] else "failed", a["failure"] or "")
        counts[key] = counts.get(key, 0) + 1
    for (outcome, code), n in sorted(counts.items()):
        ended.add_metric([outcome, code], n)
    alive = GaugeMetricFamily("actor_run_machines_alive", "Machines held now, by cloud and region.",
                              labels=["cloud", "region"])
    places: dict[tuple[str, str], int] = {}
    for m in machines:
        places[(m.cloud, m.region or "")] = places.get((m.cloud, m.region or ""), 0) + 1
    for (cloud, region), n in sorted(places.items()):
        alive.add_metric([cloud, region], n)
    past = GaugeMetricFamily("actor_run_machines_past_deadline", "Machines alive past their deadline.")
    past.add_metric([], sum(1 for m in machines if m.deadline < now))
    spent = CounterMetricFamily("actor_run_spend_dollars", "What ended attempts cost, in dollars (every run).")
    spent.add_metric([], sum(float(a["usd"] or 0.0) for a in attempts))
    reserved = GaugeMetricFamily("actor_run_reserved_dollars", "Dollars reserved by attempts now running.")
    reserved.add_metric([], sum(float(r["usd"] or 0.0) for r in reservations if r["state"] == "live"))
    running_runs = [r for r in runs if r.unfinished and r.owner in live]
    run_spend = GaugeMetricFamily("actor_run_run_spend_dollars", "Spend of each running run, in dollars.",
                                  labels=["run"])
    run_budget = GaugeMetricFamily("actor_run_run_budget_dollars", "budget_usd of each running run.", labels=["run"])
    for r in running_runs:
        run_spend.add_metric([r.id], r.usd)
        if r.id in budgets:
            run_budget.add_metric([r.id], budgets[r.id])
    controllers = GaugeMetricFamily("actor_run_controllers_alive", "Controllers (runs, workers) alive now.")
    controllers.add_metric([], sum(1 for o in owners if not o.closed and owner_is_alive(o, now=now)))
    lease = GaugeMetricFamily("actor_run_lease_remaining_seconds",
                              "The shortest lease left among live workers (a shared ledger).")
    leases = [o.lease_until - now for o in owners if not o.closed and o.lease_until is not None and o.id in live]
    if leases:
        lease.add_metric([], min(leases))
    return [by_state, ended, alive, past, spent, reserved, run_spend, run_budget, controllers, lease]


class _LedgerCollector:
    def __init__(self, ledger: str | Path) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Any]:
        yield from families(self.ledger)


def ledger_metrics(ledger: str | Path) -> bytes:
    """The ledger's metrics now, in Prometheus's text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_LedgerCollector(ledger))
    return generate_latest(registry)


def ledger_registry(ledger: str | Path, registry: Any) -> None:
    """Register the ledger's metrics in `registry` (a worker's, beside its own counters)."""
    registry.register(_LedgerCollector(ledger))


class WorkerMetrics:
    """A worker's own figures beside the ledger's (`actor-run worker --metrics-port`): its polls, the
    jobs it runs, its lease and the ledger writer's commits. `poll()` is called by the worker's loop."""

    def __init__(self) -> None:
        self.polls = 0
        self.started = time.monotonic()
        self.runner: Any = None  # the worker's Runner while it is open

    def poll(self) -> None:
        self.polls += 1

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        polls = CounterMetricFamily("actor_run_worker_polls", "Claim and adoption polls this worker made.")
        polls.add_metric([], self.polls)
        yield polls
        rate = GaugeMetricFamily("actor_run_worker_polls_per_second", "Polls per second since the worker started.")
        rate.add_metric([], self.polls / max(1e-9, time.monotonic() - self.started))
        yield rate
        runner = self.runner
        if runner is None or runner.ledger is None:
            return
        running = GaugeMetricFamily("actor_run_worker_jobs_running", "Jobs this worker runs now.")
        running.add_metric([], sum(1 for h in runner.handles.values() if not h.done()))
        yield running
        ledger = runner.ledger
        commits = SummaryMetricFamily("actor_run_ledger_commit_seconds", "The ledger writer's commits and their time.")
        commits.add_metric([], count_value=ledger.commits, sum_value=ledger.commit_s)
        yield commits
        writes = CounterMetricFamily("actor_run_ledger_writes", "Writes queued to the ledger by this worker.")
        writes.add_metric([], ledger.writes)
        yield writes
        renewals = CounterMetricFamily("actor_run_worker_lease_renewals", "Lease renewals this worker wrote.")
        renewals.add_metric([], ledger.renewals)
        yield renewals
        if ledger.renewed_at is not None:
            lag = GaugeMetricFamily("actor_run_worker_lease_renewal_age_seconds",
                                    "Seconds since this worker's lease was last renewed (its lag behind the lease).")
            lag.add_metric([], max(0.0, time.time() - ledger.renewed_at))
            yield lag


def start_worker_metrics(ledger: str | Path, host: str, port: int) -> tuple[WorkerMetrics, Any]:
    """Serve the ledger's and a worker's metrics on host:port (prometheus_client's own server, on a
    thread of its own); the worker's figures and the server (`shutdown()` ends it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    ledger_registry(ledger, registry)
    worker = WorkerMetrics()
    registry.register(worker)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return worker, server
