"""A fake Lambda Cloud API (instances, instance types, ssh keys) on loopback, held to Lambda's
OpenAPI document; its instances are real sshd logins, each on a loopback address of its own and
one port (as Lambda's answer on their own IP, port 22).

Faults, as in fakes/runpod.py: `stock[(instance type, region)]`, `create_500_made`, `create_500`,
`stuck` (booting for ever), `lag_reads`, `delete_fail`, `rate_limit(n, s)`, `token`, `ready_after`;
`vanish(id)`; `no_stock(gpu)`. Terminated instances answer `terminated` once, then 404.
`ssh_after_s` / `guest_before`: sshd opens that long after `active` with an ip (lambda.md §3: "sshd can
lag active by a few seconds"); meanwhile the port refuses (or drops, or stays silent).
`launch_answers`: what the next launches answer first ("no_stock": insufficient-capacity; "fail": the
instance is made and goes `unhealthy`, then terminated by Lambda). `file_systems[name] = region`
(GET /file-systems; a launch with one in another region is refused as the document says); `POST
/filesystems` makes one in a region of `fs_regions`, `DELETE /filesystems/{id}` deletes one not in use.
Images (`GET /api/v1/images`, IMAGES): each region lists its own, their CUDA in their descriptions as
Lambda words them; us-west-1 has none new enough for Blackwell (B200). A launch whose `image` (an id
or a family) the region does not list is refused `global/object-does-not-exist`.
Instance types have 1 or 8 GPUs (`specs.gpus`); `smi_next` / `skew_next`: the next instances' nvidia-smi
("wrong", "few", "none") and clock offset (fakes/machines.py `gpu_tools`).
`stale(name)` puts an active instance named so on the account, as an earlier controller left it.
"""

from __future__ import annotations

import getpass
import secrets
import time
from pathlib import Path
from typing import Any

from support.sshd import free_port
from werkzeug.wrappers import Request, Response

from actor_run.protocols.messages import Offer
from fakes.openapi_server import OPENAPI, json_response
from fakes.rented import RentedFake

DOCUMENT = OPENAPI / "lambda-v1.json"

TYPES = {  # name -> (description, gpu description, cents per hour, GPUs)
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 249, 1),
    "gpu_1x_a100_sxm4_80gb": ("1x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 179, 1),
    "gpu_1x_a6000": ("1x A6000 (48 GB)", "RTX A6000 (48 GB)", 80, 1),
    "gpu_1x_a100_sxm4": ("1x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 129, 1),
    "gpu_8x_a100": ("8x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 1032, 8),
    "gpu_8x_a100_80gb_sxm4": ("8x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 1432, 8),
    "gpu_1x_b200_sxm6": ("1x B200 (180 GB SXM6)", "B200 (180 GB SXM6)", 499, 1),
}
SMI = {  # gpu description -> what nvidia-smi names it
    "H100 (80 GB PCIe)": "NVIDIA H100 PCIe", "A100 (80 GB SXM4)": "NVIDIA A100-SXM4-80GB",
    "RTX A6000 (48 GB)": "NVIDIA RTX A6000", "A100 (40 GB SXM4)": "NVIDIA A100-SXM4-40GB",
    "B200 (180 GB SXM6)": "NVIDIA B200",
}
REGIONS = {"us-east-1": "Virginia, USA", "us-west-1": "California, USA"}
# each region's images (GET /api/v1/images): (id, name, family, description, version)
IMAGES = {
    "us-east-1": [
        ("9c1f0e7a5b2d4c3e8f6a1b2c3d4e5f60", "lambda-stack-22-04", "lambda-stack-22-04",
         "Lambda Stack 22.04 (Ubuntu 22.04, NVIDIA driver 535, CUDA 12.2)", "22.04.5"),
        ("4be2a1d0c9f84e7a9b6c5d4e3f2a1b00", "lambda-stack-24-04", "lambda-stack-24-04",
         "Lambda Stack 24.04 (Ubuntu 24.04, NVIDIA driver 570, CUDA 12.8)", "24.04.2"),
        ("0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f50", "ubuntu-24.04.01", "ubuntu-lts", "Ubuntu LTS", "24.04.01"),
    ],
    "us-west-1": [
        ("7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c20", "lambda-stack-22-04", "lambda-stack-22-04",
         "Lambda Stack 22.04 (Ubuntu 22.04, NVIDIA driver 535, CUDA 12.2)", "22.04.5"),
        ("1f2e3d4c5b6a79808f7e6d5c4b3a2910", "ubuntu-24.04.01", "ubuntu-lts", "Ubuntu LTS", "24.04.01"),
    ],
}
NO_ACTION = {"available": False, "reason_code": "vm-has-not-launched", "reason_description": "not yet"}


def error(status: int, code: str, message: str, suggestion: str | None = None) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if suggestion is not None:
        body["suggestion"] = suggestion
    return json_response({"error": body}, status)


class FakeLambda(RentedFake):
    CLOUD = "lambda"
    KEY_VAR = "LAMBDA_API_KEY"
    GPUS = ("H100", "A100-80G")

    def server_error(self) -> Response:
        """lambda.md §1 and §4: an error object; upstream trouble is a `provider/*` code."""
        return error(500, "provider/internal-unavailable", "the provider is unavailable; try again")

    def settings(self) -> dict[str, Any]:
        return {"user": getpass.getuser(), "ssh_port": self.port, "shutdown_command": "touch $HOME/shutdown-asked"}

    def sample_offer(self) -> Offer:
        return Offer(cloud="lambda", region="us-east-1", gpu="A100-80G", hourly_usd=1.79, kind="gpu_1x_a100_sxm4_80gb")

    def __init__(self, dir: Path, *, token: str = "test-key", virtual: bool = False) -> None:
        super().__init__(DOCUMENT, Path(dir) / "instances", token=token, virtual=virtual)
        self.undocumented = {
            429: "lambda.md §1: excess requests are answered HTTP 429; the body is not specified",
            500: "lambda.md §4: 5xx / provider/* upstream trouble",
        }
        self.port = free_port()  # every instance answers SSH on its own address, this port
        self.instances: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, dict[str, str]] = {}
        self.stock: dict[tuple[str, str], int] = {
            ("gpu_1x_a100_sxm4_80gb", "us-east-1"): 4, ("gpu_1x_a100_sxm4_80gb", "us-west-1"): 4,
            ("gpu_1x_h100_pcie", "us-west-1"): 2, ("gpu_1x_a6000", "us-east-1"): 8,
            ("gpu_1x_a100_sxm4", "us-west-1"): 2, ("gpu_8x_a100", "us-west-1"): 1,
            ("gpu_8x_a100_80gb_sxm4", "us-east-1"): 1, ("gpu_1x_b200_sxm6", "us-east-1"): 2,
            ("gpu_1x_b200_sxm6", "us-west-1"): 2,
        }
        self.file_systems: dict[str, str] = {}
        self.fs_ids: dict[str, str] = {}  # a file system's id, by name
        self.fs_regions = set(REGIONS)  # where POST /filesystems makes one
        self._routes()

    def unauthorized(self) -> Response:
        return error(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                     "Check your API key or create a new one, then try again.")

    def too_many(self, retry_after: float) -> Response:
        return json_response({"error": {"code": "global/rate-limited", "message": "Too many requests."}}, 429,
                             headers={"Retry-After": f"{int(retry_after)}"})

    def not_found(self) -> Response:
        return error(404, "global/object-does-not-exist", "Specified instance does not exist.")

    def invalid(self, problem_text: str) -> Response:
        return error(400, "global/invalid-parameters", problem_text)

    # --- instances --------------------------------------------------------------------------------

    def _type(self, name: str) -> dict[str, Any]:
        desc, gpu, cents, gpus = TYPES[name]
        return {"name": name, "description": desc, "gpu_description": gpu, "price_cents_per_hour": cents,
                "specs": {"vcpus": 26 * gpus, "memory_gib": 200 * gpus, "storage_gib": 1000 * gpus, "gpus": gpus}}

    def _fs_id(self, name: str) -> str:
        return self.fs_ids.setdefault(name, secrets.token_hex(16))

    def _fs_in_use(self, name: str) -> bool:
        return any(name in i["file_system_names"] for i in self.instances.values()
                   if i["status"] not in ("terminated", "terminating", "preempted"))

    def _fs_view(self, name: str, region: str) -> dict[str, Any]:
        return {"id": self._fs_id(name), "name": name, "mount_point": f"/lambda/nfs/{name}",
                "created": "2026-01-01T00:00:00Z",
                "created_by": {"id": "3da5a70a57a7422ea8a7203f98b2198b", "email": "me@example.com", "status": "active"},
                "is_in_use": self._fs_in_use(name),
                "region": {"name": region, "description": REGIONS.get(region, region)}, "bytes_used": 0}

    def _advance(self, inst: dict[str, Any]) -> None:
        inst["_reads"] += 1
        if inst["status"] == "booting" and inst["_fail"] and inst["_reads"] >= self.ready_after:
            inst["status"] = "unhealthy"
        elif inst["status"] == "unhealthy" and inst["_fail"]:
            self._end(inst)
            inst["status"] = "terminated"
        elif inst["status"] == "booting" and not self.stuck and inst["_reads"] >= self.ready_after:
            inst["status"] = "active"
            inst["ip"] = inst["_address"]
            inst["actions"] = {k: {"available": True} for k in inst["actions"]}
            if not self.virtual:
                self.boxes.boot(inst["id"], self.ssh_after_s, before=self.guest_before)
        elif inst["status"] == "terminating":
            inst["status"] = "terminated"
        elif inst["status"] == "terminated":
            self.instances.pop(inst["id"], None)

    def _make(self, body: dict[str, Any]) -> dict[str, Any]:
        inst_id = secrets.token_hex(16)
        key = self.keys[body["ssh_key_names"][0]]["public_key"]
        address = self._address()
        if not self.virtual:  # its sshd comes up after `active` (boot, in _advance)
            _, gpu, _, gpus = TYPES[body["instance_type_name"]]
            tools = self._tools(SMI[gpu], gpus)
            self.boxes.plan(inst_id, key, address=address, port=self.port, tools=tools)
            user = self.boxes.user
        else:
            user = "ubuntu"
        region = body["region_name"]
        inst = {
            "id": inst_id, "name": body.get("name", ""), "status": "booting", "ssh_key_names": body["ssh_key_names"],
            **({"file_system_mounts": body["file_system_mounts"]} if body.get("file_system_mounts") else {}),
            "file_system_names": body.get("file_system_names", []), "region": {"name": region,
                                                                               "description": REGIONS[region]},
            "instance_type": self._type(body["instance_type_name"]), "hostname": f"host-{inst_id[:8]}",
            "actions": {k: dict(NO_ACTION) for k in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")},
            "tags": body.get("tags", []),
            "_reads": 0, "_lag": self.lag_reads, "_address": address, "_user": user, "_t0": time.time(),
            "_fail": False,
        }
        self.instances[inst_id] = inst
        self.stock[(body["instance_type_name"], region)] -= 1
        return inst

    def _end(self, inst: dict[str, Any]) -> None:
        """Billing stops, stock comes back and the machine goes; the record says terminating."""
        if inst.get("_ended"):
            return
        inst["_ended"] = True
        if inst["status"] in ("terminating", "terminated", "preempted"):
            return
        itype = inst["instance_type"]["name"]
        self.stock[(itype, inst["region"]["name"])] += 1
        self.billed.append((self._name(inst), time.time() - inst["_t0"], inst["instance_type"]["price_cents_per_hour"]
                            / 100))
        self.boxes.vanish(inst["id"])

    def _name(self, inst: dict[str, Any]) -> str:
        tags = {t["key"]: t["value"] for t in inst.get("tags", [])}
        return str(tags.get("actor-run-name") or inst["name"])

    def vanish(self, inst_id: str) -> None:
        with self.lock:
            inst = self.instances[inst_id]
            self._end(inst)
            inst["status"] = "preempted"

    def alive(self) -> list[str]:
        """Instances that hold a machine (and bill): neither terminated, terminating nor preempted."""
        with self.lock:
            return sorted(self._name(i) for i in self.instances.values()
                          if i["status"] not in ("terminating", "terminated", "preempted"))

    def stale(self, name: str) -> str:
        """An active instance named `name` already on the account (no sshd); its id."""
        with self.lock:
            itype, region = next(k for k, n in self.stock.items() if n > 0)
            if not self.keys:
                self.keys["old-key"] = {"id": "0" * 32, "name": "old-key", "public_key": "ssh-ed25519 AAAA old"}
            with self._without_sshd():
                inst = self._make({"region_name": region, "instance_type_name": itype, "name": name[:64],
                                   "ssh_key_names": [next(iter(self.keys))],
                                   "tags": [{"key": "actor-run-name", "value": name}]})
            inst["status"], inst["ip"] = "active", inst["_address"]
            return str(inst["id"])

    def _routes(self) -> None:
        @self.route("GET", "/api/v1/file-systems")
        def file_systems(req: Request) -> Response:
            return json_response({"data": [self._fs_view(n, r) for n, r in sorted(self.file_systems.items())]})

        @self.route("POST", "/api/v1/filesystems")
        def add_file_system(req: Request) -> Response:
            body = req.get_json()
            if body["region"] not in self.fs_regions:
                return error(400, "global/invalid-parameters", f"Filesystems are not available in {body['region']}.")
            if body["name"] in self.file_systems:
                return error(400, "global/duplicate", "A filesystem with this name already exists.")
            self.file_systems[body["name"]] = body["region"]
            return json_response({"data": self._fs_view(body["name"], body["region"])})

        @self.route("DELETE", "/api/v1/filesystems/{id}")
        def delete_file_system(req: Request, id: str) -> Response:
            name = next((n for n in self.file_systems if self._fs_id(n) == id), None)
            if name is None:
                return error(404, "global/object-does-not-exist", "Filesystem was not found.")
            if self._fs_in_use(name):
                return error(400, "filesystems/filesystem-in-use", "Filesystem is in use.")
            del self.file_systems[name]
            return json_response({"data": {"deleted_ids": [id]}})

        @self.route("GET", "/api/v1/instance-types")
        def types(req: Request) -> Response:
            data = {}
            for name in TYPES:
                regions = [{"name": r, "description": REGIONS[r]} for r in REGIONS if self.stock.get((name, r), 0) > 0]
                data[name] = {"instance_type": self._type(name), "regions_with_capacity_available": regions}
            return json_response({"data": data})

        @self.route("GET", "/api/v1/images")
        def images(req: Request) -> Response:
            return json_response({"data": [
                {"id": i, "created_time": "2026-03-01T00:00:00Z", "updated_time": "2026-06-01T00:00:00Z", "name": n,
                 "description": d, "family": f, "version": v, "architecture": "x86_64",
                 "region": {"name": r, "description": REGIONS[r]}}
                for r, listed in IMAGES.items() for i, n, f, d, v in listed]})

        @self.route("GET", "/api/v1/ssh-keys")
        def list_keys(req: Request) -> Response:
            return json_response({"data": list(self.keys.values())})

        @self.route("POST", "/api/v1/ssh-keys")
        def add_key(req: Request) -> Response:
            body = req.get_json()
            key = {"id": secrets.token_hex(16), "name": body["name"], "public_key": body["public_key"]}
            self.keys[body["name"]] = key
            return json_response({"data": key})

        @self.route("POST", "/api/v1/instance-operations/launch")
        def launch(req: Request) -> Response:
            body = req.get_json()
            self.created.append(body)
            if self.create_500 > 0:
                self.create_500 -= 1
                return error(500, "provider/internal-unavailable", "Provider unavailable", "Try again shortly")
            if body["ssh_key_names"][0] not in self.keys:
                return error(400, "global/object-does-not-exist", "Specified SSH key does not exist.",
                             "Check the key's name")
            for fs in body.get("file_system_names") or []:
                if fs not in self.file_systems:
                    return error(400, "global/object-does-not-exist", "Specified file system does not exist.",
                                 "Check the file system's name")
                if self.file_systems[fs] != body["region_name"]:
                    return error(400, "instance-operations/launch/file-system-in-wrong-region",
                                 "File system is in a different region than the instance.",
                                 "Launch the instance in the file system's region")
            for mount in body.get("file_system_mounts") or []:  # (naming it in file_system_names too is optional)
                if not any(self._fs_id(n) == mount["file_system_id"] for n in self.file_systems):
                    return error(400, "global/object-does-not-exist", "Specified file system does not exist.",
                                 "Check the file system's id")
            image = body.get("image") or {}
            if image and not any(image.get("id") == i or image.get("family") == f
                                 for i, _, f, _, _ in IMAGES.get(body["region_name"], [])):
                return error(400, "global/object-does-not-exist", "Specified image does not exist.",
                             "Check the image's id or family")
            scripted = self.launch_answers.pop(0) if self.launch_answers else ""
            if scripted == "no_stock" or self.stock.get((body["instance_type_name"], body["region_name"]), 0) <= 0:
                return error(400, "instance-operations/launch/insufficient-capacity",
                             "Not enough capacity to fulfill launch request.")
            inst = self._make(body)
            inst["_fail"] = scripted == "fail"
            if self.create_500_made > 0:
                self.create_500_made -= 1
                return error(500, "provider/internal-unavailable", "Provider unavailable", "Try again shortly")
            return json_response({"data": {"instance_ids": [inst["id"]]}})

        @self.route("GET", "/api/v1/instances")
        def listing(req: Request) -> Response:
            live = [self._view(i) for i in list(self.instances.values())
                    if i["status"] != "terminated" and not self._hidden(i)]
            return json_response({"data": live})

        @self.route("GET", "/api/v1/instances/{id}")
        def read(req: Request, id: str) -> Response:
            inst = self.instances.get(id)
            if inst is None or self._hidden(inst):
                return self.not_found()
            view = self._view(inst)
            self._advance(inst)
            if inst["status"] == "active" and view["status"] == "booting":
                view = self._view(inst)
            return json_response({"data": view})

        @self.route("POST", "/api/v1/instance-operations/terminate")
        def terminate(req: Request) -> Response:
            if self.delete_fail > 0:
                self.delete_fail -= 1
                return error(500, "provider/internal-unavailable", "Provider unavailable", "Try again shortly")
            ids = req.get_json()["instance_ids"]
            if any(i not in self.instances for i in ids):
                return self.not_found()
            done = []
            for i in ids:
                inst = self.instances[i]
                self._end(inst)
                if inst["status"] not in ("terminated", "preempted"):
                    inst["status"] = "terminating"
                done.append(self._view(inst))
            return json_response({"data": {"terminated_instances": done}})

    def stop(self) -> None:
        super().stop()
        self.boxes.stop_all()
