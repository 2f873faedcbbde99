"""A fake Hyperstack (Infrahub API v1: VMs, flavors, stocks, pricebook, environments, keypairs) on
loopback, held to Hyperstack's OpenAPI document; its VMs are real sshd logins, each on a loopback
address of its own and one port.

Faults, as in fakes/runpod.py: `stock[(flavor, region)]`, `create_500_made`, `create_500`,
`images_500` (the next image listings answer 500), `stuck` (BUILD for ever), `lag_reads`, `delete_fail`,
`rate_limit(n, s)`, `token`, `ready_after`, `error_builds` (the next n VMs go to ERROR); `vanish(id)`;
`no_stock(gpu)`. `smi_next` / `skew_next`: the next VMs' nvidia-smi ("wrong", "few", "none") and clock
offset (fakes/machines.py `gpu_tools`).
Flavors have 1, 2 or 8 GPUs (`gpu_count`); images are listed per region (IMAGES), and a create whose
`image_name` the region does not have is refused 404 as the document says (one without `image_name`,
which the document does not require, boots from a bootable volume and is made).
`ssh_after_s` / `guest_before`: the guest's sshd opens that long after ACTIVE (the API reports a VM
ready before its OS has booted); meanwhile its port refuses (or drops, or stays silent). Until an
ingress rule for the port exists the port is filtered (hyperstack.md §8: inbound SSH is closed by
default): TCP is taken and not a byte comes back. `launch_answers`: what the next creates answer
first ("no_stock": the 400 refusal; "fail": accepted, then ERROR). `stale(name)` puts an ACTIVE VM
named so on the account, as an earlier controller left it. Block volumes (a cache), their attach that
lags and the stand-in for the disk the VM has not: fakes/hyperstack_volumes.py (`volume_store`).
"""

from __future__ import annotations

import datetime
import getpass
import itertools
import time
from pathlib import Path
from typing import Any

from support.sshd import free_port
from werkzeug.wrappers import Request, Response

from actor_run.protocols.messages import Offer
from fakes.hyperstack_volumes import FakeVolumes
from fakes.hyperstack_volumes import tools as volume_tools
from fakes.openapi_server import OPENAPI, json_response
from fakes.rented import RentedFake

DOCUMENT = OPENAPI / "hyperstack-v1.yaml"

FLAVORS = {  # name -> (gpu, region)
    "n3-H100x1": ("H100-80G-PCIe", "CANADA-1"),
    "n3-A100x1": ("A100-80G-PCIe", "NORWAY-1"),
    "n3-A100x1-ca": ("A100-80G-PCIe", "CANADA-1"),
    "n3-A100x2": ("A100-80G-PCIe", "NORWAY-1"),
    "n3-A100x8": ("A100-80G-PCIe", "NORWAY-1"),
    "n3-B200x1": ("B200-180G-SXM", "CANADA-1"),
}
COUNTS = {"n3-A100x2": 2, "n3-A100x8": 8}  # a flavor's gpu_count (1 unless here)
PRICES = {"H100-80G-PCIe": 1.90, "A100-80G-PCIe": 1.35, "B200-180G-SXM": 5.50, "PublicIP": 0.00672,
          "Cloud-SSD": 0.000096}
SMI = {"H100-80G-PCIe": "NVIDIA H100 PCIe", "A100-80G-PCIe": "NVIDIA A100 80GB PCIe", "B200-180G-SXM": "NVIDIA B200"}
# each region's OS images (GET /core/images): CANADA-1 has none with a CUDA new enough for Blackwell
IMAGES = {
    "CANADA-1": ["Ubuntu Server 22.04 LTS", "Ubuntu Server 22.04 LTS R535 CUDA 12.2"],
    "NORWAY-1": ["Ubuntu Server 22.04 LTS R535 CUDA 12.2", "Ubuntu Server 24.04 LTS R570 CUDA 12.8"],
    "US-1": ["Ubuntu Server 24.04 LTS R570 CUDA 12.8"],
}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def refusal(status: int, message: str, reason: str | None) -> Response:
    body: dict[str, Any] = {"status": False, "message": message}
    if reason is not None:
        body["error_reason"] = reason
    return json_response(body, status)


class FakeHyperstack(RentedFake):
    CLOUD = "hyperstack"
    KEY_VAR = "HYPERSTACK_API_KEY"
    GPUS = ("H100", "A100-80G")

    def settings(self) -> dict[str, Any]:
        return {"user": getpass.getuser(), "ssh_port": self.port, "shutdown_command": "touch $HOME/shutdown-asked"}

    def sample_offer(self) -> Offer:
        return Offer(cloud="hyperstack", region="NORWAY-1", gpu="A100-80G", hourly_usd=1.35672, kind="n3-A100x1")

    def __init__(self, dir: Path, *, token: str = "test-key", virtual: bool = False) -> None:
        super().__init__(DOCUMENT, Path(dir) / "vms", base_path="/v1", token=token, virtual=virtual)
        self.undocumented = {
            429: "hyperstack.md §1: 500 requests a minute per IP, then 429 (no body documented)",
            500: 'hyperstack.md §4: the legacy 5xx {"message": "Internal Server Error"} (no content in the document)',
        }
        self.port = free_port()
        self.vms: dict[int, dict[str, Any]] = {}
        self.environments: dict[str, dict[str, Any]] = {}
        self.keypairs: list[dict[str, Any]] = []
        self.stock: dict[tuple[str, str], int] = {(f, r): 4 for f, (_, r) in FLAVORS.items()}
        self.error_builds = 0
        self.images_500 = 0
        self._ids = itertools.count(1001)
        self.volume_store = FakeVolumes(self, Path(dir))
        self._routes()
        self.volume_store.routes()

    def server_error(self) -> Response:
        """hyperstack.md §4: the legacy 5xx body."""
        return json_response({"message": "Internal Server Error"}, 500)

    def authorized(self, req: Request) -> bool:
        return req.headers.get("api_key", "") == self.token

    def unauthorized(self) -> Response:
        return refusal(401, "Unauthorized: invalid api key", "unauthorized")

    def too_many(self, retry_after: float) -> Response:
        return json_response({"message": "Too Many Requests"}, 429, headers={"Retry-After": f"{int(retry_after)}"})

    def not_found(self) -> Response:
        return refusal(404, "Virtual machine not found", "not_found")

    def invalid(self, problem_text: str) -> Response:
        return refusal(400, problem_text, "bad_request")

    # --- VMs ----------------------------------------------------------------------------------------

    def _advance(self, vm: dict[str, Any]) -> None:
        vm["_reads"] += 1
        if vm["status"] == "CREATING":
            vm["status"] = "BUILD"
        elif vm["status"] == "BUILD" and not self.stuck and vm["_reads"] >= self.ready_after + 1:
            if vm["_error"]:
                vm["status"] = "ERROR"
            else:
                vm["status"] = "ACTIVE"
                vm["vm_state"] = "active"
                vm["power_state"] = "RUNNING"
                vm["floating_ip"] = vm["_address"]
                vm["floating_ip_status"] = "ATTACHED"
                if not self.virtual:
                    self.boxes.boot(str(vm["id"]), self.ssh_after_s, before=self.guest_before)
        elif vm["status"] == "DELETING":
            self.vms.pop(vm["id"], None)

    def _name(self, vm: dict[str, Any]) -> str:
        full = [x[len("ar-name="):] for x in vm.get("labels", []) if x.startswith("ar-name=")]
        return full[0] if full else str(vm["name"])

    def _make(self, body: dict[str, Any]) -> dict[str, Any]:
        vm_id = next(self._ids)
        env = self.environments[body["environment_name"]]
        key = next(k for k in self.keypairs if k["name"] == body["key_name"]
                   and k["environment"]["name"] == env["name"])
        address = self._address()
        gpu, _ = FLAVORS[body["flavor_name"]]
        count = COUNTS.get(body["flavor_name"], 1)
        if not self.virtual:  # filtered until a rule opens the port; sshd after ACTIVE (_advance)
            tools = self._tools(SMI[gpu], count)
            tools.update(volume_tools(self.volume_store.dir))
            self.boxes.plan(str(vm_id), key["public_key"], address=address, port=self.port, tools=tools)
            self.boxes.firewall(str(vm_id), closed=True)
        vm = {
            "id": vm_id, "name": body["name"], "status": "CREATING", "vm_state": "building", "power_state": "NOSTATE",
            "created_at": _iso(time.time()), "environment": {"id": env["id"], "name": env["name"],
                                                             "region": env["region"], "org_id": 1},
            "flavor": {"id": 7, "name": body["flavor_name"], "cpu": 28, "ram": 120.0, "disk": 100, "ephemeral": 0,
                       "gpu": gpu, "gpu_count": count},
            "image": {"name": body.get("image_name", "")}, "keypair": {"name": body["key_name"]},
            "fixed_ip": "10.0.0.5", "floating_ip": "", "floating_ip_status": "PENDING",
            "labels": body.get("labels", []), "security_rules": [], "locked": False, "os": "ubuntu",
            "_reads": 0, "_lag": self.lag_reads, "_address": address, "_t0": time.time(),
            "_error": self.error_builds > 0,
            "_hourly": PRICES[gpu] * count + PRICES["PublicIP"],
        }
        if self.error_builds > 0:
            self.error_builds -= 1
        self.vms[vm_id] = vm
        self.stock[(body["flavor_name"], env["region"])] -= 1
        return vm

    def _end(self, vm: dict[str, Any]) -> None:
        if vm.get("_ended"):
            return
        vm["_ended"] = True
        self.stock[(vm["flavor"]["name"], vm["environment"]["region"])] += 1
        self.billed.append((self._name(vm), time.time() - vm["_t0"], vm["_hourly"]))
        self.volume_store.vm_ended(vm["id"], self.boxes.dir / str(vm["id"]))
        self.boxes.vanish(str(vm["id"]))

    def vanish(self, vm_id: str) -> None:
        with self.lock:
            vm = self.vms.pop(int(vm_id))
            self._end(vm)

    def _stock_gpu(self, key: tuple[str, str]) -> str:
        return FLAVORS[key[0]][0]  # (flavor, region): the flavor's GPU

    def alive(self) -> list[str]:
        with self.lock:
            return sorted(self._name(v) for v in self.vms.values() if not v.get("_ended"))

    def stale(self, name: str) -> str:
        """An ACTIVE VM named `name` already on the account (no sshd); its id."""
        with self.lock:
            flavor, region = next(k for k, n in self.stock.items() if n > 0)
            env_name = f"old-{region}"
            self.environments.setdefault(env_name, {"id": len(self.environments) + 1, "name": env_name,
                                                    "region": region, "created_at": _iso(time.time())})
            if not any(k["name"] == "old-key" for k in self.keypairs):
                self.keypairs.append({"id": len(self.keypairs) + 1, "name": "old-key", "public_key": "ssh-ed25519 A",
                                      "fingerprint": "aa:bb", "environment": {"id": 1, "name": env_name,
                                                                              "region": region},
                                      "created_at": _iso(time.time())})
            with self._without_sshd():
                vm = self._make({"name": name[:50], "environment_name": env_name, "flavor_name": flavor,
                                 "key_name": "old-key", "labels": [f"ar-name={name}"]})
            vm.update(status="ACTIVE", vm_state="active", power_state="RUNNING", floating_ip=vm["_address"],
                      floating_ip_status="ATTACHED")
            return str(vm["id"])

    def _routes(self) -> None:
        @self.route("GET", "/core/flavors")
        def flavors(req: Request) -> Response:
            groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for i, (name, (gpu, region)) in enumerate(FLAVORS.items()):
                groups.setdefault((gpu, region), []).append({
                    "id": i + 1, "name": name, "display_name": name, "region_name": region, "cpu": 28, "ram": 120.0,
                    "disk": 100, "ephemeral": 0, "gpu": gpu, "gpu_count": COUNTS.get(name, 1),
                    "stock_available": self.stock[(name, region)] > 0, "created_at": "2026-01-01T00:00:00Z",
                    "labels": [], "features": {}})
            data = [{"gpu": g, "region_name": r, "flavors": fs} for (g, r), fs in groups.items()]
            return json_response({"status": True, "message": "Success", "data": data})

        @self.route("GET", "/core/stocks")
        def stocks(req: Request) -> Response:
            out = []
            for region in sorted({r for _, r in FLAVORS.values()}):
                models = []
                for gpu in sorted({g for g, r in FLAVORS.values() if r == region}):
                    n = sum(self.stock[(f, region)] for f, (g, r) in FLAVORS.items() if g == gpu and r == region)
                    models.append({"model": gpu, "available": str(n) if n < 10 else "10+", "planned_7_days": "0",
                                   "planned_30_days": "0", "planned_100_days": "0",
                                   "configurations": {"1x": n, "2x": n // 2, "4x": n // 4, "8x": n // 8, "10x": 0}})
                out.append({"region": region, "stock-type": "GPU", "models": models})
            return json_response({"stocks": out})

        @self.route("GET", "/core/images")
        def images(req: Request) -> Response:
            if self.images_500 > 0:  # the next listings fail as the vendor's 5xx do (the legacy body)
                self.images_500 -= 1
                return self.server_error()
            regions = [req.args["region"]] if "region" in req.args else sorted(IMAGES)
            groups = [{"region_name": r, "type": "Ubuntu", "logo": "", "images": [
                {"id": 100 + i, "name": n, "region_name": r, "type": "Ubuntu", "version": n.split()[2],
                 "size": 10, "display_size": "10 GB", "is_public": True, "description": n, "labels": []}
                for i, n in enumerate(IMAGES.get(r, []))]} for r in regions]
            return json_response({"status": True, "message": "Success", "images": groups})

        @self.route("GET", "/pricebook")
        def pricebook(req: Request) -> Response:
            return json_response([{"id": i, "name": n, "value": v, "original_value": v, "discount_applied": False,
                                   "start_time": "2026-01-01T00:00:00Z", "end_time": "2027-01-01T00:00:00Z"}
                                  for i, (n, v) in enumerate(PRICES.items())])

        @self.route("GET", "/core/environments")
        def environments(req: Request) -> Response:
            search = req.args.get("search", "")
            envs = [e for e in self.environments.values() if search in e["name"]]
            return json_response({"status": True, "message": "Success", "environments": envs, "count": len(envs),
                                  "page": 1, "page_size": 200})

        @self.route("POST", "/core/environments")
        def add_environment(req: Request) -> Response:
            body = req.get_json()
            if body["name"] in self.environments:
                return refusal(409, "Environment already exists", "already_exist")
            env = {"id": len(self.environments) + 1, "name": body["name"], "region": body["region"],
                   "created_at": _iso(time.time())}
            self.environments[body["name"]] = env
            return json_response({"status": True, "message": "Created", "environment": env})

        @self.route("GET", "/core/keypairs")
        def keypairs(req: Request) -> Response:
            search = req.args.get("search", "")
            keys = [k for k in self.keypairs if search in k["name"]]
            return json_response({"status": True, "message": "Success", "keypairs": keys, "count": len(keys),
                                  "page": 1, "page_size": 200})

        @self.route("POST", "/core/keypairs")
        def add_keypair(req: Request) -> Response:
            body = req.get_json()
            env = self.environments.get(body["environment_name"])
            if env is None:
                return refusal(404, "Environment not found", "not_found")
            key = {"id": len(self.keypairs) + 1, "name": body["name"], "public_key": body["public_key"],
                   "fingerprint": "aa:bb", "environment": {"id": env["id"], "name": env["name"],
                                                           "region": env["region"]},
                   "created_at": _iso(time.time())}
            self.keypairs.append(key)
            return json_response({"status": True, "message": "Imported", "keypair": key})

        @self.route("POST", "/core/virtual-machines")
        def create(req: Request) -> Response:
            body = req.get_json()
            if self.create_500 > 0:
                self.create_500 -= 1
                return json_response({"message": "Internal Server Error"}, 500)
            env = self.environments.get(body["environment_name"])
            if env is None or body["flavor_name"] not in FLAVORS:
                return refusal(404, "Environment or flavor not found", "not_found")
            self.created.append(body)
            if FLAVORS[body["flavor_name"]][1] != env["region"]:
                return refusal(400, "Flavor is not available in the environment's region", "bad_request")
            if "image_name" in body and body["image_name"] not in IMAGES.get(env["region"], []):
                return refusal(404, f"Image {body.get('image_name')} not found in {env['region']}", "not_found")
            if any(v["name"] == body["name"] for v in self.vms.values()):
                return refusal(409, "A virtual machine with this name already exists", "already_exist")
            scripted = self.launch_answers.pop(0) if self.launch_answers else ""
            if scripted == "no_stock" or self.stock[(body["flavor_name"], env["region"])] <= 0:
                return refusal(400, "Not enough resources available for the requested flavor", "bad_request")
            if scripted == "fail":
                self.error_builds += 1
            vm = self._make(body)
            if self.create_500_made > 0:
                self.create_500_made -= 1
                return json_response({"message": "Internal Server Error"}, 500)
            return json_response({"status": True, "message": "Creating", "instances": [self._view(vm)]})

        @self.route("POST", "/core/virtual-machines/{vm_id}/sg-rules")
        def sg_rule(req: Request, vm_id: str) -> Response:
            vm = self.vms.get(int(vm_id))
            if vm is None:
                return self.not_found()
            body = req.get_json()
            rule = {"id": len(vm["security_rules"]) + 1, "direction": body["direction"], "protocol": body["protocol"],
                    "ethertype": body["ethertype"], "remote_ip_prefix": body["remote_ip_prefix"],
                    "port_range_min": body.get("port_range_min"), "port_range_max": body.get("port_range_max"),
                    "status": "active", "created_at": _iso(time.time())}
            vm["security_rules"].append(rule)
            if body["direction"] == "ingress" and (rule["port_range_min"] or 0) <= self.port <= (
                    rule["port_range_max"] or 65535):
                self.boxes.firewall(vm_id, closed=False)
            return json_response({"status": True, "message": "Rule added", "security_rule": rule})

        @self.route("GET", "/core/virtual-machines")
        def listing(req: Request) -> Response:
            vms = [self._view(v) for v in list(self.vms.values()) if not self._hidden(v)]
            return json_response({"status": True, "message": "Success", "instances": vms, "count": len(vms),
                                  "page": 1, "page_size": 200})

        @self.route("GET", "/core/virtual-machines/{vm_id}")
        def read(req: Request, vm_id: str) -> Response:
            vm = self.vms.get(int(vm_id))
            if vm is None or self._hidden(vm):
                return self.not_found()
            self._advance(vm)
            if int(vm_id) not in self.vms:
                return self.not_found()
            return json_response({"status": True, "message": "Success", "instance": self._view(vm)})

        @self.route("DELETE", "/core/virtual-machines/{vm_id}")
        def delete(req: Request, vm_id: str) -> Response:
            if self.delete_fail > 0:
                self.delete_fail -= 1
                return json_response({"message": "Internal Server Error"}, 500)
            vm = self.vms.get(int(vm_id))
            if vm is None:
                return self.not_found()
            self._end(vm)
            vm["status"] = "DELETING"
            return json_response({"status": True, "message": "Deleting"})

    def stop(self) -> None:
        super().stop()
        self.boxes.stop_all()
        self.volume_store.stop()
