"""A fake `sky` (SkyPilot 0.14 CLI, client-server) for tests: the command grammar, request ids and
JSON output of SkyPilot 0.14 (its CLI as observed), with clusters that are real logins on a test sshd
and instances recorded in a moto EC2 server, tagged the way SkyPilot tags them.

As a program (`FakeSky.install` writes an executable wrapper that runs this file) it keeps its
state in one JSON file under $FAKE_SKY_STATE, locked per call. The API server is played lazily:
a submitted request carries the moment it is due, and any later call (`sky api status`, `sky
status`, ...) first moves every due request to its end (instances are made or terminated in moto
then). Faults are read from `faults.json` beside the state, which a test may rewrite at any time:

    unavailable: [region, ...]   a launch there FAILS with ResourcesUnavailableError, nothing made
    provision: "fail"            a launch makes its instance, then FAILS (the cluster stays, INIT)
    launch: "never" | "hang"     a launch request stays RUNNING forever / `sky launch` hangs after submitting
    down: "fail" | "hang"        a down request FAILS / the `sky down` command itself hangs

As a library, `FakeSky` is the test's side: install, set faults, read clusters, forget a cluster
(its record vanishes while its instance runs), count live instances.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

USER_HASH = "2ea4"
USER_ID = "fcd1e5cf"
REGIONS = ("us-east-1", "us-east-2", "us-west-2")
PRICES = {"A10G": ("g5.xlarge", 1.006, 0.4024), "A100": ("p4d.24xlarge", 32.7726, 11.5719)}
ACTIVE = ("PENDING", "WAITING", "RUNNING")
LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]


# --- the state -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[dict[str, Any]]:
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = state / "db.json"
        db = json.loads(path.read_text()) if path.exists() else {"requests": [], "clusters": {}}
        yield db
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(db, indent=1))
        tmp.replace(path)
    finally:
        os.close(fd)


def _config(state: Path) -> dict[str, Any]:
    return json.loads((state / "config.json").read_text())


def _faults(state: Path) -> dict[str, Any]:
    path = state / "faults.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _ec2(state: Path, region: str) -> Any:
    import boto3  # only when an instance is made or ended: it costs a fraction of a second

    return boto3.client("ec2", region_name=region, endpoint_url=_config(state)["ec2_endpoint"])


def _make_instance(state: Path, cluster: dict[str, Any], token: str) -> None:
    """Its instance, made once per request however often this is cut short (EC2's ClientToken)."""
    on_cloud = cluster["cluster_name_on_cloud"]
    tags = [{"Key": "skypilot-cluster-name", "Value": on_cloud}, {"Key": "ray-cluster-name", "Value": on_cloud},
            {"Key": "ray-node-type", "Value": "head"}, {"Key": "Name", "Value": f"{on_cloud}-head"},
            {"Key": "skypilot-user", "Value": "root"}]
    got = _ec2(state, cluster["region"]).run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType=cluster["instance_type"], ClientToken=token,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    cluster["instances"] = [i["InstanceId"] for i in got["Instances"]]


def _end_instances(state: Path, cluster: dict[str, Any]) -> None:
    if cluster.get("instances"):
        _ec2(state, cluster["region"]).terminate_instances(InstanceIds=cluster["instances"])


def _advance(state: Path, db: dict[str, Any]) -> None:
    """Move every due request to its end, as the API server would have by now."""
    now = time.time()
    faults = _faults(state)
    for r in db["requests"]:
        if r["status"] not in ACTIVE:
            continue
        if r["status"] == "PENDING":
            r["status"] = "RUNNING"
        if now < r["due"]:
            continue
        if r["name"] == "sky.launch":
            _finish_launch(state, db, r, faults)
        elif r["name"] == "sky.down":
            _finish_down(state, db, r, faults)
        if r["status"] not in ACTIVE:
            r["finished_at"] = now


def _finish_launch(state: Path, db: dict[str, Any], r: dict[str, Any], faults: dict[str, Any]) -> None:
    if faults.get("launch") in ("never", "hang"):
        return
    p = r["params"]
    if p["region"] in faults.get("unavailable", []):
        r["status"] = "FAILED"
        r["error"] = ("sky.exceptions.ResourcesUnavailableError: Failed to provision all possible launchable "
                      f"resources. Relax the task's resource requirements: 1x AWS({p['instance_type']}) "
                      f"in {p['region']}")
        return
    cluster = db["clusters"].get(r["cluster_name"])
    if cluster is None:
        cluster = {
            "name": r["cluster_name"], "status": "INIT", "launched_at": int(time.time()), "region": p["region"],
            "cluster_name_on_cloud": f"{r['cluster_name']}-{USER_HASH}", "instance_type": p["instance_type"],
            "autostop": p["idle"], "to_down": p["down"], "use_spot": p["spot"], "instances": [],
        }
        db["clusters"][cluster["name"]] = cluster
        _make_instance(state, cluster, r["request_id"])
    if faults.get("provision") == "fail":
        r["status"] = "FAILED"
        r["error"] = f"RuntimeError: Failed to set up {r['cluster_name']}: the setup command exited 1"
        return
    cluster["status"] = "UP"
    r["status"] = "SUCCEEDED"


def _finish_down(state: Path, db: dict[str, Any], r: dict[str, Any], faults: dict[str, Any]) -> None:
    if faults.get("down") == "fail":
        r["status"] = "FAILED"
        r["error"] = "sky.exceptions.ClusterOwnerIdentityMismatchError: could not terminate the cluster"
        return
    cluster = db["clusters"].pop(r["cluster_name"], None)
    if cluster is not None:
        _end_instances(state, cluster)
    r["status"] = "SUCCEEDED"


def _submit(db: dict[str, Any], name: str, cluster: str, due_s: float, **params: Any) -> str:
    rid = str(uuid.uuid4())
    db["requests"].append({"request_id": rid, "name": name, "cluster_name": cluster, "status": "PENDING",
                           "created_at": time.time(), "finished_at": None, "due": time.time() + due_s,
                           "error": None, "params": params})
    return rid


def _submitted(verb: str, rid: str) -> None:
    print(f"Submitted sky.{verb} request: {rid}")
    print(f"├── Check logs with: sky api logs {rid[:8]}")
    print(f"└── To cancel the request, run: sky api cancel {rid[:8]}")


# --- the commands ----------------------------------------------------------------------------------


def launch(state: Path, a: argparse.Namespace) -> int:
    cfg = _config(state)
    parts = (a.infra or "aws").split("/")
    region = parts[1] if len(parts) > 1 else REGIONS[0]
    if parts[0].lower() != "aws" or region not in REGIONS:
        print(f"sky.exceptions.InvalidCloudConfigs: unknown infra {a.infra}", file=sys.stderr)
        return 1
    if not a.async_:
        print("fake sky: launch without --async is not faked", file=sys.stderr)
        return 2
    gpu = (a.gpus or "").split(":")[0]
    with _locked(state) as db:
        _advance(state, db)
        rid = _submit(db, "sky.launch", a.cluster, cfg.get("launch_s", 0.3), region=region,
                      instance_type=PRICES.get(gpu, ("m6i.large",))[0], idle=a.idle, down=a.down, spot=a.spot,
                      gpu=gpu)
    if _faults(state).get("launch") == "hang":  # submitted, then no answer: the client cannot know
        time.sleep(3600)
    print(f"Command to run: {' '.join(a.entrypoint)}")
    print(f"Running on cluster: {a.cluster}")
    _submitted("launch", rid)
    return 0


def down(state: Path, a: argparse.Namespace) -> int:
    if _faults(state).get("down") == "hang":
        time.sleep(3600)
    cfg = _config(state)
    with _locked(state) as db:
        _advance(state, db)
        names = [c for c in db["clusters"] if any(fnmatch.fnmatch(c, p) for p in a.clusters)]
        missing = [p for p in a.clusters if not any(fnmatch.fnmatch(c, p) for c in db["clusters"])]
        rids = [_submit(db, "sky.down", n, cfg.get("down_s", 0.2), purge=a.purge) for n in names]
        if a.purge:
            for n in names:
                db["clusters"].pop(n, None)
    if missing:
        print(f"Cluster(s) not found: {', '.join(missing)}.")
    for rid in rids:
        _submitted("down", rid)
    return 0


def api_status(state: Path, a: argparse.Namespace) -> int:
    with _locked(state) as db:
        _advance(state, db)
        rows = [r for r in db["requests"] if a.all or r["status"] in ACTIVE]
    if a.ids:
        rows = [r for r in rows if any(r["request_id"].startswith(i) for i in a.ids)]
    limit = None if a.limit in ("none", "all") else int(a.limit)
    rows = rows[-limit:] if limit else rows
    out = [{
        "request_id": r["request_id"], "name": r["name"], "entrypoint": "", "request_body": "null",
        "status": r["status"], "created_at": r["created_at"], "user_id": USER_ID, "return_value": "null",
        "error": "null", "pid": None, "schedule_type": "long", "user_name": "root",
        "cluster_name": r["cluster_name"] if a.verbose else None, "status_msg": None, "should_retry": False,
        "finished_at": r["finished_at"], "file_mounts_blob_id": None,
    } for r in rows]
    if a.output != "json":
        print("fake sky: only -o json is faked", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def api_cancel(state: Path, a: argparse.Namespace) -> int:
    plural = "s" if len(a.ids) != 1 else ""
    print(f"Cancelling {len(a.ids)} request{plural}: {', '.join(repr(i[:8]) for i in a.ids)}...")
    done = []
    with _locked(state) as db:
        _advance(state, db)
        for r in db["requests"]:
            if r["status"] in ACTIVE and any(r["request_id"].startswith(i) for i in a.ids):
                r["status"], r["finished_at"] = "CANCELLED", time.time()
                done.append(r["request_id"])
    print(f"Cancelled {len(done)} request: {done[0]}" if len(done) == 1 else
          f"Cancelled {len(done)} requests." if done else "No requests need to be cancelled.")
    return 0


def api_logs(state: Path, a: argparse.Namespace) -> int:
    with _locked(state) as db:
        _advance(state, db)
        found = [r for r in db["requests"] if r["request_id"].startswith(a.id)]
    if not found:
        print(f"Request {a.id} not found", file=sys.stderr)
        return 1
    r = found[0]
    if r["status"] == "FAILED":
        print(r["error"])
        return 1
    print(f"{r['name']} {r['status'].lower()}")
    return 0


def status(state: Path, a: argparse.Namespace) -> int:
    cfg = _config(state)
    with _locked(state) as db:
        _advance(state, db)
        clusters = list(db["clusters"].values())
    if a.ip:
        found = [c for c in clusters if c["name"] == a.ip]
        if not found:
            print(f"Cluster {a.ip} not found.", file=sys.stderr)
            return 1
        print(cfg["address"])
        return 0
    if a.clusters:
        clusters = [c for c in clusters if any(fnmatch.fnmatch(c["name"], p) for p in a.clusters)]
    out = [{
        "name": c["name"], "launched_at": c["launched_at"], "last_use": "sky launch", "status": c["status"],
        "autostop": c["autostop"], "to_down": c["to_down"], "owner": None, "metadata": {}, "cluster_hash": "h",
        "cluster_ever_up": c["status"] == "UP", "user_hash": USER_HASH, "user_name": "root", "workspace": "default",
        "is_managed": False, "init_kind": None, "resources_str": f"1x AWS({c['instance_type']})", "nodes": 1,
        "cloud": "AWS", "region": c["region"], "cluster_name_on_cloud": c["cluster_name_on_cloud"],
    } for c in clusters]
    if a.output != "json":
        print("fake sky: only -o json is faked", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def show_gpus(state: Path, a: argparse.Namespace) -> int:
    gpu = a.gpu.split(":")[0]
    region = (a.infra or "aws/us-east-1").split("/")[1]
    if gpu not in PRICES:
        print(f"Resources '{a.gpu}' not found in AWS.", file=sys.stderr)
        return 1
    kind, price, spot = PRICES[gpu]
    print("GPU    QTY  CLOUD  INSTANCE_TYPE  DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION")
    print(f"{gpu:<5}  1    AWS    {kind:<13}  24GB        4      16GB      $ {price:.3f}       $ {spot:.3f}"
          f"            {region}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sky")
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
    sp.add_argument("--ip", metavar="CLUSTER")
    sp.add_argument("-o", "--output", default="table")
    sp.set_defaults(fn=status)
    gp = sub.add_parser("show-gpus")
    gp.add_argument("gpu")
    gp.add_argument("--infra")
    gp.set_defaults(fn=show_gpus)
    ap = sub.add_parser("api")
    asub = ap.add_subparsers(dest="api", required=True)
    st = asub.add_parser("status")
    st.add_argument("ids", nargs="*")
    st.add_argument("-a", "--all-status", dest="all", action="store_true")
    st.add_argument("-v", "--verbose", action="store_true")
    st.add_argument("-l", "--limit", default="50")
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


def main() -> int:
    state = Path(os.environ["FAKE_SKY_STATE"])
    args = parser().parse_args()
    with (state / "calls.log").open("a") as log:
        log.write(" ".join(sys.argv[1:]) + "\n")
    code: int = args.fn(state, args)
    return code


# --- the test's side -------------------------------------------------------------------------------


class FakeSky:
    """The fake's state folder and the wrapper that runs it as `sky`."""

    def __init__(self, dir: Path, *, address: str, ec2_endpoint: str, launch_s: float = 0.3,
                 down_s: float = 0.2) -> None:
        self.state = Path(dir)
        self.state.mkdir(parents=True, exist_ok=True)
        self.ec2_endpoint = ec2_endpoint
        (self.state / "config.json").write_text(json.dumps(
            {"address": address, "ec2_endpoint": ec2_endpoint, "launch_s": launch_s, "down_s": down_s}))
        self.command = self.state / "sky"
        env = {"FAKE_SKY_STATE": str(self.state), **aws_env()}
        exports = "".join(f"export {k}='{v}'\n" for k, v in env.items())
        self.command.write_text(f"#!/bin/sh\n{exports}exec '{sys.executable}' '{Path(__file__).resolve()}' \"$@\"\n")
        self.command.chmod(0o755)

    def set_faults(self, **faults: Any) -> None:
        (self.state / "faults.json").write_text(json.dumps(faults))

    def db(self) -> dict[str, Any]:
        with _locked(self.state) as db:
            return db

    def clusters(self) -> dict[str, Any]:
        return dict(self.db()["clusters"])

    def forget(self, name: str) -> dict[str, Any]:
        """The cluster's record vanishes (as after `sky down --purge`); its instance runs on."""
        with _locked(self.state) as db:
            cluster: dict[str, Any] = db["clusters"].pop(name)
            return cluster

    def calls(self) -> list[str]:
        path = self.state / "calls.log"
        return path.read_text().splitlines() if path.exists() else []


def power_off(root: Path) -> None:
    """What a terminated instance does to what runs on it: every process naming its root ends."""
    import psutil

    marker = str(root)
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
                procs.append(p)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def aws_env() -> dict[str, str]:
    """Dummy credentials and no instance metadata: nothing may reach AWS itself."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-creds"}


if __name__ == "__main__":
    sys.exit(main())
