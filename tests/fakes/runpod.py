"""A fake RunPod (REST v2 pods and GPU catalog) on loopback, held to RunPod's own OpenAPI document;
its pods are real sshd logins (fakes/machines.py) with the env RunPod gives a pod (RUNPOD_POD_ID
and a pod-scoped RUNPOD_API_KEY that may delete that pod and nothing else).

Faults, set on the instance (under `fake.lock` when a test runs):
    stock[(gpu id, data center)] = n    what may be created where (0: "no instances available")
    create_500_made = n                 the next n creates make the pod, then answer 500
    create_500 = n                      the next n creates answer 500 and make nothing
    stuck = True                        new pods stay PROVISIONING
    lag_reads = n                       a new pod is missing from the next n reads and listings
    delete_fail = n                     the next n deletes answer 500 and delete nothing
    rate_limit(n, retry_after)          the next n requests answer 429 with Retry-After
    token = "..."                       the account key it accepts (another one: 401)
    ready_after = n                     reads of a pod before it is RUNNING with ssh.direct
    ssh_after_s = s                     RUNNING comes before the container's sshd: it opens s later;
                                        meanwhile its port does `guest_before` (refuse, drop, silent)
    launch_answers = [...]              what the next creates answer before anything else: "no_stock"
                                        (the documented 500 "no instances available") or "fail" (the
                                        pod is made and goes EXITED: its container could not start)
    cuda[dc] = "12.8"                   each data center's host CUDA (the catalog's `cudaVersions`; the
                                        `minCudaVersion` filter and the create's gpu.minCudaVersion)
    smi = {...}                         what `nvidia-smi` on the next pods lists (fakes/machines.py `gpu_tools`):
    smi_next = [...]                    "wrong" (another class), "few" (one GPU less), "none"; skew_next = [s, ...]
                                        the next pods' clocks that many seconds off
Network volumes (`/v2/network-volumes`): made in a data center of `volume_dcs` (VOLUME_DCS) (elsewhere 400, as
RunPod answers for a data center without network storage), each a folder of the fake's; a pod created
with `mounts.network` must be in its volume's data center (400 otherwise), and sees it at the mount's
path (an absolute path on this computer: a link to the volume's folder while the pod lives).
`volumes` holds them by id; `volumes_made` the id of every one made, deleted or not.
Stock is counted in GPUs: a pod of `gpu.count` takes that many from its data center; the catalog
lists a data center for `count=n` only where n are free (runpod-rest-v2.json: dataCenters lists "only
the datacenters that offer this GPU in the requested configuration").
`stale(name)` puts a pod named so on the account, as an earlier controller left it (RUNNING).
`vanish(pod_id)` takes a pod away (its sshd and folder) as a failed host would.
`billed` keeps each deleted pod's (name, seconds it existed, cost per hour).
"""

from __future__ import annotations

import datetime
import itertools
import shutil
import time
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from actor_run.protocols.messages import Offer
from fakes.openapi_server import OPENAPI, json_response
from fakes.rented import RentedFake

DOCUMENT = OPENAPI / "runpod-rest-v2.json"
VOLUME_DCS = ("EU-RO-1", "US-TX-3")  # the data centers with network storage here

GPUS = {  # id -> (name, secure price, community price, memory)
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 2.99, 2.69, 80),
    "NVIDIA A100-SXM4-80GB": ("A100 SXM", 1.89, 1.39, 80),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 0.69, 0.34, 24),
}


def _cuda(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"title": title, "status": status, "detail": detail}, status,
                         content_type="application/problem+json", headers=headers)


class FakeRunPod(RentedFake):
    CLOUD = "runpod"
    KEY_VAR = "RUNPOD_API_KEY"
    GPUS = ("H100", "A100-80G")  # for batches: the first is made out of stock, the second has some

    def settings(self) -> dict[str, Any]:
        """What `[clouds.runpod]` needs beyond api_url and ssh_key to reach this fake's pods."""
        return {}

    def sample_offer(self) -> Offer:
        return Offer(cloud="runpod", region="EU-RO-1", gpu="A100-80G", hourly_usd=1.89, kind="NVIDIA A100-SXM4-80GB")

    def __init__(self, dir: Path, *, token: str = "test-key", virtual: bool = False) -> None:
        super().__init__(DOCUMENT, Path(dir) / "pods", token=token, virtual=virtual)
        self.volume_dir = Path(dir) / "volumes"
        self.volumes: dict[str, dict[str, Any]] = {}
        self.volumes_made: list[str] = []
        self.volume_dcs = set(VOLUME_DCS)
        self.pods: dict[str, dict[str, Any]] = {}
        self.stock: dict[tuple[str, str], int] = {
            ("NVIDIA A100-SXM4-80GB", "EU-RO-1"): 12, ("NVIDIA A100-SXM4-80GB", "US-TX-3"): 4,
            ("NVIDIA H100 80GB HBM3", "US-TX-3"): 2, ("NVIDIA GeForce RTX 4090", "EU-RO-1"): 8,
            ("NVIDIA A100-SXM4-80GB", "CA-MTL-1"): 8,
        }
        # each data center's host CUDA; CA-MTL-1's hosts run an old driver (12.2)
        self.cuda: dict[str, str] = {"EU-RO-1": "12.8", "US-TX-3": "12.8", "CA-MTL-1": "12.2"}
        self.self_deleted: list[str] = []  # pods deleted with their own pod-scoped key
        self._ids = itertools.count(1)
        self._routes()

    # --- the vendor's shapes ----------------------------------------------------------------------

    def unauthorized(self) -> Response:
        return problem(401, "Unauthorized", "invalid or missing API key")

    def too_many(self, retry_after: float) -> Response:
        return problem(429, "Too Many Requests", "rate limit exceeded for window minute",
                       headers={"Retry-After": f"{int(retry_after)}"})

    def not_found(self) -> Response:
        return problem(404, "Not Found", "pod not found")

    def invalid(self, problem_text: str) -> Response:
        return problem(400, "Bad Request", problem_text)

    def server_error(self) -> Response:
        """The v2 document's `default` answer, `ErrorResponse` as problem+json (runpod.md §1)."""
        return problem(500, "Internal Server Error", "an internal error occurred")

    def authorized_other(self, req: Request, template: str, params: dict[str, str]) -> bool:
        # a pod's own key: it may delete that pod (runpod.md §10)
        pod = self.pods.get(params.get("id", ""))
        ok = (req.method == "DELETE" and template == "/v2/pods/{id}" and pod is not None
              and req.headers.get("Authorization") == f"Bearer {pod['_key']}")
        if ok:
            self.self_deleted.append(pod["name"])
        return ok

    # --- pods -------------------------------------------------------------------------------------

    def _advance(self, pod: dict[str, Any]) -> None:
        pod["_reads"] += 1
        if pod["status"] == "PROVISIONING" and pod["_fail"] and pod["_reads"] >= self.ready_after:
            pod["status"] = "EXITED"
            pod["cost"] = 0.0
        elif pod["status"] == "PROVISIONING" and not self.stuck and pod["_reads"] >= self.ready_after:
            port = pod["_port"]
            if not self.virtual:
                self.boxes.boot(pod["id"], self.ssh_after_s, before=self.guest_before)
            pod["status"] = "RUNNING"
            pod["startedAt"] = _iso(time.time())
            pod["ssh"] = {"proxy": None, "direct": {
                "host": "127.0.0.1", "port": port, "username": pod["_user"],
                "command": f"ssh {pod['_user']}@127.0.0.1 -p {port}"}}

    def _make(self, body: dict[str, Any], dc: str) -> dict[str, Any]:
        n = next(self._ids)
        pod_id = f"pod{n:04d}x{int(time.time()) % 100000:05d}"
        gpu_id = body["gpu"]["id"]
        count = int(body["gpu"].get("count", 1))
        price = GPUS[gpu_id][1 if body.get("cloud", "SECURE") == "SECURE" else 2] * count
        key = f"pod-scoped-{pod_id}"
        pub = body.get("env", {}).get("PUBLIC_KEY", "")
        if self.virtual:
            port, user = 1, "root"
        else:  # its container's sshd comes up after RUNNING (boot, in _advance)
            port = self.boxes.plan(pod_id, pub, env={"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": key,
                                                     "RUNPOD_DC_ID": dc}, tools=self._tools(gpu_id, count))
            user = self.boxes.user
        now = time.time()
        pod = {
            "id": pod_id, "name": body["name"], "status": "PROVISIONING", "actions": ["stop", "terminate"],
            "image": body.get("image", ""), "args": "", "disk": body.get("disk", 50), "mounts": {},
            "ports": body.get("ports", []), "env": {k: v for k, v in body.get("env", {}).items()},
            "registry": None, "cloud": body.get("cloud", "SECURE"), "dataCenterId": dc,
            "cudaVersion": self.cuda.get(dc, "12.8"),
            "ssh": {"proxy": None, "direct": None}, "template": None, "cost": price, "locked": False,
            "runtime": None, "createdAt": _iso(now), "startedAt": None, "globalNetworking": {"enabled": False},
            "gpu": {"id": gpu_id, "count": count},
            "_reads": 0, "_lag": self.lag_reads, "_key": key, "_port": port, "_user": user, "_t0": now,
            "_fail": False,
        }
        for mount in (body.get("mounts") or {}).get("network") or []:  # the volume, at its path
            pod["mounts"] = {"network": [dict(mount)]}
            if self.virtual:
                continue  # no machine: nothing sees it
            link = Path(mount["path"])
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink():
                link.unlink()
            link.symlink_to(self.volume_dir / mount["volumeId"])
            pod["_links"] = [str(link)]
        self.pods[pod_id] = pod
        self.stock[(gpu_id, dc)] -= count
        return pod

    def _gone(self, pod_id: str) -> None:
        pod = self.pods.pop(pod_id)
        for link in pod.get("_links", []):  # its volume stays; the pod no longer sees it
            if Path(link).is_symlink():
                Path(link).unlink()
        self.stock[(pod["gpu"]["id"], pod["dataCenterId"])] += pod["gpu"]["count"]
        self.billed.append((pod["name"], time.time() - pod["_t0"], pod["cost"]))
        self.boxes.vanish(pod_id)

    def _volume_view(self, vol: dict[str, Any]) -> dict[str, Any]:
        return dict(vol)

    def vanish(self, pod_id: str) -> None:
        """The host failed: the pod is gone without anyone deleting it (its sshd too)."""
        with self.lock:
            self._gone(pod_id)

    def alive(self) -> list[str]:
        with self.lock:
            return sorted(p["name"] for p in self.pods.values())

    def stale(self, name: str) -> str:
        """A RUNNING pod named `name` already on the account (no sshd: nobody will log in); its id."""
        with self.lock:
            gpu_id, dc = next(k for k, n in self.stock.items() if n > 0)
            with self._without_sshd():
                pod = self._make({"name": name, "gpu": {"id": gpu_id, "count": 1}, "image": "old"}, dc)
            pod["status"], pod["startedAt"] = "RUNNING", pod["createdAt"]
            return str(pod["id"])

    def _routes(self) -> None:
        @self.route("GET", "/v2/catalog/gpus")
        def catalog(req: Request) -> Response:
            cloud = req.args.get("cloud", "SECURE")
            count = int(req.args.get("count", "1"))
            floor = _cuda(req.args.get("minCudaVersion", "0"))
            gpus = []
            for gpu_id, (name, secure, community, memory) in GPUS.items():
                # the data centers with this GPU in the asked configuration: `count` of them, on a host CUDA at
                # or above the floor (a bare major "12" is any 12.x)
                dcs = sorted({dc for (g, dc) in self.stock if g == gpu_id
                              and _cuda(self.cuda.get(dc, "12.8"))[:len(floor)] >= floor})
                free = {d: self.stock[(gpu_id, d)] >= count for d in dcs}
                versions = sorted({self.cuda.get(d, "12.8") for d in dcs}, key=_cuda)
                gpus.append({
                    "id": gpu_id, "name": name, "pool": None, "manufacturer": "NVIDIA", "memory": memory,
                    "secure": True, "community": True, "price": {"secure": secure, "community": community},
                    "maxCount": {"secure": 8, "community": 8},
                    "availability": "HIGH" if any(free.values()) else "NONE",
                    "dataCenters": [{"id": d, "name": d, "availability": "HIGH" if free[d] else "NONE"} for d in dcs],
                    "cudaVersions": [{"version": v, "available": any(free[d] for d in dcs if self.cuda.get(d) == v)}
                                     for v in versions],
                })
            del cloud
            return json_response({"gpus": gpus})

        @self.route("GET", "/v2/catalog/datacenters")
        def data_centers(req: Request) -> Response:
            dcs = sorted({dc for (_, dc) in self.stock} | set(self.volume_dcs))
            return json_response({"dataCenters": [{
                "id": dc, "name": dc, "region": "EUROPE" if dc.startswith("EU") else "NORTH_AMERICA",
                "networkVolumeTypes": ["STANDARD"] if dc in self.volume_dcs else [], "compliance": [],
                "globalNetwork": False} for dc in dcs]})

        @self.route("GET", "/v2/network-volumes")
        def volumes(req: Request) -> Response:
            return json_response({"networkVolumes": [self._volume_view(v) for v in self.volumes.values()]})

        @self.route("POST", "/v2/network-volumes")
        def add_volume(req: Request) -> Response:
            body = req.get_json()
            if body["dataCenter"] not in self.volume_dcs:
                return problem(400, "Bad Request", f"network volumes are not available in {body['dataCenter']}")
            vol_id = f"vol{next(self._ids):04d}"
            (self.volume_dir / vol_id).mkdir(parents=True)
            self.volumes_made.append(vol_id)
            self.volumes[vol_id] = {"id": vol_id, "name": body["name"], "size": body["size"],
                                    "dataCenter": body["dataCenter"], "type": body.get("type", "STANDARD")}
            return json_response(self._volume_view(self.volumes[vol_id]), 201)

        @self.route("DELETE", "/v2/network-volumes/{id}")
        def delete_volume(req: Request, id: str) -> Response:
            if id not in self.volumes:
                return problem(404, "Not Found", "network volume not found")
            if any(m["volumeId"] == id for p in self.pods.values() for m in (p.get("mounts") or {}).get("network", [])):
                return problem(400, "Bad Request", "network volume is attached to a pod")
            del self.volumes[id]
            shutil.rmtree(self.volume_dir / id, ignore_errors=True)
            return Response(status=204)

        @self.route("POST", "/v2/pods")
        def create(req: Request) -> Response:
            body = req.get_json()
            self.created.append(body)
            volume_dcs = set()
            for mount in (body.get("mounts") or {}).get("network") or []:
                vol = self.volumes.get(mount["volumeId"])
                if vol is None:
                    return problem(404, "Not Found", f"network volume {mount['volumeId']} not found")
                if body.get("dataCenterIds") and vol["dataCenter"] not in body["dataCenterIds"]:
                    return problem(400, "Bad Request", "the pod must be in its network volume's data center")
                volume_dcs.add(vol["dataCenter"])
            if self.create_500 > 0:
                self.create_500 -= 1
                return problem(500, "Internal Server Error", "create pod: upstream timeout")
            gpu_id = body["gpu"]["id"]
            if gpu_id not in GPUS:
                return problem(400, "Bad Request", f"unknown gpu type {gpu_id}")
            count = int(body["gpu"].get("count", 1))
            floor = _cuda(body["gpu"].get("minCudaVersion", "0"))
            dcs = body.get("dataCenterIds") or sorted({dc for (g, dc) in self.stock if g == gpu_id})
            if volume_dcs:  # a pod with a network volume lands in the volume's data center (NetworkMount, runpod.md §4)
                dcs = [d for d in dcs if d in volume_dcs]
            # a host of the asked CUDA with `count` GPUs free (runpod-rest-v2.json CreateGpuConfig)
            dc = next((d for d in dcs if self.stock.get((gpu_id, d), 0) >= count
                       and _cuda(self.cuda.get(d, "12.8")) >= floor), None)
            scripted = self.launch_answers.pop(0) if self.launch_answers else ""
            if dc is None or scripted == "no_stock":  # runpod.md §5: no stock is a 500 with this message
                return problem(500, "Internal Server Error", "create pod: There are no instances currently available")
            pod = self._make(body, dc)
            pod["_fail"] = scripted == "fail"
            if self.create_500_made > 0:  # runpod.md §6: made, then the read-back failed
                self.create_500_made -= 1
                return problem(500, "Internal Server Error", "create pod: failed to read back the created pod")
            return json_response(self._view(pod), 201)

        @self.route("GET", "/v2/pods")
        def listing(req: Request) -> Response:
            pods = [self._view(p) for p in list(self.pods.values()) if not self._hidden(p)]
            return json_response({"pods": pods})

        @self.route("GET", "/v2/pods/{id}")
        def read(req: Request, id: str) -> Response:
            pod = self.pods.get(id)
            if pod is None or self._hidden(pod):
                return self.not_found()
            self._advance(pod)
            return json_response(self._view(pod))

        @self.route("DELETE", "/v2/pods/{id}")
        def delete(req: Request, id: str) -> Response:
            if self.delete_fail > 0:
                self.delete_fail -= 1
                return problem(500, "Internal Server Error", "terminate pod: upstream error")
            if id not in self.pods:
                return self.not_found()
            self._gone(id)
            return Response(status=204)

    def stop(self) -> None:
        super().stop()
        self.boxes.stop_all()
