"""A fake Shadeform API v1 (instance types, create, info, list, delete, ssh keys) on loopback,
written from ../shared/contracts/shadeform.md and held to Shadeform's OpenAPI document
(shadeform-v1.yaml), relaxed in one place: `deleted_at` may be null (an undeleted instance has
none; shadeform.md §2.3 cites a third party that had to patch the same). Its instances are real
sshd logins, each on a loopback address of its own and a port of its own (`ssh_port` is 22 on
most clouds and another on some, §9).

What Shadeform does not document is marked a guess here, as the contract's §11 asks: a create the
place has no stock for answers 400 `{"message": "... not available ..."}`; a 5xx body is
`{"message": ...}`; a 429 carries Retry-After; `info` of a deleted instance answers `deleted` once,
then 404.

Faults (as fakes/lambdacloud.py): `create_500_made`, `create_500`, `stuck` (`pending` for ever),
`lag_reads` (a new instance missing from reads), `delete_fail`, `rate_limit(n, s)`, `token`,
`ssh_after_s` / `guest_before`, `launch_answers` ("no_stock"; "fail": made, then `error`),
`reclaim(id)` (a spot instance taken back: `deleting` with `status_details: preempted`, then
`deleted`, §6), `vanish(id)` (the same for any instance), `no_stock(gpu)`, `stale(name)`,
`foreign(name)` (an instance of the account without our tags). `auto_delete.date_threshold` is
honoured at the first request after it (the enforcement latency is undocumented, §7).
"""

from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path
from typing import Any

from support.sshd import free_port
from werkzeug.wrappers import Request, Response

from actor_run.protocols.messages import Offer
from fakes.openapi_server import OPENAPI, json_response
from fakes.rented import RentedFake

DOCUMENT = OPENAPI / "shadeform-v1.yaml"


def relax(doc: dict[str, Any]) -> None:
    """`deleted_at` nullable (shadeform.md §2.3: required, typed date-time, absent while undeleted)."""
    doc["components"]["schemas"]["DeletedAt"]["nullable"] = True


# (cloud, shade type, cloud's type, cents per hour, gpu ram, [(region, display, spot $ or None)])
TYPES = [
    ("hyperstack", "A100_80G", "n3-A100x1", 180, 80, [("canada-1", "Canada, Montreal", "1.10"),
                                                       ("norway-1", "Norway, Oslo", None)]),
    ("lambdalabs", "A100_80G", "gpu_1x_a100_sxm4_80gb", 179, 80, [("us-east-1", "US, Virginia", None)]),
    ("datacrunch", "H100", "1H100.80S.30V", 249, 80, [("FIN-01", "Finland, Helsinki", "1.30")]),
    ("denvr", "H100", "H100_80GB_1x", 260, 80, [("houston-1", "US, Houston, TX", None)]),
    ("scaleway", "A6000", "GPU-A6000-1", 90, 48, [("fr-par-2", "France, Paris", None)]),
]


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return datetime.datetime.fromtimestamp(when, tz=datetime.UTC).isoformat().replace("+00:00", "Z")


class FakeShadeform(RentedFake):
    CLOUD = "shadeform"
    KEY_VAR = "SHADEFORM_API_KEY"
    GPUS = ("H100", "A100-80G")

    def settings(self) -> dict[str, Any]:
        return {"shutdown_command": "touch $HOME/shutdown-asked"}

    def sample_offer(self) -> Offer:
        return Offer(cloud="shadeform", region="canada-1", gpu="A100-80G", hourly_usd=1.80, kind="hyperstack/A100_80G")

    def __init__(self, dir: Path, *, token: str = "test-key", virtual: bool = False) -> None:
        super().__init__(DOCUMENT, Path(dir) / "instances", token=token, virtual=virtual, relax=relax)
        self.undocumented = {  # the document lists 200 only (shadeform.md §1)
            400: "shadeform.md §4: validation / no capacity, shape undocumented (a guess)",
            401: 'shadeform.md §1: 401 {"message": "Invalid API key"}',
            404: "shadeform.md §3: info of a deleted or unknown id, undocumented (a guess)",
            429: "shadeform.md §1: rate limits undocumented (a guess)",
            500: "shadeform.md §4: 5xx, undocumented",
        }
        # (cloud, type, region, rental type) -> machines left
        self.stock: dict[tuple[str, str, str, str], int] = {}
        for cloud, kind, _, _, _, regions in TYPES:
            for region, _, spot in regions:
                self.stock[(cloud, kind, region, "on_demand")] = 3
                if spot is not None:
                    self.stock[(cloud, kind, region, "spot")] = 3
        self.instances: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.auto_deleted: list[str] = []  # names Shadeform deleted at their date_threshold
        self._routes()

    def server_error(self) -> Response:
        """shadeform.md §4: a 5xx's body is undocumented; a bare text one, as a gateway sends."""
        return Response("Internal Server Error", 500, content_type="text/plain")

    def authorized(self, req: Request) -> bool:
        return req.headers.get("X-API-KEY", "") == self.token

    def unauthorized(self) -> Response:
        return json_response({"message": "Invalid API key"}, 401)

    def too_many(self, retry_after: float) -> Response:
        return json_response({"message": "Too many requests"}, 429, headers={"Retry-After": f"{retry_after:g}"})

    def not_found(self) -> Response:
        return json_response({"message": "not found"}, 404)

    def invalid(self, problem_text: str) -> Response:
        return json_response({"message": problem_text}, 400)

    def _answer(self, req: Request) -> tuple[Response, str]:
        with self.lock:
            self._auto_delete()
        return super()._answer(req)

    # --- instances --------------------------------------------------------------------------------

    def _type(self, cloud: str, kind: str) -> tuple[Any, ...]:
        return next(t for t in TYPES if t[0] == cloud and t[1] == kind)

    def _config(self, t: tuple[Any, ...]) -> dict[str, Any]:
        return {"memory_in_gb": 120, "storage_in_gb": 512, "vcpus": 16, "num_gpus": 1, "gpu_type": t[1],
                "interconnect": "pcie", "nvlink": False, "vram_per_gpu_in_gb": t[4], "gpu_manufacturer": "nvidia"}

    def _make(self, body: dict[str, Any]) -> dict[str, Any]:
        inst_id = str(uuid.uuid4())
        t = self._type(body["cloud"], body["shade_instance_type"])
        rental = body.get("rental_type") or "on_demand"
        spot = next(s for r, _, s in t[5] if r == body["region"])
        address = self._address()
        port = free_port()
        if not self.virtual:
            key = self.keys.get(str(body.get("ssh_key_id") or ""), {}).get("public_key", "ssh-ed25519 AAAA-shadeform")
            # the GPU as its driver names it (what `nvidia-smi` lists: the machine's check before the job)
            smi = f"NVIDIA {'RTX A6000' if t[1] == 'A6000' else t[1].replace('_', ' ')} {t[4]}GB"
            self.boxes.plan(inst_id, key, address=address, port=port, tools=self._tools(smi, 1))
        inst: dict[str, Any] = {
            "id": inst_id, "cloud": body["cloud"], "region": body["region"],
            "shade_instance_type": body["shade_instance_type"], "cloud_instance_type": t[2],
            "cloud_assigned_id": str(uuid.uuid4()), "shade_cloud": bool(body.get("shade_cloud", True)),
            "name": body["name"], "configuration": {**self._config(t), "os": body.get("os") or "ubuntu22.04_cuda12.2"},
            "ip": "", "ssh_user": self.boxes.user if not self.virtual else "shadeform", "ssh_port": 0,
            "status": "creating", "cost_estimate": "0.00", "hourly_price": t[3],
            "rental_terms": {"rental_type": rental, "hourly_price": spot if rental == "spot" else f"{t[3] / 100:.2f}",
                             "ending_at": None},
            "tags": list(body.get("tags") or []), "port_mappings": [], "created_at": _iso(time.time()),
            "deleted_at": None, "boot_time": {"min_boot_in_sec": 180, "max_boot_in_sec": 300},
            "ssh_key_id": str(body.get("ssh_key_id") or ""), "auto_delete": body.get("auto_delete") or {},
            "_reads": 0, "_lag": self.lag_reads, "_address": address, "_port": port, "_t0": time.time(),
            "_fail": False, "_ended": False, "_stock": (body["cloud"], body["shade_instance_type"], body["region"],
                                                        rental),
        }
        self.stock[inst["_stock"]] -= 1
        self.instances[inst_id] = inst
        return inst

    def _advance(self, inst: dict[str, Any]) -> None:
        inst["_reads"] += 1
        step = {"creating": "pending_provider", "pending_provider": "pending"}
        if inst["status"] in step:
            inst["status"] = step[inst["status"]]
        elif inst["status"] == "pending" and inst["_fail"]:
            inst["status"], inst["status_details"] = "error", "provider error"
        elif inst["status"] == "pending" and not self.stuck and inst["_reads"] >= self.ready_after:
            inst["status"], inst["ip"], inst["ssh_port"] = "active", inst["_address"], inst["_port"]
            inst["active_at"] = _iso(time.time())
            if not self.virtual:
                self.boxes.boot(inst["id"], self.ssh_after_s, before=self.guest_before)
        elif inst["status"] == "deleting":
            inst["status"], inst["deleted_at"] = "deleted", _iso(time.time())

    def _end(self, inst: dict[str, Any], *, details: str = "") -> None:
        """Deleting: billing stops (§3), the machine goes, the record stays listed until `deleted`."""
        if inst["_ended"]:
            return
        inst["_ended"] = True
        inst["status"] = "deleting"
        if details:
            inst["status_details"] = details
        self.stock[inst["_stock"]] += 1
        self.billed.append((self._name(inst), time.time() - inst["_t0"],
                            float(inst["rental_terms"]["hourly_price"])))
        self.boxes.vanish(inst["id"])

    def _auto_delete(self) -> None:
        now = time.time()
        for inst in list(self.instances.values()):
            when = (inst.get("auto_delete") or {}).get("date_threshold")
            if when and not inst["_ended"] and datetime.datetime.fromisoformat(when).timestamp() <= now:
                self.auto_deleted.append(self._name(inst))
                self._end(inst)

    def _name(self, inst: dict[str, Any]) -> str:
        return str(inst["name"])

    # --- faults and views for tests ---------------------------------------------------------------

    def reclaim(self, inst_id: str) -> None:
        """A spot instance taken back by Shadeform (§6)."""
        with self.lock:
            self._end(self.instances[inst_id], details="preempted")

    vanish = reclaim

    def _stock_gpu(self, key: tuple[str, str, str, str]) -> str:
        return key[1]  # (cloud, type, region, rental type)

    def alive(self) -> list[str]:
        """Names of the instances that hold a machine and bill: neither deleting nor deleted."""
        with self.lock:
            return sorted(self._name(i) for i in self.instances.values() if not i["_ended"])

    def _virtual(self, name: str, tags: list[str]) -> str:
        with self.lock:
            with self._without_sshd():
                inst = self._make({"cloud": "hyperstack", "region": "norway-1", "shade_instance_type": "A100_80G",
                                   "shade_cloud": True, "name": name, "tags": tags})
            inst["status"], inst["ip"], inst["ssh_port"] = "active", inst["_address"], inst["_port"]
            inst["_lag"] = 0
            return str(inst["id"])

    def stale(self, name: str) -> str:
        """An active instance of ours named `name` (our tags) already on the account (no sshd); its id."""
        return self._virtual(name, ["actor-run", f"actor-run-name={name}"])

    def foreign(self, name: str) -> str:
        """An active instance of the account that is not ours, whatever its name (no tags of ours)."""
        return self._virtual(name, ["team-b"])

    # --- routes -----------------------------------------------------------------------------------

    def _routes(self) -> None:
        @self.route("GET", "/instances/types")
        def types(req: Request) -> Response:
            out = []
            for cloud, kind, ctype, cents, _, regions in TYPES:
                if req.args.get("gpu_type") and req.args["gpu_type"] != kind:
                    continue
                avail = []
                for region, display, spot in regions:
                    avail.append({"region": region, "available": self.stock[(cloud, kind, region, "on_demand")] > 0,
                                  "display_name": display, "rental_type": "on_demand"})
                    if spot is not None:
                        avail.append({"region": region, "available": self.stock[(cloud, kind, region, "spot")] > 0,
                                      "display_name": display, "rental_type": "spot", "hourly_price": spot})
                if req.args.get("available") == "true":
                    avail = [a for a in avail if a["available"]]
                config = {k: v for k, v in self._config(self._type(cloud, kind)).items()}
                config["os_options"] = ["ubuntu22.04_cuda12.2", "ubuntu24.04_cuda12.8"]
                out.append({"cloud": cloud, "shade_instance_type": kind, "cloud_instance_type": ctype,
                            "configuration": config, "hourly_price": cents, "deployment_type": "vm",
                            "availability": avail, "boot_time": {"min_boot_in_sec": 180, "max_boot_in_sec": 300}})
            return json_response({"instance_types": out})

        @self.route("GET", "/sshkeys")
        def list_keys(req: Request) -> Response:
            return json_response({"ssh_keys": list(self.keys.values())})

        @self.route("POST", "/sshkeys/add")
        def add_key(req: Request) -> Response:
            body = req.get_json()
            key = {"id": str(uuid.uuid4()), "name": body["name"], "public_key": body["public_key"],
                   "is_default": not self.keys}
            self.keys[key["id"]] = key
            return json_response({"id": key["id"]})

        @self.route("POST", "/instances/create")
        def create(req: Request) -> Response:
            body = req.get_json()
            self.created.append(body)
            if self.create_500 > 0:
                self.create_500 -= 1
                return json_response({"message": "internal server error"}, 500)
            try:
                t = self._type(body["cloud"], body["shade_instance_type"])
            except StopIteration:
                return json_response({"message": f"unknown instance type {body['shade_instance_type']}"}, 400)
            rental = body.get("rental_type") or "on_demand"
            scripted = self.launch_answers.pop(0) if self.launch_answers else ""
            if (scripted == "no_stock" or body["region"] not in [r for r, _, _ in t[5]]
                    or self.stock.get((body["cloud"], body["shade_instance_type"], body["region"], rental), 0) <= 0):
                return json_response({"message": f"{body['shade_instance_type']} is not available in "
                                                 f"{body['region']} ({rental})"}, 400)
            if rental == "spot" and not body.get("shade_cloud"):
                return json_response({"message": "spot requires shade_cloud"}, 400)
            inst = self._make(body)
            inst["_fail"] = scripted == "fail"
            if self.create_500_made > 0:
                self.create_500_made -= 1
                return json_response({"message": "internal server error"}, 500)
            return json_response({"id": inst["id"]})

        @self.route("GET", "/instances")
        def listing(req: Request) -> Response:
            live = [self._view(i) for i in list(self.instances.values())
                    if i["status"] != "deleted" and not self._hidden(i)]
            for inst in self.instances.values():  # listed once while deleting, then deleted (and unlisted)
                if inst["status"] == "deleting":
                    if inst.get("_seen_deleting"):
                        inst["status"], inst["deleted_at"] = "deleted", _iso(time.time())
                    inst["_seen_deleting"] = True
            return json_response({"instances": live})

        @self.route("GET", "/instances/{id}/info")
        def info(req: Request, id: str) -> Response:
            inst = self.instances.get(id)
            if inst is None or self._hidden(inst):
                return self.not_found()
            if inst["status"] == "deleted":  # once, then unknown (a guess: undocumented)
                self.instances.pop(id, None)
                return json_response(self._view(inst))
            view = self._view(inst)
            self._advance(inst)
            if inst["status"] == "active" and view["status"] != "active":
                view = self._view(inst)
            return json_response(view)

        @self.route("POST", "/instances/{id}/delete")
        def delete(req: Request, id: str) -> Response:
            if self.delete_fail > 0:
                self.delete_fail -= 1
                return json_response({"message": "internal server error"}, 500)
            inst = self.instances.get(id)
            if inst is None or inst["status"] == "deleted":
                return self.not_found()
            self._end(inst)
            return Response(b"", status=200)

    def stop(self) -> None:
        super().stop()
        self.boxes.stop_all()
