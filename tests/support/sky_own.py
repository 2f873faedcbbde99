"""SkyPilot's own code, run in SkyPilot's virtual environment (never in ours): what the tests of the
`skypilot` cloud check the adapter and the fake `sky` against. Offline: nothing here reaches an
API server or a cloud (the SDK calls that would are answered here, below the CLI's own code).

Run as `<sky python> tests/support/sky_own.py <what>` with a JSON request on stdin; prints a JSON answer.
Or as `<sky python> tests/support/sky_own.py serve`: SkyPilot is imported once (seconds of CPU), then each
line on stdin, `{"what", "request", "env"}`, is answered on stdout as one line, `{"answer"}` or
`{"error"}`, by a fork of that process with `env` added to its environment (a request never sees
another's state; the fork exits after answering). What each <what> answers:

    parse        [argv, ...] -> [{"command": "launch", "params": {...}} | {"error": "..."}]: each
                 command line through SkyPilot's click objects (`make_context`, callbacks never run)
    ssh          {"sshd_pid": N} -> bool: skylet/autostop_lib.py `has_active_ssh_sessions()` on the
                 processes under that sshd (the machine is shared: the process table is narrowed)
    cli          {"argv": [...], "catalog": [...], "clusters": [...], "request_id": "..."} ->
                 {"code", "out", "err"}: the real `sky` command, its SDK answering from these
    models       {"status": [...], "requests": [...]} -> [error, ...]: validated with SkyPilot's
                 StatusResponse and RequestPayload
    key          {} -> the path 0.14 keeps its private key at, with `<user hash>` for the hash
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    import click
    from sky.client.cli import command

    out: list[dict[str, Any]] = []
    for argv in argvs:
        try:
            group: click.Command = command.cli
            ctx = group.make_context("sky", list(argv))
            names = []
            while isinstance(group, click.Group):
                rest = [*ctx.protected_args, *ctx.args]  # click keeps the subcommand there
                name, cmd, args = group.resolve_command(ctx, rest)
                assert cmd is not None
                assert name is not None
                names.append(name)
                ctx = cmd.make_context(name, args, parent=ctx)
                group = cmd
            out.append({"command": " ".join(names), "params": json.loads(json.dumps(ctx.params, default=repr))})
        except click.ClickException as exc:
            out.append({"error": f"{type(exc).__name__}: {exc.format_message()}"})
    return out


def ssh(sshd_pid: int) -> bool:
    import psutil
    from sky.skylet import autostop_lib

    real = psutil.process_iter

    def under_sshd(*args: Any, **kwargs: Any) -> Any:
        family = {sshd_pid, *(p.pid for p in psutil.Process(sshd_pid).children(recursive=True))}
        return (p for p in real(*args, **kwargs) if p.pid in family)

    psutil.process_iter = under_sshd
    try:
        return bool(autostop_lib.has_active_ssh_sessions())
    finally:
        psutil.process_iter = real


def _catalog_frame(rows: list[list[Any]]) -> Any:
    """The fake's catalog rows as AWS's vms.csv columns (GpuInfo as the catalog writes it)."""
    import pandas as pd

    regions = ("us-east-1", "us-east-2", "us-west-2")
    return pd.DataFrame([{
        "InstanceType": kind, "AcceleratorName": gpu, "AcceleratorCount": float(count), "vCPUs": float(cpus),
        "MemoryGiB": float(mem),
        "Price": price, "SpotPrice": spot, "Region": region, "AvailabilityZone": f"{region}a",
        "GpuInfo": repr({"Gpus": [{"Name": gpu, "Count": count, "MemoryInfo": {"SizeInMiB": dev * 1024}}],
                         "TotalGpuMemoryInMiB": dev * 1024 * count}),
    } for kind, gpu, count, cpus, mem, dev, price, spot in rows for region in regions])


def cli(req: dict[str, Any]) -> dict[str, Any]:
    """The real `sky <argv>`: SkyPilot's command code runs; what it would ask its API server is
    answered from the request (the catalog through SkyPilot's own list_accelerators_impl)."""
    from sky.catalog import common as catalog_common
    from sky.client import sdk
    from sky.client.cli import command

    frame = _catalog_frame(req.get("catalog", []))
    records = req.get("clusters", [])
    answers: dict[str, Any] = {}

    def request(name: str, value: Any) -> str:
        answers[name] = value
        return name

    def list_accelerators(**kw: Any) -> str:
        return request("list_accelerators", catalog_common.list_accelerators_impl(
            "AWS", frame, kw["gpus_only"], kw["name_filter"], kw["region_filter"], kw["quantity_filter"],
            kw.get("case_sensitive", True), kw.get("all_regions", False)))

    def status(clusters: Any = None, **_: Any) -> str:
        return request("status", [r for r in records if clusters is None or r["name"] in clusters])

    def stream_and_get(request_id: Any, **_: Any) -> Any:
        return answers[request_id]

    sdk.list_accelerators = list_accelerators  # type: ignore[assignment]
    sdk.enabled_clouds = lambda **_: request("enabled_clouds", ["aws"])  # type: ignore[assignment]
    sdk.get = stream_and_get  # type: ignore[assignment]
    sdk.stream_and_get = stream_and_get  # type: ignore[assignment]
    sdk.status = status  # type: ignore[assignment]
    sdk.down = lambda name, **_: req["request_id"]  # type: ignore[assignment]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            command.cli.main(list(req["argv"]), prog_name="sky", standalone_mode=False)
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # what the CLI prints and exits 1 with (print_exception_no_traceback)
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


def models(req: dict[str, Any]) -> list[str]:
    from sky.schemas.api.responses import StatusResponse
    from sky.server.requests.payloads import RequestPayload

    errors = []
    for record in req.get("status", []):
        try:
            StatusResponse.model_validate(record)
        except Exception as exc:  # the validation error is the answer
            errors.append(f"status {record.get('name')}: {exc}")
    for record in req.get("requests", []):
        try:
            RequestPayload.model_validate(record)
        except Exception as exc:  # the validation error is the answer
            errors.append(f"request {record.get('request_id')}: {exc}")
    return errors


def key() -> str:
    from sky.utils import auth_utils

    private, _, _ = auth_utils.get_ssh_key_and_lock_path("<user hash>")
    return str(private)


def answer(what: str, req: Any) -> Any:
    return {
        "parse": lambda: parse(req),
        "ssh": lambda: ssh(int(req["sshd_pid"])),
        "cli": lambda: cli(req),
        "models": lambda: models(req),
        "key": key,
    }[what]()


def serve() -> None:
    """Answers requests, one line each, each in a fork of this process (see the module docstring)."""
    if os.fork():  # detached from whoever started it (a test's check of its own children does not count
        os._exit(0)  # it); it ends when its stdin closes
    import traceback

    import click  # noqa: F401  (imported here once: what every request's fork then has already)
    import pandas  # noqa: F401
    import psutil  # noqa: F401
    from sky.catalog import common  # noqa: F401
    from sky.client import sdk  # noqa: F401
    from sky.client.cli import command  # noqa: F401
    from sky.schemas.api.responses import StatusResponse  # noqa: F401
    from sky.server.requests.payloads import RequestPayload  # noqa: F401
    from sky.skylet import autostop_lib  # noqa: F401
    from sky.utils import auth_utils  # noqa: F401

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever SkyPilot prints goes to stderr; stdout carries only the answers
    for line in sys.stdin:
        msg = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the fork: answer, write, exit without running the parent's cleanup
            os.close(r)
            os.environ.update(msg.get("env", {}))
            try:
                out: dict[str, Any] = {"answer": answer(msg["what"], msg.get("request", {}))}
            except BaseException:
                out = {"error": traceback.format_exc()}
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(out))
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            reply = f.read()
        os.waitpid(pid, 0)
        answers.write((reply or json.dumps({"error": "the fork died without an answer"})) + "\n")
        answers.flush()


def main() -> None:
    what = sys.argv[1]
    if what == "serve":
        serve()
        return
    req = json.loads(sys.stdin.read() or "{}")
    with contextlib.redirect_stdout(sys.stderr):  # whatever SkyPilot prints on import stays out of the answer
        result = answer(what, req)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
