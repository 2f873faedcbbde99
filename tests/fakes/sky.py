"""A fake SkyPilot 0.14 for tests, as SkyPilot 0.14 is made: a long-lived API server holding the
clusters and requests, and a thin `sky` client that sends it each command line and prints its
answer. The command grammar, request ids and output are SkyPilot 0.14.1's (written from its
sources: sky/client/cli/command.py for what each command prints, sky/catalog/common.py for how GPUs
are filtered, sky/skylet/events.py and autostop_lib.py for autostop), with clusters that are real
logins on a test sshd and instances recorded in a moto EC2 server, tagged the way SkyPilot tags
them. tests/protocols/clouds/test_skypilot_real.py checks its output against SkyPilot's own code
(tests/support/sky_own.py).

What 0.14 prints, kept here: `sky down --async` says `Submitted sky.Terminating request: <id>` (the
CLI's label, not the request's name, which is `sky.down`), and `Cluster(s) not found (tip: see
`sky status`).` with exit 0 for a cluster it does not know; `sky show-gpus` (deprecated: a warning
on stderr) and `sky gpus list` print one table per GPU name the case-insensitive pattern matches
(`T4` gives T4 and T4g), and a GPU not sold in that quantity is `Resources 'X' with requested
quantity 1 not found on AWS.` with exit 0; `sky status -o json` lists a cluster still being
launched as INIT with null `cluster_name_on_cloud`, region and resources.

The server (`FakeSky`: one a test, started with it and ended by `stop`) listens on 127.0.0.1 and
runs in the test's process, as moto's server does: threads, one a call, and a *skylet* thread for
each cluster that comes up. `sky` (`FakeSky.command`, a wrapper around tests/fakes/sky_client.py:
standard library only) sends its argv as one JSON line and prints the answer's stdout, stderr and
exit code, so every call the adapter makes costs one small process, as a real `sky` talking to its
API server does. The server plays the API server lazily: a submitted request carries the moment it
is due, and any later call (`sky api status`, `sky status`, ...) first moves every due request to
its end (instances are made or terminated in moto then). Calls are answered one at a time.

A cluster's skylet runs the launch's run command as the cluster's job and autostops the cluster as
SkyPilot's StopEvent does, on a scaled minute (`minute_s`): every minute it checks whether the
cluster is idle (no job running and no SSH session with a terminal under the test's sshd:
`has_active_ssh_sessions`), and once idle for `-i` minutes with `--down` it terminates the
instances and drops the cluster (recorded in `autodowns`). A cluster that goes (a down, an
autodown) takes what ran on it: its own job, and what came in over SSH (`cluster_processes`).

Faults (`set_faults`, at any time):

    unavailable: [region, ...]   a launch there FAILS with ResourcesUnavailableError, nothing made
    provision: "fail"            a launch makes its instance, then FAILS (the cluster stays, INIT)
    launch: "never" | "hang"     a launch request stays RUNNING forever / `sky launch` hangs after submitting
    old_cli: true                `sky gpus` is not a command (a CLI before it; `sky show-gpus` only)
    down: "fail" | "hang"        a down request FAILS / the `sky down` command itself hangs

The test's side (`FakeSky`): the `sky` command, set faults, read clusters and requests, forget a
cluster (its record vanishes while its instance runs), the calls made, stop.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

USER_HASH = "2ea4"
USER_ID = "fcd1e5cf"
REGIONS = ("us-east-1", "us-east-2", "us-west-2")
# AWS's catalog rows for these GPUs (sky/catalog's vms.csv columns): instance type, GPU, count,
# vCPUs, host GiB, device GiB, price, spot price; the same in every region here
CATALOG = [
    ("g5.xlarge", "A10G", 1, 4, 16, 24, 1.006, 0.4024),
    ("g5.2xlarge", "A10G", 1, 8, 32, 24, 1.212, 0.485),
    ("g4dn.xlarge", "T4", 1, 4, 16, 16, 0.526, 0.2155),
    ("g5g.xlarge", "T4g", 1, 4, 8, 16, 0.42, 0.1586),
    ("p3.2xlarge", "V100", 1, 8, 61, 16, 3.06, 0.918),
    ("p3dn.24xlarge", "V100-32GB", 8, 96, 768, 32, 31.212, 9.3636),
    ("p4d.24xlarge", "A100", 8, 96, 1152, 40, 32.7726, 11.5719),
    ("p4de.24xlarge", "A100-80GB", 8, 96, 1152, 80, 40.9657, 13.0692),
    ("g6.xlarge", "L4", 1, 4, 16, 24, 0.8048, 0.2861),
    ("g6e.xlarge", "L40S", 1, 4, 32, 48, 1.861, 0.7329),
]
ACTIVE = ("PENDING", "WAITING", "RUNNING")
LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]
HANG = -1  # a command's answer that never comes: the client waits until it is killed
CLIENT = Path(__file__).resolve().with_name("sky_client.py")


# --- the API server's state ------------------------------------------------------------------------


class Api:
    """What the API server holds: requests, clusters, faults, the calls made, one EC2 client a
    region, the skylets. Every call runs under `lock`."""

    def __init__(self, cfg: dict[str, Any], log: Path) -> None:
        self.cfg = cfg
        self.log = log  # the skylets' and jobs' output
        self.db: dict[str, Any] = {"requests": [], "clusters": {}, "autodowns": []}
        self.faults: dict[str, Any] = {}
        self.argvs: list[list[str]] = []
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.skylets: dict[str, list[Skylet]] = {}  # the live clusters'
        self.every_skylet: list[Skylet] = []
        self._ec2: dict[str, Any] = {}
        self._ssh_port: int | None = None

    def advance(self) -> dict[str, Any]:
        """Move every due request to its end, as the API server would have by now; the state."""
        now = time.time()
        db = self.db
        for r in db["requests"]:
            if r["status"] not in ACTIVE:
                continue
            if r["status"] == "PENDING":
                r["status"] = "RUNNING"
                if r["name"] == "sky.launch" and r["params"]["region"] not in self.faults.get("unavailable", []):
                    _init_cluster(db, r)
            if now < r["due"]:
                continue
            if r["name"] == "sky.launch":
                self._finish_launch(r)
            elif r["name"] == "sky.down":
                self._finish_down(r)
            if r["status"] not in ACTIVE:
                r["finished_at"] = now
        return db

    def ec2(self, region: str) -> Any:
        if region not in self._ec2:
            import boto3  # the test's process has it already (moto's server)

            env = aws_env()
            self._ec2[region] = boto3.client(
                "ec2", region_name=region, endpoint_url=self.cfg["ec2_endpoint"],
                aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                aws_session_token=env["AWS_SESSION_TOKEN"])
        return self._ec2[region]

    def _make_instance(self, cluster: dict[str, Any], token: str) -> None:
        """Its instance, made once per request however often this is cut short (EC2's ClientToken)."""
        on_cloud = cluster["cluster_name_on_cloud"]
        tags = [{"Key": "skypilot-cluster-name", "Value": on_cloud}, {"Key": "ray-cluster-name", "Value": on_cloud},
                {"Key": "ray-node-type", "Value": "head"}, {"Key": "Name", "Value": f"{on_cloud}-head"},
                {"Key": "skypilot-user", "Value": "root"}]
        got = self.ec2(cluster["region"]).run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType=cluster["instance_type"], ClientToken=token,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        cluster["instances"] = [i["InstanceId"] for i in got["Instances"]]

    def _end_instances(self, cluster: dict[str, Any]) -> None:
        if cluster.get("instances"):
            self.ec2(cluster["region"]).terminate_instances(InstanceIds=cluster["instances"])

    def _finish_launch(self, r: dict[str, Any]) -> None:
        faults = self.faults
        if faults.get("launch") in ("never", "hang"):
            return
        p = r["params"]
        if p["region"] in faults.get("unavailable", []):
            self.db["clusters"].pop(r["cluster_name"], None)  # nothing was made: no record is left
            r["status"] = "FAILED"
            r["error"] = ("sky.exceptions.ResourcesUnavailableError: Failed to provision all possible launchable "
                          f"resources. Relax the task's resource requirements: 1x AWS({p['instance_type']}) "
                          f"in {p['region']}")
            return
        cluster = _init_cluster(self.db, r)
        if not cluster["instances"]:
            cluster["region"] = p["region"]
            cluster["cluster_name_on_cloud"] = f"{r['cluster_name']}-{USER_HASH}"
            self._make_instance(cluster, r["request_id"])
        if faults.get("provision") == "fail":
            r["status"] = "FAILED"
            r["error"] = f"RuntimeError: Failed to set up {r['cluster_name']}: the setup command exited 1"
            return
        cluster["status"] = "UP"
        r["status"] = "SUCCEEDED"
        skylet = Skylet(self, dict(cluster))
        self.skylets.setdefault(cluster["name"], []).append(skylet)
        self.every_skylet.append(skylet)

    def _finish_down(self, r: dict[str, Any]) -> None:
        if self.faults.get("down") == "fail":
            r["status"] = "FAILED"
            r["error"] = "sky.exceptions.ClusterOwnerIdentityMismatchError: could not terminate the cluster"
            return
        cluster = self.db["clusters"].pop(r["cluster_name"], None)
        if cluster is not None:
            self._end_instances(cluster)
            self.cluster_gone(cluster["name"])
        r["status"] = "SUCCEEDED"

    def cluster_gone(self, name: str) -> None:
        """Its instances are terminated: what ran on it ends (`cluster_processes`)."""
        for skylet in self.skylets.pop(name, []):
            skylet.end()
        if not self.db["clusters"]:
            end_processes(self.cluster_processes())

    def cluster_processes(self) -> list[Any]:
        """What runs on this fake's clusters besides their own jobs: every process that came in over
        SSH to the test's sshd (its SSH_CONNECTION, which each login's processes inherit, detached
        or not, names that sshd's port). Every cluster is a login on that one sshd, so whose login
        started a process cannot be told apart: they end when the last cluster goes (and at `stop`)."""
        import psutil

        port = self.ssh_port()
        if port is None:
            return []
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                conn = p.environ().get("SSH_CONNECTION", "").split()
                if len(conn) == 4 and conn[3] == str(port) and p.pid != os.getpid():
                    found.append(p)
        return found

    def ssh_port(self) -> int | None:
        """The port the test's sshd listens on (from its pid file), once known."""
        if self._ssh_port is None:
            import psutil

            pid = _sshd_pid(self.cfg)
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(pid).net_connections(kind="tcp") if pid else []:
                    if c.status == psutil.CONN_LISTEN:
                        self._ssh_port = c.laddr.port
        return self._ssh_port


def _init_cluster(db: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """The cluster's record as a launch that has started provisioning leaves it: INIT, nothing on
    the cloud yet (`cluster_name_on_cloud`, region and resources are null in `sky status`)."""
    p = r["params"]
    if r["cluster_name"] not in db["clusters"]:
        db["clusters"][r["cluster_name"]] = {
            "name": r["cluster_name"], "status": "INIT", "launched_at": int(time.time()), "region": None,
            "cluster_name_on_cloud": None, "instance_type": p["instance_type"], "autostop": p["idle"],
            "to_down": p["down"], "use_spot": p["spot"], "instances": [], "run": p.get("run", ""),
        }
    cluster: dict[str, Any] = db["clusters"][r["cluster_name"]]
    return cluster


def _submit(db: dict[str, Any], name: str, cluster: str, due_s: float, **params: Any) -> str:
    rid = str(uuid.uuid4())
    db["requests"].append({"request_id": rid, "name": name, "cluster_name": cluster, "status": "PENDING",
                           "created_at": time.time(), "finished_at": None, "due": time.time() + due_s,
                           "error": None, "params": params})
    return rid


def _submitted(a: argparse.Namespace, label: str, rid: str) -> None:  # command.py _async_call_or_wait
    print(f"Submitted sky.{label} request: {rid}", file=a.out)  # colours left out
    print(f"├── Check logs with: sky api logs {rid[:8]}", file=a.out)
    print(f"└── To cancel the request, run: sky api cancel {rid[:8]}", file=a.out)
    print(file=a.out)


# --- the commands ----------------------------------------------------------------------------------


def launch(api: Api, a: argparse.Namespace) -> int:
    cfg = api.cfg
    parts = (a.infra or "aws").split("/")
    region = parts[1] if len(parts) > 1 else REGIONS[0]
    if parts[0].lower() != "aws" or region not in REGIONS:
        print(f"sky.exceptions.InvalidCloudConfigs: unknown infra {a.infra}", file=a.err)
        return 1
    if not a.async_:
        print("fake sky: launch without --async is not faked", file=a.err)
        return 2
    gpu = (a.gpus or "").split(":")[0]
    db = api.advance()
    kinds = [row[0] for row in CATALOG if row[1] == gpu and row[2] == 1]
    idle = a.idle if a.idle is not None else (0 if a.down else -1)  # `--down` alone: down once idle
    rid = _submit(db, "sky.launch", a.cluster, cfg.get("launch_s", 0.3), region=region,
                  instance_type=(kinds or ["m6i.large"])[0], idle=idle, down=a.down, spot=a.spot, gpu=gpu,
                  run=" ".join(a.entrypoint))
    if api.faults.get("launch") == "hang":  # submitted, then no answer: the client cannot know
        return HANG
    print(f"Command to run: {' '.join(a.entrypoint)}", file=a.out)
    print(f"Running on cluster: {a.cluster}", file=a.out)
    _submitted(a, "launch", rid)
    return 0


def down(api: Api, a: argparse.Namespace) -> int:
    if api.faults.get("down") == "hang":  # the command itself hangs: nothing is submitted
        return HANG
    cfg = api.cfg
    db = api.advance()
    names = [c for c in db["clusters"] if any(fnmatch.fnmatch(c, p) for p in a.clusters)]
    rids = [_submit(db, "sky.down", n, cfg.get("down_s", 0.2), purge=a.purge) for n in names]
    if a.purge:
        for n in names:
            db["clusters"].pop(n, None)
    if not names:  # command.py _down_or_stop_clusters: a name it does not know is dropped, exit 0
        print("Cluster(s) not found (tip: see `sky status`).", file=a.out)
        return 0
    print("\n", file=a.out)  # its blank line, and the progress bar's (rich, not a terminal)
    for n, rid in zip(names, rids, strict=True):
        _submitted(a, "Terminating", rid)  # the CLI's label for a down: `sky.` + 'Terminating'
        print(f"\nTerminating cluster {n}...done.", file=a.out)
    plural = "s" if len(names) > 1 else ""
    print(f"Terminating {len(names)} cluster{plural} {'━' * 40} 100% 0:00:00", file=a.out)
    if a.async_:
        print("Terminating requests are sent. Check the requests' status with `sky request get <request_id>`.",
              file=a.out)
    return 0


def api_status(api: Api, a: argparse.Namespace) -> int:
    db = api.advance()
    rows = [r for r in db["requests"] if a.all or r["status"] in ACTIVE]
    if a.cluster:
        rows = [r for r in rows if r["cluster_name"] == a.cluster]
    if a.ids:
        rows = [r for r in rows if any(r["request_id"].startswith(i) for i in a.ids)]
    limit = None if a.limit in ("none", "all") else int(a.limit)
    rows = sorted(rows, key=lambda r: -r["created_at"])  # newest first, as the server returns them
    rows = rows[:limit] if limit else rows
    out = [{
        "request_id": r["request_id"], "name": r["name"], "entrypoint": "", "request_body": "null",
        "status": r["status"], "created_at": r["created_at"], "user_id": USER_ID, "return_value": "null",
        "error": "null", "pid": None, "schedule_type": "long", "user_name": "root",
        "cluster_name": r["cluster_name"] if a.verbose else None, "status_msg": None, "should_retry": False,
        "finished_at": r["finished_at"], "file_mounts_blob_id": None,
    } for r in rows]
    if a.output != "json":
        print("fake sky: only -o json is faked", file=a.err)
        return 2
    print(json.dumps(out), file=a.out)
    return 0


def api_cancel(api: Api, a: argparse.Namespace) -> int:
    plural = "s" if len(a.ids) != 1 else ""
    print(f"Cancelling {len(a.ids)} request{plural}: {', '.join(repr(i[:8]) for i in a.ids)}...", file=a.out)
    done = []
    db = api.advance()
    for r in db["requests"]:
        if r["status"] in ACTIVE and any(r["request_id"].startswith(i) for i in a.ids):
            r["status"], r["finished_at"] = "CANCELLED", time.time()
            done.append(r["request_id"])
    print(f"Cancelled {len(done)} request: {done[0]}" if len(done) == 1 else
          f"Cancelled {len(done)} requests." if done else "No requests need to be cancelled.", file=a.out)
    return 0


def api_logs(api: Api, a: argparse.Namespace) -> int:
    db = api.advance()
    found = [r for r in db["requests"] if r["request_id"].startswith(a.id)]
    if not found:
        print(f"Request {a.id} not found", file=a.err)
        return 1
    r = found[0]
    if r["status"] == "FAILED":
        print(r["error"], file=a.out)
        return 1
    print(f"{r['name']} {r['status'].lower()}", file=a.out)
    return 0


def status(api: Api, a: argparse.Namespace) -> int:
    cfg = api.cfg
    db = api.advance()
    clusters = list(db["clusters"].values())
    if a.clusters:
        clusters = [c for c in clusters if any(fnmatch.fnmatch(c["name"], p) for p in a.clusters)]
    if a.ip and a.output != "json":  # command.py _show_endpoint
        if len(a.clusters) != 1 or len(clusters) != 1:
            what = f"{a.clusters[0]!r} cluster not found" if a.clusters and not clusters else "No cluster specified"
            print(f"ValueError: {what}. Please specify a single cluster to show its IP address.\n"
                  "Usage: `sky status --ip <cluster>`", file=a.err)
            return 1
        if clusters[0]["status"] != "UP":
            print(f"RuntimeError: Cluster {clusters[0]['name']!r} is not in UP status.", file=a.err)
            return 1
        print(cfg["address"], file=a.out)
        return 0
    out = [{
        "name": c["name"], "launched_at": c["launched_at"], "last_use": "sky launch", "status": c["status"],
        "autostop": c["autostop"], "to_down": c["to_down"], "owner": None, "metadata": {}, "cluster_hash": "h",
        "cluster_ever_up": c["status"] == "UP", "user_hash": USER_HASH, "user_name": "root", "workspace": "default",
        "is_managed": False, "init_kind": "launching" if c["status"] == "INIT" else None,
        "resources_str": f"1x AWS({c['instance_type']})" if c["instances"] else None, "nodes": 1,
        "cloud": "AWS" if c["instances"] else None, "region": c["region"],
        "cluster_name_on_cloud": c["cluster_name_on_cloud"],
    } for c in clusters]
    if a.output != "json":
        print("fake sky: only -o json is faked", file=a.err)
        return 2
    print(json.dumps(out), file=a.out)
    return 0


def _accelerators(pattern: str, region: str | None, quantity: int | None) -> dict[str, list[dict[str, Any]]]:
    """sky/catalog/common.py list_accelerators_impl on CATALOG: the name is a case-insensitive
    regular expression searched in each name, so `T4` matches T4 and T4g; grouped by name (sorted),
    each group by price, one row per instance type."""
    import re

    found: dict[str, list[dict[str, Any]]] = {}
    for r in REGIONS:
        for kind, gpu, count, cpus, mem, dev, price, spot in CATALOG:
            if not re.search(pattern, gpu, re.IGNORECASE) or (region and not re.search(region, r, re.IGNORECASE)):
                continue
            if quantity is not None and count != quantity:
                continue
            found.setdefault(gpu, []).append({
                "cloud": "AWS", "instance_type": kind, "accelerator_name": gpu, "accelerator_count": float(count),
                "cpu_count": float(cpus), "device_memory": float(dev), "memory": float(mem), "price": price,
                "spot_price": spot, "region": r})
    out = {}
    for gpu in sorted(found):
        rows: dict[str, dict[str, Any]] = {}
        for row in sorted(found[gpu], key=lambda x: (x["price"], x["spot_price"])):
            rows.setdefault(row["instance_type"], row)  # drop_duplicates(keep='first') without the region
        out[gpu] = sorted(rows.values(), key=lambda x: (x["accelerator_count"], x["instance_type"], x["cpu_count"],
                                                        x["price"], x["spot_price"], x["region"]))
    return out


def _table(rows: list[list[str]]) -> str:
    """log_utils.create_table: prettytable without border, left-aligned, padding 0 left, 2 right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("".join(c.ljust(w + 2) for c, w in zip(r, widths, strict=True)) for r in rows)


def gpus(api: Api, a: argparse.Namespace) -> int:
    """`sky gpus list NAME[:QTY] --infra aws/REGION` (and the deprecated `sky show-gpus`)."""
    if a.cmd == "show-gpus":  # deprecation_utils._with_deprecation_warning, on stderr
        print("WARNING: `sky show-gpus` has been renamed to `sky gpus list` and will be removed in a future "
              "release. Please use the latter instead.\n", file=a.err)
    name, _, qty = a.gpu.partition(":")
    quantity = int(qty) if qty else None
    infra = (a.infra or "aws").split("/")
    region = infra[1] if len(infra) > 1 else None
    found = _accelerators(name, region, quantity)
    if getattr(a, "output", "table") == "json":
        print(json.dumps(found, indent=2), file=a.out)
        return 0
    if not found:
        qstr = f" with requested quantity {quantity}" if quantity else ""
        print(f"Resources '{name}'{qstr} not found on AWS. To show available accelerators, run: sky gpus list --all",
              file=a.out)
        return 0
    tables = []
    for gpu, items in found.items():
        rows = [["GPU", "QTY", "CLOUD", "INSTANCE_TYPE", "DEVICE_MEM", "vCPUs", "HOST_MEM", "HOURLY_PRICE",
                 "HOURLY_SPOT_PRICE", "REGION"]]
        for i in items:
            rows.append([gpu, str(i["accelerator_count"]), "AWS", i["instance_type"], f"{i['device_memory']:.0f}GB",
                         str(int(i["cpu_count"])), f"{i['memory']:.0f}GB", f"$ {i['price']:.3f}",
                         f"$ {i['spot_price']:.3f}", i["region"]])
        tables.append(_table(rows))
    print("\n\n".join(tables), file=a.out)  # each table's lines padded to their width, as prettytable does
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse writing to the call's stderr and raising its exit (the server is the test's process)."""

    err: io.StringIO

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            self.err.write(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            self.err.write(message)
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def parser(err: io.StringIO) -> argparse.ArgumentParser:
    class P(_Parser):
        pass

    P.err = err
    p = P(prog="sky")
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("launch")
    lp.add_argument("entrypoint", nargs="*")
    lp.add_argument("-c", "--cluster", required=True)
    lp.add_argument("-y", "--yes", action="store_true")
    lp.add_argument("--down", action="store_true")
    lp.add_argument("-i", "--idle-minutes-to-autostop", dest="idle", type=int)
    lp.add_argument("--async", dest="async_", action="store_true")
    lp.add_argument("--infra")
    lp.add_argument("--gpus")
    lp.add_argument("--use-spot", dest="spot", action="store_true", default=False)
    lp.add_argument("--no-use-spot", dest="spot", action="store_false")
    lp.add_argument("--env", action="append", default=[])
    lp.set_defaults(fn=launch)
    dp = sub.add_parser("down")
    dp.add_argument("clusters", nargs="*")
    dp.add_argument("-y", "--yes", action="store_true")
    dp.add_argument("-p", "--purge", action="store_true")
    dp.add_argument("--async", dest="async_", action="store_true")
    dp.set_defaults(fn=down)
    sp = sub.add_parser("status")
    sp.add_argument("clusters", nargs="*")
    sp.add_argument("-u", "--all-users", action="store_true")
    sp.add_argument("-r", "--refresh", action="store_true")
    sp.add_argument("-v", "--verbose", action="store_true")
    sp.add_argument("--ip", action="store_true")
    sp.add_argument("-o", "--output", default="table")
    sp.set_defaults(fn=status)
    gp = sub.add_parser("show-gpus")
    gp.add_argument("gpu")
    gp.add_argument("--infra")
    gp.set_defaults(fn=gpus)
    gl = sub.add_parser("gpus").add_subparsers(dest="gpus", required=True).add_parser("list")
    gl.add_argument("gpu")
    gl.add_argument("--infra")
    gl.add_argument("-o", "--output", default="table")
    gl.set_defaults(fn=gpus)
    ap = sub.add_parser("api")
    asub = ap.add_subparsers(dest="api", required=True)
    st = asub.add_parser("status")
    st.add_argument("ids", nargs="*")
    st.add_argument("-a", "--all-status", dest="all", action="store_true")
    st.add_argument("-v", "--verbose", action="store_true")
    st.add_argument("-l", "--limit", default="50")
    st.add_argument("-c", "--cluster")
    st.add_argument("-o", "--output", default="table")
    st.set_defaults(fn=api_status)
    ca = asub.add_parser("cancel")
    ca.add_argument("ids", nargs="*")
    ca.add_argument("-y", "--yes", action="store_true")
    ca.set_defaults(fn=api_cancel)
    lo = asub.add_parser("logs")
    lo.add_argument("id")
    lo.add_argument("--follow", action="store_true", default=True)
    lo.add_argument("--no-follow", dest="follow", action="store_false")
    lo.set_defaults(fn=api_logs)
    return p


# --- the skylet ------------------------------------------------------------------------------------


def has_active_ssh_sessions(sshd_pid: int | None) -> bool:
    """skylet/autostop_lib.py has_active_ssh_sessions, on the processes under the test's sshd only
    (the machine is shared): a process on a /dev/pts terminal with an `sshd` among its parents."""
    import psutil

    if sshd_pid is None:
        return False
    # as SkyPilot does each tick: psutil caches the /dev/pts map at its first use (issue 9524 there)
    with contextlib.suppress(AttributeError):
        psutil._psposix.get_terminal_map.cache_clear()  # type: ignore[attr-defined]
    try:
        procs = psutil.Process(sshd_pid).children(recursive=True)
    except psutil.Error:
        return False
    for proc in procs:
        try:
            terminal = proc.terminal()
            if terminal and terminal.startswith("/dev/pts/") and any(
                    parent.name() in ("sshd", "dropbear") for parent in proc.parents()):
                return True
        except psutil.Error:
            continue
    return False


def _sshd_pid(cfg: dict[str, Any]) -> int | None:
    """The test's sshd, from its pid file (read each time: a test may restart it); while sshd is
    rewriting the file, the pid last read."""
    path = Path(cfg.get("sshd_pidfile") or "/nonexistent")
    with contextlib.suppress(OSError, ValueError, IndexError):
        cfg["sshd_pid"] = int(path.read_text().split()[0])
    pid: int | None = cfg.get("sshd_pid")
    return pid


class Skylet:
    """A cluster's skylet: runs its job, autostops it as sky/skylet/events.py StopEvent does (each
    minute: not idle resets the timer; idle for `autostop` whole minutes tears it down), and ends
    with the cluster (a `sky down`, a forget, the server's stop) or after `skylet_max_s`."""

    def __init__(self, api: Api, cluster: dict[str, Any]) -> None:
        self.api, self.cluster = api, cluster
        self.ended = threading.Event()
        with api.log.open("ab") as log:
            self.job = subprocess.Popen(["bash", "-c", cluster["run"] or "true"], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, start_new_session=True)
        self.thread = threading.Thread(target=self._run, name=f"fake-sky-skylet-{cluster['name']}", daemon=True)
        self.thread.start()

    def end(self) -> None:
        """The cluster went: its job ends (its whole session), and the timer with it (its thread
        ends at its next look: `stop` joins it)."""
        self.ended.set()
        if self.job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.job.pid, signal.SIGKILL)
        self.job.wait()

    def _run(self) -> None:
        api, cluster, name = self.api, self.cluster, self.cluster["name"]
        minute = float(api.cfg.get("minute_s", 60.0))
        last_active = time.time()
        end = time.time() + float(api.cfg.get("skylet_max_s", 900))
        while time.time() < end and not self.ended.wait(minute):  # StopEvent.EVENT_INTERVAL_SECONDS
            with api.lock:
                now = api.db["clusters"].get(name)
                if now is None or now["instances"] != cluster["instances"]:
                    break  # torn down by someone else, or forgotten
            if cluster["autostop"] < 0:
                continue
            idle = self.job.poll() is not None and not has_active_ssh_sessions(_sshd_pid(api.cfg))
            if not idle:
                last_active = time.time()
                continue
            if (time.time() - last_active) // minute >= cluster["autostop"] and cluster["to_down"]:
                with api.lock:
                    if api.db["clusters"].get(name, {}).get("instances") != cluster["instances"]:
                        break
                    api.db["clusters"].pop(name)
                    api.db["autodowns"].append({"name": name, "at": time.time()})
                    api._end_instances(cluster)
                    with contextlib.suppress(ValueError):
                        api.skylets.get(name, []).remove(self)
                    api.cluster_gone(name)
                if api.cfg.get("root"):
                    power_off(Path(api.cfg["root"]))
                break
        self.end()


# --- the server ------------------------------------------------------------------------------------


def answer(api: Api, argv: list[str]) -> tuple[int, str, str]:
    """One `sky` command line: its exit code, stdout and stderr (or HANG)."""
    out, err = io.StringIO(), io.StringIO()
    with api.lock:
        if argv[:1] == ["gpus"] and api.faults.get("old_cli"):  # a CLI before `sky gpus` (click's error)
            return 2, "", ("Usage: sky [OPTIONS] COMMAND [ARGS]...\nTry 'sky -h' for help.\n\n"
                           "Error: No such command 'gpus'.\n")
        try:
            args = parser(err).parse_args(argv)
        except _Exit as exc:
            return exc.code, out.getvalue(), err.getvalue()
        api.argvs.append(list(argv))
        args.out, args.err = out, err
        code: int = args.fn(api, args)
    return code, out.getvalue(), err.getvalue()


class _Handler(socketserver.StreamRequestHandler):
    """One connection: a JSON line in (`{"argv"}` from `sky`, or `{"op"}` from the test's side),
    one JSON answer out."""

    server: _Server

    def handle(self) -> None:
        api = self.server.api
        msg = json.loads(self.rfile.readline() or b"{}")
        if "argv" in msg:
            try:
                code, out, err = answer(api, msg["argv"])
            except Exception:  # a fault of the fake's own: the caller sees it
                import traceback

                code, out, err = 1, "", f"fake sky: the API server failed:\n{traceback.format_exc()}"
            if code == HANG:
                self.server.hanging.add(self.connection)
                self.rfile.read()  # until the client is killed, or the server stops
                return
            reply = json.dumps({"code": code, "out": out, "err": err})
        else:
            reply = self.server.op(msg)
        with contextlib.suppress(OSError):  # the client was killed meanwhile (its timeout)
            self.wfile.write(reply.encode() + b"\n")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = False
    block_on_close = True  # server_close joins every call's thread

    def __init__(self, api: Api) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api
        self.hanging: set[socket.socket] = set()

    def op(self, msg: dict[str, Any]) -> str:
        """The test's side: its answer as JSON, read under the lock (skylets change the state)."""
        api = self.api
        with api.lock:
            if msg["op"] == "db":
                return json.dumps(api.db)
            if msg["op"] == "faults":
                api.faults = msg["faults"]
                return "null"
            if msg["op"] == "forget":
                return json.dumps(api.db["clusters"].pop(msg["name"]))
            if msg["op"] == "argvs":
                return json.dumps(api.argvs)
        raise ValueError(f"unknown op {msg['op']!r}")


def end_processes(procs: list[Any]) -> None:
    """KILL each and wait for it (a terminated instance: nothing runs on to clean up)."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


# --- the test's side -------------------------------------------------------------------------------


class FakeSky:
    """The fake's API server (threads of the test's process, on 127.0.0.1) and the `sky` that talks
    to it. `stop` ends the server, every skylet and job, and what came in over SSH."""

    def __init__(self, dir: Path, *, address: str, ec2_endpoint: str, launch_s: float = 0.3,
                 down_s: float = 0.2, minute_s: float = 60.0, root: Path | None = None,
                 sshd_pidfile: Path | None = None) -> None:
        """`minute_s`: how long a minute of skylet's autostop lasts here; `root`: what a cluster's
        power off ends (every process naming it); `sshd_pidfile`: the sshd whose sessions count."""
        self.state = Path(dir)
        self.state.mkdir(parents=True, exist_ok=True)
        self.ec2_endpoint = ec2_endpoint
        cfg = {"address": address, "ec2_endpoint": ec2_endpoint, "launch_s": launch_s, "down_s": down_s,
               "minute_s": minute_s, "root": str(root) if root else "",
               "sshd_pidfile": str(sshd_pidfile) if sshd_pidfile else ""}
        self.api = Api(cfg, self.state / "skylets.log")
        self.server = _Server(self.api)
        self.port: int = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fake-sky-api", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self.api, self.server, self._thread)
        self.command = self.state / "sky"
        self.command.write_text(f"#!/bin/sh\nexport FAKE_SKY_API=127.0.0.1:{self.port}\n"
                                f"exec '{sys.executable}' -I -S '{CLIENT}' \"$@\"\n")
        self.command.chmod(0o755)

    def _ask(self, msg: dict[str, Any]) -> Any:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as conn:
            conn.sendall(json.dumps(msg).encode() + b"\n")
            with conn.makefile("rb") as f:
                return json.loads(f.readline())

    def set_faults(self, **faults: Any) -> None:
        self._ask({"op": "faults", "faults": faults})

    def db(self) -> dict[str, Any]:
        db: dict[str, Any] = self._ask({"op": "db"})
        return db

    def clusters(self) -> dict[str, Any]:
        return dict(self.db()["clusters"])

    def forget(self, name: str) -> dict[str, Any]:
        """The cluster's record vanishes (as after `sky down --purge`); its instance runs on."""
        cluster: dict[str, Any] = self._ask({"op": "forget", "name": name})
        return cluster

    def argvs(self) -> list[list[str]]:
        """Every command line `sky` was called with, as its argv (after `sky`)."""
        argvs: list[list[str]] = self._ask({"op": "argvs"})
        return argvs

    def calls(self) -> list[str]:
        return [" ".join(argv) for argv in self.argvs()]

    def autodowns(self) -> list[dict[str, Any]]:
        """The clusters skylet tore down by itself (autostop with --down), with when."""
        return list(self.db()["autodowns"])

    def stop(self) -> None:
        """End the server, every skylet and cluster job, and what came in over SSH (every cluster
        is terminated with it); waits for all of them."""
        self._finalizer()


def _stop(api: Api, server: _Server, thread: threading.Thread) -> None:
    api.stopping.set()
    server.shutdown()
    thread.join(timeout=30)
    with api.lock:
        for sock in server.hanging:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        api.skylets.clear()
        skylets = list(api.every_skylet)
    for s in skylets:
        s.end()
        s.thread.join(timeout=30)
    end_processes(api.cluster_processes())
    server.server_close()  # joins the calls' threads


def power_off(root: Path) -> None:
    """What a terminated instance does to what runs on it: every process naming its root ends."""
    import psutil

    marker = str(root)
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
                procs.append(p)
    end_processes(procs)


def aws_env() -> dict[str, str]:
    """Dummy credentials and no instance metadata: nothing may reach AWS itself."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds"}
