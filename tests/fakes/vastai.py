"""A fake Vast.ai API (search offers, create, show, v1 list, manage, destroy, account ssh keys, the
current user) on loopback, written from ../shared/contracts/vastai.md and held to Vast's own
OpenAPI document (vastai-v0.yaml), relaxed only where Vast's own CLI and docs contradict it
(vastai.md §12, `relax` below, each edit citing its row). Its instances are real sshd logins, each
on a loopback address of its own and a host port mapped to the container's 22 (direct SSH).

As untidy as the contract says Vast is:
- every path is answered with or without its trailing slash (the CLI sends one, §12 #1);
- strings carry stray whitespace (`geolocation`, `public_ipaddr`, `local_ipaddrs`, §2.4);
- a 429 is plain text without Retry-After (`rate_limit(n)`, §1);
- a new instance shows `{"instances": null}` for `null_reads` reads (§3) and is missing from the v1
  list for `lag_reads` more (§5);
- `create_500_made` makes the instance and answers 502 (HTML), `create_500` makes none; the CLI's
  own retry then meets the offer taken: 404 `no_such_ask` (§5);
- `launch_answers`: "no_stock" (404 no_such_ask), "fail" / "exited" / "unknown" / "offline" (made,
  then that status: it never recovers, §3), "outbid" (a bid made stopped, answered 400 with
  `new_contract`: the status of that answer is an open question of the contract, a guess here);
- `outbid(id)`: a running bid instance is stopped (cur/intended/next `stopped`, its processes
  killed, §6); `vanish(id)`: its host goes `offline`;
- `stuck`: never past `loading`; `delete_fail`: the next destroy answers 500;
- each offer is one GPU of a host with two free (`_free`): a third rent of it is `no_such_ask`;
- `page_size`: the v1 list's page (25 at Vast, §8); `foreign(label)`: an instance not ours;
  `stale(name)`: one of ours an earlier controller left; `no_stock(gpu)`: that GPU's offers rented.
A container's `CONTAINER_ID` / `CONTAINER_API_KEY` (§10) are in its sessions' environment; that key
may destroy or stop its own instance (unverified at Vast, §10: the adapter falls back to stop).
"""

from __future__ import annotations

import base64
import getpass
import itertools
import json
import secrets
import time
from pathlib import Path
from typing import Any

from support.sshd import free_port
from werkzeug.wrappers import Request, Response

from actor_run.protocols.clouds.gpus import vendor_ids
from actor_run.protocols.messages import Offer
from fakes.openapi_server import OPENAPI, json_response
from fakes.rented import RentedFake

DOCUMENT = OPENAPI / "vastai-v0.yaml"


def relax(doc: dict[str, Any]) -> None:
    """Vast's document where Vast's own CLI and prose docs say otherwise (vastai.md §12)."""
    create = doc["paths"]["/api/v0/asks/{id}"]["put"]["requestBody"]["content"]["application/json"]["schema"]
    props = create["properties"]
    props["env"] = {"type": ["string", "object", "null"]}  # §12 #2: "must be a JSON object (dict)"
    props["runtype"].pop("enum")  # §12 #4: "ssh_direc ssh_proxy" (token sets; the handler checks each)
    create.pop("required", None)  # §12 #5: image optional with template_hash_id
    for prop in props.values():  # §12 #3: the CLI sends null for every unset field
        kind = prop.get("type")
        if isinstance(kind, str):
            prop["type"] = [kind, "null"]
    for extra in ("client_id", "extra"):  # sent by the CLI (vastai.md §2.3), unknown keys are not refused
        props[extra] = {}
    search = doc["paths"]["/api/v0/bundles"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    search["properties"]["type"]["enum"].append("on-demand")  # §12 #6
    search["properties"]["order"].pop("minItems")  # §12 #7: one pair is fine
    search["properties"]["order"].pop("maxItems")
    inst = doc["components"]["schemas"]["Instance"]["properties"]
    v1 = doc["paths"]["/api/v1/instances"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    v1_inst = v1["properties"]["instances"]["items"]["properties"]
    inst["ports"] = v1_inst["ports"]  # §12 #8: the docker map the CLI reads
    inst["extra_env"] = v1_inst["extra_env"]
    show = doc["paths"]["/api/v0/instances/{id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    show["properties"]["instances"] = {"oneOf": [{"$ref": "#/components/schemas/Instance"}, {"type": "null"}]}  # #9
    v1_inst["onstart"] = {"type": ["string", "null"]}  # §12 #10


OFFERS = [  # gpu_name, dph_base, storage $/h, min_bid, reliability2, cuda_max_good, verification, geolocation
    ("A100 SXM4", 1.10, 0.02, 0.45, 0.995, 12.4, "verified", "Texas, US "),
    ("A100 SXM4", 1.15, 0.02, 0.50, 0.990, 12.2, "verified", " Quebec, CA"),
    ("A100 SXM4", 1.20, 0.02, 0.55, 0.992, 12.8, "verified", "Texas, US"),
    ("A100 SXM4", 1.25, 0.02, 0.60, 0.999, 12.4, "verified", "Oregon, US"),
    ("A100 SXM4", 0.60, 0.01, 0.20, 0.990, 12.4, "unverified", "Nowhere, XX"),  # cheap, unverified
    ("A100 SXM4", 0.70, 0.01, 0.25, 0.800, 12.4, "verified", "Nowhere, XX"),  # cheap, unreliable
    ("H100 SXM", 2.20, 0.03, 0.90, 0.995, 12.4, "verified", "Texas, US"),
    ("H100 SXM", 2.30, 0.03, 0.95, 0.995, 12.6, "verified", "Utah, US"),
    ("H100 SXM", 1.50, 0.03, 0.60, 0.995, 11.2, "verified", "Nowhere, XX"),  # cheap, its CUDA too old for H100
]


def error(status: int, error_code: str, msg: str, **extra: Any) -> Response:
    return json_response({"success": False, "error": error_code, "msg": msg, **extra}, status)


def _country(geolocation: str) -> str:
    return geolocation.strip().rsplit(",", 1)[-1].strip()


def _compare(op: str, got: Any, want: Any) -> bool:
    if op == "eq":
        return bool(got == want)
    if op == "neq":
        return bool(got != want)
    if op in ("in", "notin", "nin"):
        return (got in want) == (op == "in")
    if got is None or op not in ("gt", "gte", "lt", "lte"):
        return False
    return bool({"gt": got > want, "gte": got >= want, "lt": got < want, "lte": got <= want}[op])


def _passes(value: Any, cond: Any) -> bool:
    """One search filter {op: x} on an offer's value (the CLI sends numbers as strings, §2.1)."""
    if not isinstance(cond, dict):
        return True
    for op, want in cond.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(want, str):
            try:
                want = float(want)
            except ValueError:
                return False
        if not _compare(op, value, want):
            return False
    return True


class FakeVast(RentedFake):
    CLOUD = "vastai"
    KEY_VAR = "VAST_API_KEY"
    GPUS = ("H100", "A100-80G")
    SEARCHES = (("POST", "/api/v0/bundles"),)  # calls that only read (the offer search is a POST, §2)

    def settings(self) -> dict[str, Any]:
        return {"user": getpass.getuser()}

    def sample_offer(self) -> Offer:
        ask = self.asks[24817000]
        return Offer(cloud="vastai", region=ask["geolocation"].strip(), gpu="A100-80G", hourly_usd=ask["dph_total"],
                     kind=str(ask["id"]))

    def __init__(self, dir: Path, *, token: str = "test-key", virtual: bool = False) -> None:
        super().__init__(DOCUMENT, Path(dir) / "instances", token=token, virtual=virtual, relax=relax)
        self.undocumented = {
            429: "vastai.md §1: the body is often plain text, never a Retry-After",
            401: "vastai.md §1: a wrong key (the document gives 401 on some paths; 404 is observed too)",
            500: "vastai.md §4: 5xx / gateway errors are HTML or empty",
            502: "vastai.md §4: 5xx / gateway errors are HTML or empty",
        }
        self.asks: dict[int, dict[str, Any]] = {}
        for i, (gpu, base, storage, bid, rel, cuda, ver, geo) in enumerate(OFFERS):
            ask_id = 24817000 + i
            self.asks[ask_id] = {
                "id": ask_id, "ask_contract_id": ask_id, "bundle_id": 900000 + i, "machine_id": 5000 + i,
                "host_id": 700 + i, "gpu_name": gpu, "num_gpus": 1, "gpu_ram": 81920, "gpu_total_ram": 81920,
                "dph_base": base, "dph_total": round(base + storage, 6), "min_bid": bid, "is_bid": False,
                "reliability": rel, "reliability2": rel, "cuda_max_good": cuda, "verification": ver,
                "verified": ver == "verified", "rentable": True, "rented": False, "external": False,
                "direct_port_count": 16, "disk_space": 500.0, "geolocation": geo, "compute_cap": 800,
                "driver_version": "550.54.15", "duration": 2592000.0, "end_date": time.time() + 2592000,
                "score": 100.0 - i, "_free": 2,
            }
        self.instances: dict[int, dict[str, Any]] = {}
        self.keys: list[dict[str, Any]] = []
        self.departures: dict[str, int] = {}  # the §12 relaxations each request needed
        self.null_reads = 1
        self.page_size = 25
        self._ids = itertools.count(31000000)
        self._routes()

    # --- the vendor's words -----------------------------------------------------------------------

    def unauthorized(self) -> Response:
        return error(401, "auth_error", "Invalid user key")

    def too_many(self, retry_after: float) -> Response:
        return Response("API requests too frequent: endpoint threshold=1.0", status=429, content_type="text/plain")

    def not_found(self) -> Response:
        return error(404, "not_found", "Not found")

    def invalid(self, problem_text: str) -> Response:
        return error(400, "invalid_args", problem_text)

    def _app(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if len(path) > 1 and path.endswith("/"):  # §12 #1: the CLI and the docs add a trailing slash
            environ["PATH_INFO"] = path.rstrip("/")
            with self.lock:
                self.departures["trailing-slash"] = self.departures.get("trailing-slash", 0) + 1
        return super()._app(environ, start_response)

    def server_error(self) -> Response:
        """vastai.md §4: 5xx / gateway errors are HTML or empty."""
        return Response("<html><body><h1>500 Internal Server Error</h1></body></html>", 500, content_type="text/html")

    def authorized_other(self, req: Request, template: str, params: dict[str, str]) -> bool:
        """A container's own key (CONTAINER_API_KEY) may destroy or stop its own instance."""
        if template != "/api/v0/instances/{id}" or req.method not in ("DELETE", "PUT"):
            return False
        inst = self.instances.get(int(params.get("id", "0")))
        return inst is not None and req.headers.get("Authorization", "") == f"Bearer {inst['_key']}"

    # --- instances --------------------------------------------------------------------------------

    def _make(self, ask: dict[str, Any], body: dict[str, Any], *, status: str | None = None) -> dict[str, Any]:
        inst_id = next(self._ids)
        address = self._address()
        key = secrets.token_hex(16)
        port = free_port()
        if not self.virtual:
            public = "\n".join(k["key"] for k in self.keys)  # account keys reach instances made after them (§9)
            # the GPU as its driver names it (what `nvidia-smi` lists: the machine's check before the job)
            smi = f"NVIDIA {ask['gpu_name']} {int(ask['gpu_ram']) // 1024}GB"
            self.boxes.plan(str(inst_id), public or "ssh-ed25519 AAAA-no-key-registered",
                            env={"CONTAINER_ID": str(inst_id), "CONTAINER_API_KEY": key, "VAST_URL": self.url},
                            address=address, port=port, tools=self._tools(smi, 1))
        bid = body.get("price")
        inst = {
            "id": inst_id, "label": body.get("label"), "actual_status": status, "intended_status": "running",
            "cur_state": "running", "next_state": "running", "status_msg": None,
            "image_uuid": body.get("image") or "vastai/base-image", "image_runtype": "ssh ssh_direc ssh_proxy",
            "image_args": [], "extra_env": [], "onstart": body.get("onstart"),
            "public_ipaddr": f"{address} ", "local_ipaddrs": "10.2.202.31 172.17.0.1 \n",
            "ssh_host": f"ssh{inst_id % 10}.vast.ai", "ssh_idx": str(inst_id % 10), "ssh_port": 20000 + inst_id % 1000,
            "machine_id": ask["machine_id"], "host_id": ask["host_id"], "bundle_id": ask["bundle_id"],
            "start_date": time.time(), "end_date": ask["end_date"], "gpu_name": ask["gpu_name"], "num_gpus": 1,
            "gpu_ram": ask["gpu_ram"], "disk_space": float(body.get("disk") or 8.0), "geolocation": ask["geolocation"],
            "verification": ask["verification"], "reliability2": ask["reliability2"],
            "dph_base": ask["dph_base"] if bid is None else float(bid),
            "dph_total": ask["dph_total"] if bid is None else round(float(bid) + ask["dph_total"] - ask["dph_base"], 6),
            "min_bid": ask["min_bid"], "is_bid": bid is not None, "direct_port_count": 16,
            "_ask": ask["id"], "_port": port, "_address": address, "_key": key, "_reads": 0, "_null": self.null_reads,
            "_lag": self.lag_reads, "_t0": time.time(), "_dead": "", "_ended": False,
        }
        ask["_free"] -= 1  # one GPU of the host's (an offer is one GPU of a machine that has `gpus`)
        ask["rented"] = ask["_free"] <= 0
        self.instances[inst_id] = inst
        return inst

    def _running(self, inst: dict[str, Any]) -> None:
        inst["actual_status"] = "running"
        inst["status_msg"] = "success, running vastai/base-image/ssh"
        inst["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst["_port"])}],
                         "8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst["_port"] + 1)}]}
        if not self.virtual:
            self.boxes.boot(str(inst["id"]), self.ssh_after_s, before=self.guest_before)

    def _advance(self, inst: dict[str, Any]) -> None:
        inst["_reads"] += 1
        if inst["actual_status"] is None:
            inst["actual_status"] = "loading"
            inst["status_msg"] = "Pulling image"
        elif inst["actual_status"] == "loading" and inst["_dead"]:
            inst["actual_status"] = inst["_dead"]
            inst["status_msg"] = f"Error: container {inst['_dead']}"
            inst.pop("ports", None)
        elif inst["actual_status"] == "loading" and not self.stuck and inst["_reads"] >= self.ready_after:
            self._running(inst)

    def _stop(self, inst: dict[str, Any]) -> None:
        """Stopped (outbid, or asked): its processes are killed, its disk kept (and billed, §7)."""
        for k in ("actual_status", "intended_status", "cur_state", "next_state"):
            inst[k] = "stopped"
        inst.pop("ports", None)
        self.boxes.vanish(str(inst["id"]))

    def _end(self, inst: dict[str, Any]) -> None:
        if inst["_ended"]:
            return
        inst["_ended"] = True
        ask = self.asks[inst["_ask"]]
        ask["_free"] += 1
        ask["rented"] = False
        self.billed.append((str(inst["label"] or ""), time.time() - inst["_t0"], inst["dph_total"]))
        self.boxes.vanish(str(inst["id"]))
        self.instances.pop(inst["id"], None)

    # --- faults and views for tests ---------------------------------------------------------------

    def outbid(self, inst_id: str) -> None:
        with self.lock:
            self._stop(self.instances[int(inst_id)])

    def vanish(self, inst_id: str) -> None:
        with self.lock:
            inst = self.instances[int(inst_id)]
            inst["actual_status"], inst["status_msg"] = "offline", "host offline"
            inst.pop("ports", None)
            self.boxes.vanish(inst_id)

    def no_stock(self, gpu: str) -> None:
        with self.lock:
            for ask in self.asks.values():
                if ask["gpu_name"] in vendor_ids(gpu, "vastai"):
                    ask["rented"], ask["_free"] = True, 0

    def alive(self) -> list[str]:
        """Labels of the instances the account holds (and pays for: stopped ones bill their disk)."""
        with self.lock:
            return sorted(str(i["label"] or "") for i in self.instances.values())

    def _virtual_instance(self, label: str) -> str:
        with self.lock:
            ask = next(a for a in reversed(self.asks.values()) if not a["rented"])  # the sample offer stays free
            with self._without_sshd():
                inst = self._make(ask, {"label": label, "image": "vastai/base-image", "disk": 16})
            inst["_null"] = inst["_lag"] = 0
            self._running(inst)
            return str(inst["id"])

    def stale(self, name: str) -> str:
        """A running instance labelled `name` already on the account (no sshd); its id."""
        return self._virtual_instance(name)

    def foreign(self, label: str = "team-notebook") -> str:
        """A running instance of the account that is not ours (another tool's label)."""
        return self._virtual_instance(label)

    # --- routes -----------------------------------------------------------------------------------

    def _routes(self) -> None:
        @self.route("GET", "/api/v0/users/current")
        def user(req: Request) -> Response:
            return json_response({"id": 4242, "key_id": 17, "email": "me@example.com", "balance": 100.0,
                                  "ssh_key": self.keys[0]["key"] if self.keys else "", "sid": "s-1"})

        @self.route("GET", "/api/v0/ssh")
        def list_keys(req: Request) -> Response:
            return json_response(self.keys)

        @self.route("POST", "/api/v0/ssh")
        def add_key(req: Request) -> Response:
            text = str(req.get_json().get("ssh_key") or "").strip()
            if not text:
                return error(400, "no_ssh_key", "No ssh key provided")
            key = {"id": 100 + len(self.keys), "user_id": 4242, "key": text, "created_at": "2026-12-01T00:00:00Z",
                   "deleted_at": None}
            self.keys.append(key)
            return json_response({"success": True, "key": {**{k: v for k, v in key.items() if k != "key"},
                                                           "public_key": text}})

        @self.route("POST", "/api/v0/bundles")
        def search(req: Request) -> Response:
            body = req.get_json()
            filters = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False}, **body}
            bid = body.get("type") == "bid"
            found = []
            for ask in self.asks.values():
                view = {**ask, "geolocation": _country(ask["geolocation"])}
                if bid:  # a bid search prices dph_total at min_bid (§2.1)
                    view["dph_total"] = round(ask["min_bid"] + ask["dph_total"] - ask["dph_base"], 6)
                if all(_passes(view.get(k), c) for k, c in filters.items()
                       if k not in ("type", "order", "limit", "allocated_storage")):
                    found.append({**{k: v for k, v in ask.items() if not k.startswith("_")},
                                  "dph_total": view["dph_total"], "is_bid": bid})
            for col, way in reversed(body.get("order") or [["score", "desc"]]):
                found.sort(key=lambda a, c=col: a.get(c) or 0, reverse=way == "desc")
            return json_response({"offers": found[: int(body.get("limit") or 64)]})

        @self.route("PUT", "/api/v0/asks/{id}")
        def create(req: Request, id: str) -> Response:
            body = req.get_json()
            self.created.append(body)
            for token in str(body.get("runtype") or "ssh").split():
                if token not in ("ssh", "jupyter", "args", "ssh_proxy", "ssh_direct", "ssh_direc", "jupyter_proxy",
                                 "jupyter_direct", "jupyter_direc"):
                    return error(400, "invalid_args", f"invalid runtype {token}")
            ask = self.asks.get(int(id))
            gone = error(404, "invalid_args", f"error 404/3603: no_such_ask Instance type by id {id} is not available.",
                         ask_id=int(id))
            if self.create_500 > 0:
                self.create_500 -= 1
                return Response("<html><body><h1>502 Bad Gateway</h1></body></html>", 502, content_type="text/html")
            scripted = self.launch_answers.pop(0) if self.launch_answers else ""
            if ask is None or ask["rented"] or scripted == "no_stock":
                return gone
            price = body.get("price")
            if price is not None and float(price) < ask["min_bid"]:
                return error(400, "invalid_price", f"Please set a bid price >= {ask['min_bid']}", ask_id=ask["id"])
            if scripted == "outbid":  # a losing bid: made stopped, and an error naming it (§4, §6)
                inst = self._make(ask, body, status="stopped")
                inst["_null"] = inst["_lag"] = 0
                self._stop(inst)
                return error(400, "invalid_args", "bid is not high enough: instance created stopped",
                             ask_id=ask["id"], new_contract=inst["id"])
            inst = self._make(ask, body)
            if scripted in ("fail", "exited", "unknown", "offline"):
                inst["_dead"] = "exited" if scripted == "fail" else scripted
            if self.create_500_made > 0:
                self.create_500_made -= 1
                return Response("<html><body><h1>502 Bad Gateway</h1></body></html>", 502, content_type="text/html")
            return json_response({"success": True, "new_contract": inst["id"]})

        @self.route("GET", "/api/v0/instances/{id}")
        def show(req: Request, id: str) -> Response:
            inst = self.instances.get(int(id))
            if inst is None:
                return json_response({"instances": None})  # destroyed or unknown: 200 null (§4)
            if inst["_null"] > 0:  # just created: not shown yet (§3)
                inst["_null"] -= 1
                return json_response({"instances": None})
            if self._hidden(inst):
                return json_response({"instances": None})
            view = self._view(inst)
            self._advance(inst)
            if inst["actual_status"] == "running" and view["actual_status"] != "running":
                view = self._view(inst)
            return json_response({"instances": view})

        @self.route("PUT", "/api/v0/instances/{id}")
        def manage(req: Request, id: str) -> Response:
            inst = self.instances.get(int(id))
            if inst is None:
                return error(404, "no_such_instance", "Instance with that ID does not exist.")
            body = req.get_json()
            if "label" in body:
                inst["label"] = body["label"]
            if body.get("state") == "stopped":
                self._stop(inst)
            return json_response({"success": True})

        @self.route("PUT", "/api/v0/instances/bid_price/{id}")
        def change_bid(req: Request, id: str) -> Response:
            inst = self.instances.get(int(id))
            if inst is None:
                return error(404, "no_such_instance", "Instance with that ID does not exist.")
            price = float(req.get_json()["price"])
            if price < inst["min_bid"]:
                return error(400, "invalid_args", f"Please set a bid price >= {inst['min_bid']}.")
            inst["dph_base"], inst["is_bid"] = price, True
            return json_response({"success": True})

        @self.route("DELETE", "/api/v0/instances/{id}")
        def destroy(req: Request, id: str) -> Response:
            if self.delete_fail > 0:
                self.delete_fail -= 1
                return Response("<html><body><h1>500 Internal Server Error</h1></body></html>", 500,
                                content_type="text/html")
            inst = self.instances.get(int(id))
            if inst is None:
                return error(404, "no_such_instance", "Instance with that ID does not exist.")
            self._end(inst)
            return json_response({"success": True})

        @self.route("GET", "/api/v1/instances")
        def listing(req: Request) -> Response:
            try:
                filters = json.loads(req.args.get("select_filters") or "{}")
                after = 0
                if req.args.get("after_token"):
                    after = int(json.loads(base64.b64decode(req.args["after_token"]))["values"]["id"])
            except (ValueError, KeyError, TypeError):
                return error(400, "invalid_token", "Error in query parameters: invalid after_token")
            limit = int(req.args.get("limit") or 25)
            limit = 5 if limit <= 0 else min(limit, 25, self.page_size)
            rows = []
            for inst in sorted(self.instances.values(), key=lambda i: i["id"]):
                if inst["id"] <= after or self._hidden(inst):
                    continue
                view = self._view(inst)
                if all(_passes(view.get(k), c) for k, c in filters.items()):
                    rows.append(view)
            page, more = rows[:limit], len(rows) > limit
            token = base64.b64encode(json.dumps({"values": {"id": page[-1]["id"]}}).encode()).decode() if more else None
            counts: dict[str, int] = {}
            for r in rows:
                counts[str(r["label"] or "")] = counts.get(str(r["label"] or ""), 0) + 1
            return json_response({"success": True, "instances_found": len(page), "total_instances": len(rows),
                                  "label_counts": counts, "next_token": token, "instances": page})

    def stop(self) -> None:
        super().stop()
        self.boxes.stop_all()
