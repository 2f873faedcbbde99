"""The payload a serverless job carries, both sides of it: the controller packs, the worker unpacks.

A payload is the `input` of one queue job::

    {"actor_run": 1, "command": ..., "seed": ..., "attempt": ..., "env": {...}, "request": "...",
     "archive": {"sha256": <hex of the bytes>, "inline": <base64 of a tar.gz>}, "code": true,
     "resume": false, "stream_s": 1.0}

An archive above the inline limit is put in the user's object store instead, and the payload
carries `"archive": {"sha256": ..., "size": <bytes>, "url": <a presigned GET URL>}`: the worker
downloads it (no credentials of the store ever reach it) and checks size and hash; a mismatch,
or a URL that does not answer, is an `InputError` (its text starts with `INPUT_ERROR`, which the
controller reads as the attempt's `input` failure).

The archive is content-addressed (its sha256 is checked before anything is unpacked) and holds
`code/` (the code snapshot) and `in/<name>/<basename>` (each input, file or folder), `in/resume/`
(a checkpoint from an earlier attempt). Output goes back the same way: `out/` and
`progress.jsonl` in a tar.gz, with its sha256: inline in the last stream chunk up to `OUT_INLINE_LIMIT`
(a RunPod stream chunk is at most 1 MB); above it, PUT by the worker to the presigned URL the payload
names in `"out_put": {"url": ...}` (the controller's object store) and the chunk says
`"out": {"sha256", "size", "put": true}`; with no such URL it is a `TRANSFER_ERROR` naming the size.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

VERSION = 1
# RunPod's /run takes a body up to 10 MB; base64 makes 4 bytes of 3, and the rest of the body is small
PAYLOAD_LIMIT = 10 * 1000 * 1000
INLINE_LIMIT = PAYLOAD_LIMIT * 3 // 4 - 64 * 1024
# RunPod's stream chunk is at most 1 MB (contract §11 /stream); a chunk the handler yields stays under
# CHUNK_LIMIT as JSON, and out/ rides in one inline only up to OUT_INLINE_LIMIT bytes (base64: 4 of 3)
CHUNK_LIMIT = 1000 * 1000 - 16 * 1024
OUT_INLINE_LIMIT = CHUNK_LIMIT * 3 // 4 - 4 * 1024


# What the handler's terminal `{"error": ...}` starts with when the fault is not the job's own. The SDK
# passes a yielded error through as it is; a handler that raises instead reaches the queue as
# `handler: <message> \ntraceback: ...` (a generator) or as a JSON object whose `error_message` is the
# message (a plain function): `worker_error` reads the marker in each of those places.
INPUT_ERROR = "actor-run input: "  # the archive could not be had as sent: the attempt's `input`
TRANSFER_ERROR = "actor-run transfer_failed: "  # out/ could not come back within the limits
PREEMPTED_ERROR = "actor-run preempted: "  # the worker was stopped (SIGTERM) while the job ran


def worker_error(error: str) -> tuple[str, str]:
    """`(marker, text)` of a queue job's error: the marker it carries (`INPUT_ERROR`, `TRANSFER_ERROR`,
    `PREEMPTED_ERROR`, or "" for the job's own failure) wherever the SDK put it, and the message
    without the SDK's wrapping."""
    text = error
    if text.startswith("handler: "):  # rp_job.run_job_generator: f"handler: {err} \ntraceback: ..."
        text = text[len("handler: "):].split(" \ntraceback: ", 1)[0]
    elif text.startswith("{"):  # rp_job.run_job: json.dumps({"error_type", "error_message", ...})
        try:
            decoded = json.loads(text)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("error_message"), str):
            text = decoded["error_message"]
    for marker in (INPUT_ERROR, TRANSFER_ERROR, PREEMPTED_ERROR):
        if text.startswith(marker):
            return marker, text
    return "", text


class PayloadError(Exception):
    """The payload is malformed or its archive does not match its hash (the sender's fault)."""


class InputError(PayloadError):
    """The job's archive could not be had as sent (download failed, size or hash not as named)."""

    def __init__(self, problem: str) -> None:
        super().__init__(INPUT_ERROR + problem)


def pack(entries: list[tuple[str, Path | bytes]]) -> bytes:
    """A tar.gz of `(name in the archive, local file or folder, or a tar's bytes to splice in)`;
    links are kept as links, never followed."""
    buf = io.BytesIO()
    # mtime 0 in the gzip header: the same entries pack to the same bytes (the archive's key in a store)
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for arcname, src in entries:
            if isinstance(src, bytes):
                with tarfile.open(fileobj=io.BytesIO(src)) as inner:
                    for m in inner.getmembers():
                        m.name = f"{arcname}/{m.name}" if m.name not in ("", ".") else arcname
                        tar.addfile(m, inner.extractfile(m) if m.isfile() else None)
            else:
                tar.add(src, arcname=arcname)
    return buf.getvalue()


def tar_folder(folder: Path) -> bytes:
    """An uncompressed tar of a folder's contents (names relative to it), links kept as links."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(folder.iterdir()):
            tar.add(p, arcname=p.name)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_blob(data: bytes) -> dict[str, str]:
    return {"sha256": sha256(data), "inline": base64.b64encode(data).decode()}


def url_blob(url: str, digest: str, size: int) -> dict[str, Any]:
    """An archive the worker downloads (from the object store, by a presigned URL)."""
    return {"sha256": digest, "size": size, "url": url}


def fetch_blob(blob: dict[str, Any], timeout_s: float = 300.0) -> bytes:
    """The bytes behind `{"sha256", "size", "url"}` (urllib, at most `size` bytes read), checked."""
    url, digest, size = blob.get("url"), blob.get("sha256"), blob.get("size")
    if not isinstance(url, str) or not isinstance(digest, str) or not isinstance(size, int) or size < 0:
        raise PayloadError("an archive by URL needs `url`, `sha256` and `size`")
    if not url.startswith(("https://", "http://")):
        raise InputError("the archive's URL is not http(s)")
    where = url.split("?", 1)[0]  # the signature stays out of every message
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            data: bytes = r.read(size + 1)
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.code if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        raise InputError(f"could not download the archive from {where}: {reason}") from None
    if len(data) != size:
        got = str(len(data)) if len(data) <= size else f"more than {size}"
        raise InputError(f"the archive at {where} has {got} bytes, not {size}")
    if sha256(data) != digest:
        raise InputError(f"the archive at {where} has sha256 {sha256(data)}, not {digest}")
    return data


def put_blob(url: str, data: bytes, timeout_s: float = 300.0) -> None:
    """PUT `data` to a presigned URL (the worker's way to the controller's store); `OSError` when it
    could not, its text naming the URL without its signature."""
    where = url.split("?", 1)[0]
    if not url.startswith(("https://", "http://")):
        raise OSError(f"the output URL {where} is not http(s)")
    req = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/gzip"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.code if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        raise OSError(f"could not put {len(data)} bytes to {where}: {reason}") from None


def decode_blob(blob: Any) -> bytes:
    """The bytes of `{"sha256", "inline"}` (or of `{"sha256", "size", "url"}`), checked against the hash."""
    if isinstance(blob, dict) and "url" in blob and "inline" not in blob:
        return fetch_blob(blob)
    if not isinstance(blob, dict) or not isinstance(blob.get("inline"), str) or not isinstance(blob.get("sha256"), str):
        raise PayloadError("an archive needs `sha256` and `inline`")
    data = base64.b64decode(blob["inline"])
    if sha256(data) != blob["sha256"]:
        raise PayloadError(f"the archive's sha256 is {sha256(data)}, not {blob['sha256']}")
    return data


def unpack(data: bytes, dest: Path) -> None:
    """Extract regular files and folders only (links may point anywhere on the worker: skipped),
    never outside `dest`."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data))  # noqa: SIM115 - closed by the `with` below; its open alone may raise
    except tarfile.TarError as exc:
        raise PayloadError(f"the archive is not a tar.gz: {exc}") from exc
    with tar:
        members = [m for m in tar.getmembers()
                   if (m.isfile() or m.isdir() or m.issym()) and not m.name.startswith("/")
                   and ".." not in Path(m.name).parts]
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise PayloadError(f"the archive holds {exc.tarinfo.name!r}, which points outside it") from exc
