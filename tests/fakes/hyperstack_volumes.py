"""The fake Hyperstack's block volumes (hyperstack.md §2: `/core/volumes`, a VM's `attach-volumes` and
`detach-volumes`), held to Hyperstack's OpenAPI document like the rest of fakes/hyperstack.py, and as
slow and untidy as the vendor: a new volume reads `creating` before `available`; an attachment reads
`ATTACHING` for `attach_reads` reads before `ATTACHED`; a volume whose VM is deleted (or that is
detached) reads `detaching`, still attached, for `detach_reads` reads before it is `available` again,
and an attach asked meanwhile is refused as the vendor does (200, `status: false`, "We can process
with only available volumes."). Volume names are unique across the account (409); a region outside
`regions` refuses a volume (400). With `list_lag` n, a new volume is missing from the next n listings
(`GET /core/volumes`) that would show it, as an eventually consistent listing is. `volumes` holds them
by id; `asked` every create's body; `attaches` counts the attach calls.

THE STAND-IN (why: the fake's VMs are sshd logins on this computer, and a login here has no block
device to attach, format or mount, nor the right to mount one). Each volume's bytes are a folder,
`<dir>/volumes/<id>/`: `superblock` once it is formatted, `fs/` its file system. An attachment that
reaches ATTACHED reports as its `device` a path under `<dir>/devices/` (Hyperstack's are
/dev/disk/by-id/virtio-...) that links to that folder, and is removed at detach. The VM's PATH starts
with `sudo`, `blkid`, `mkfs.ext4`, `mountpoint` and `mount` stand-ins (`tools()`) that do to these
folders what the real commands do to a block device: `blkid` exits 2 on a blank device; `mkfs.ext4`
writes the superblock and an empty file system (with its `lost+found`), destroying what was there;
`mount DEV DIR` makes DIR (empty, or missing) a link to DEV's file system (and notes DIR, so the
fake takes the link away when the VM goes, as the kernel's mount goes with the machine); `mountpoint
-q DIR` says whether DIR is such a link; `sudo -n CMD` runs CMD. The adapter's real format-and-mount
script runs unchanged against them; a second attempt's machine mounts the first one's bytes.
"""

from __future__ import annotations

import datetime
import itertools
import shutil
import time
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from fakes.openapi_server import json_response


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refusal(status: int, message: str, reason: str) -> Response:
    return json_response({"status": False, "message": message, "error_reason": reason}, status)


def tools(volumes_dir: Path) -> dict[str, str]:
    """The block-device stand-ins a fake VM's PATH starts with (see the module docstring)."""
    vols = str(volumes_dir)
    return {
        "sudo": '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n',
        "blkid": '#!/bin/sh\nfor d; do :; done\n[ -f "$d/superblock" ] || exit 2\n'
                 'echo "$d: LABEL=\\"$(cat "$d/superblock")\\" TYPE=\\"ext4\\""\n',
        "mkfs.ext4": '#!/bin/sh\nlabel=""\nwhile [ $# -gt 1 ]; do [ "$1" = -L ] && { label=$2; shift; }; shift; done\n'
                     f'case "$(readlink -f "$1")" in {vols}/*) ;; *) echo "mkfs.ext4: $1: not a block device" >&2; '
                     'exit 1;; esac\n'
                     'rm -rf "$1/fs" && mkdir -p "$1/fs/lost+found" && echo "$label" > "$1/superblock"\n',
        "dd": '#!/bin/sh\nsrc=""\nfor a; do case "$a" in if=*) src=${a#if=};; esac; done\n'
              f'case "$(readlink -f "$src")" in {vols}/*) [ ! -e "$(readlink -f "$src")/unreadable" ];;'
              ' *) exit 1;; esac\n',
        "mountpoint": '#!/bin/sh\n[ "$1" = -q ] && shift\n'
                      f'[ -L "$1" ] && case "$(readlink "$1")" in {vols}/*) exit 0;; esac\nexit 1\n',
        "mount": '#!/bin/sh\ndev=$1; dir=$2\n'
                 '[ -f "$dev/superblock" ] || { echo "mount: $dir: wrong fs type, bad option, bad superblock on $dev" '
                 '>&2; exit 32; }\n'
                 '{ [ ! -e "$dir" ] || rmdir "$dir"; } || '
                 '{ echo "mount: $dir: not an empty directory" >&2; exit 32; }\n'
                 'ln -s "$(readlink -f "$dev")/fs" "$dir" && echo "$dir" >> "$(dirname "$0")/../mounts"\n',
    }


class FakeVolumes:
    """The volumes of one fake Hyperstack (`fake`: its environments, VMs and lock)."""

    def __init__(self, fake: Any, dir: Path) -> None:
        self.fake = fake
        self.dir = Path(dir) / "volumes"
        self.devices = Path(dir) / "devices"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.devices.mkdir(parents=True, exist_ok=True)
        self.volumes: dict[int, dict[str, Any]] = {}
        self.regions = {"CANADA-1", "NORWAY-1", "US-1"}  # where a volume can be made
        self.attach_reads = 2
        self.detach_reads = 2
        self.attaches = 0
        self.list_lag = 0  # how many listings a new volume is missing from (its reads by id find it)
        self.asked: list[dict[str, Any]] = []  # every create's body
        self._ids = itertools.count(501)
        self._attachment_ids = itertools.count(9001)

    def view(self, v: dict[str, Any]) -> dict[str, Any]:
        return {k: ([{x: y for x, y in a.items() if not x.startswith("_")} for a in val] if k == "attachments"
                    else val) for k, val in v.items() if not k.startswith("_")}

    def _advance(self, v: dict[str, Any]) -> None:
        """One read's worth of the vendor's slowness."""
        if v["status"] == "creating":
            v["status"] = "available"
            return
        for a in list(v["attachments"]):
            a["_reads"] -= 1
            if a["_reads"] > 0:
                continue
            if a["status"] == "ATTACHING":
                a["status"] = "ATTACHED"
                v["status"] = "in-use"
                device = self.devices / f"virtio-{v['id']}-{a['instance_id']}"
                device.unlink(missing_ok=True)
                device.symlink_to(self.dir / str(v["id"]))
                a["device"] = str(device)
            elif a["status"] == "DETACHING":
                v["attachments"].remove(a)
                (self.devices / f"virtio-{v['id']}-{a['instance_id']}").unlink(missing_ok=True)
                v["status"] = "available"

    def _detach(self, v: dict[str, Any], vm_id: int) -> None:
        for a in v["attachments"]:
            if a["instance_id"] == vm_id and a["status"] != "DETACHING":
                a["status"], a["_reads"] = "DETACHING", self.detach_reads
                v["status"] = "detaching"

    def vm_ended(self, vm_id: int, box_dir: Path) -> None:
        """The VM is deleted: its volumes detach (slowly), and its mounts go with it. The fake's lock is held."""
        for v in self.volumes.values():
            self._detach(v, vm_id)
        mounts = box_dir / "mounts"
        if mounts.exists():
            for line in mounts.read_text().splitlines():
                link = Path(line)
                if link.is_symlink():
                    link.unlink()

    def stop(self) -> None:
        shutil.rmtree(self.devices, ignore_errors=True)

    def routes(self) -> None:
        fake = self.fake

        @fake.route("GET", "/core/volumes")
        def listing(req: Request) -> Response:
            search = req.args.get("search", "")
            vols = []
            for v in self.volumes.values():
                if search not in v["name"]:
                    continue
                if v["_unlisted"] > 0:  # made a moment ago: the listing lags
                    v["_unlisted"] -= 1
                    continue
                vols.append(self.view(v))
            return json_response({"status": True, "message": "Success", "volumes": vols, "count": len(vols),
                                  "page": 1, "page_size": 200})

        @fake.route("POST", "/core/volumes")
        def create(req: Request) -> Response:
            body = req.get_json()
            self.asked.append(body)
            env = fake.environments.get(body["environment_name"])
            if env is None:
                return _refusal(404, "Environment not found", "not_found")
            if any(v["name"] == body["name"] for v in self.volumes.values()):
                return _refusal(409, "A volume with this name already exists", "already_exist")
            if env["region"] not in self.regions:
                return _refusal(400, f"Volume type {body['volume_type']} is not available in {env['region']}",
                                "bad_request")
            vol_id = next(self._ids)
            (self.dir / str(vol_id)).mkdir()
            v = {"id": vol_id, "name": body["name"], "size": body["size"], "volume_type": body["volume_type"],
                 "status": "creating", "description": body.get("description", ""), "bootable": False,
                 "environment": {"name": env["name"], "region": env["region"], "features": {}},
                 "attachments": [], "created_at": _iso(time.time()), "updated_at": _iso(time.time()),
                 "_unlisted": self.list_lag}
            self.volumes[vol_id] = v
            return json_response({"status": True, "message": "Volume created", "volume": self.view(v)})

        @fake.route("GET", "/core/volumes/{volume_id}")
        def read(req: Request, volume_id: str) -> Response:
            v = self.volumes.get(int(volume_id))
            if v is None:
                return _refusal(400, "Volume not found", "not_found")  # Get_Volume documents 400, no 404
            self._advance(v)
            return json_response({"status": True, "message": "Success", "volume": self.view(v)})

        @fake.route("DELETE", "/core/volumes/{volume_id}")
        def delete(req: Request, volume_id: str) -> Response:
            v = self.volumes.get(int(volume_id))
            if v is None:
                return _refusal(404, "Volume not found", "not_found")
            if v["attachments"]:
                return _refusal(400, "Volume is attached to a virtual machine", "bad_request")
            del self.volumes[int(volume_id)]
            shutil.rmtree(self.dir / volume_id, ignore_errors=True)
            return json_response({"status": True, "message": "Volume deleted"})

        @fake.route("POST", "/core/virtual-machines/{vm_id}/attach-volumes")
        def attach(req: Request, vm_id: str) -> Response:
            self.attaches += 1
            vm = fake.vms.get(int(vm_id))
            if vm is None:
                return fake.not_found()
            made = []
            for vol_id in req.get_json().get("volume_ids") or []:
                v = self.volumes.get(vol_id)
                if v is None:
                    return _refusal(404, "Volume not found", "not_found")
                if v["environment"]["region"] != vm["environment"]["region"]:
                    return _refusal(400, "Volume and virtual machine are in different regions", "bad_request")
                if v["status"] != "available":
                    return json_response({"status": False, "message": "We can process with only available volumes.",
                                          "volume_attachments": []})
                a = {"id": next(self._attachment_ids), "instance_id": int(vm_id), "volume_id": vol_id,
                     "device": "", "status": "ATTACHING", "protected": False, "created_at": _iso(time.time()),
                     "_reads": self.attach_reads}
                v["attachments"].append(a)
                v["status"] = "attaching"
                made.append({k: x for k, x in a.items() if not k.startswith("_")})
            return json_response({"status": True, "message": "Attaching", "volume_attachments": made})

        @fake.route("POST", "/core/virtual-machines/{vm_id}/detach-volumes")
        def detach(req: Request, vm_id: str) -> Response:
            gone = []
            for vol_id in req.get_json().get("volume_ids") or []:
                v = self.volumes.get(vol_id)
                if v is not None:
                    self._detach(v, int(vm_id))
                    gone += [{k: x for k, x in a.items() if not k.startswith("_")} for a in v["attachments"]
                             if a["instance_id"] == int(vm_id)]
            return json_response({"status": True, "message": "Detaching", "volume_attachments": gone})
