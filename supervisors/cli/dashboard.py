"""`actor-run dashboard [--host 127.0.0.1] [--port 8765] [--token T] [--ledger ...]`: a live web page of
a ledger (every run, a run's jobs, a job's attempts and log, machines alive, controllers' leases),
updated by server-sent events, and Prometheus metrics at `/metrics`.

Built on Starlette (routing, requests, streaming responses: the ASGI framework httpx's authors keep,
small and typed) served by uvicorn (its HTTP parsing is h11's: nothing here parses HTTP). Reads go
through the ledger's read side only; the one write, a cancel, goes through `actor-run cancel`'s
table (ledger/cancels.py) and needs the token. Bound to anything but loopback, every request needs
the token (a query `token=` or `Authorization: Bearer`); on loopback the page reads without it, but
its cancel buttons exist only when opened with it (the URL printed at start).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import secrets
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, ledger_path, open_reader, usage_error

EXAMPLE = """examples:
  actor-run dashboard                          # http://127.0.0.1:8765/ (the URL with its token is printed)
  actor-run dashboard --ledger postgresql://team@db/actor --host 0.0.0.0 --port 9000
"""
PUSH_S = 0.5  # a stream's snapshot is taken this often (sent only when it changed)


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("dashboard", help="a live web page of the ledger's runs, jobs and machines; /metrics",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; anything "
                   "else needs the token for every request)")
    p.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0: any free one)")
    p.add_argument("--token", help="the token that allows cancels (and any request off loopback); "
                   "default: a new random one, printed")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_app(ledger: Any, *, token: str, open_reads: bool, cancel: Any) -> Any:
    """The ASGI app. `open_reads`: reads need no token (a loopback bind). `cancel(run, job)` asks the
    controllers to cancel (a list of lines said), on a worker thread."""
    import asyncio  # here: `actor-run status` and its kind load the command line without it

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from actor_run.supervisors.views.board import Board, as_json
    from actor_run.supervisors.views.dashboard_page import PAGE
    from actor_run.supervisors.views.metrics import ledger_metrics

    lock = threading.Lock()  # one Board for the one-shot reads; each stream has its own

    def given(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        return auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else request.query_params.get(
            "token", "")

    def has_token(request: Request) -> bool:
        return hmac.compare_digest(given(request).encode(), token.encode())

    def refused(request: Request) -> Response | None:
        if open_reads or has_token(request):
            return None
        return JSONResponse({"error": "this dashboard needs its token"}, status_code=403)

    shared = Board(ledger)

    async def page(request: Request) -> Response:
        return refused(request) or HTMLResponse(PAGE, headers={
            "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"})

    async def events(request: Request) -> Response:
        if (no := refused(request)) is not None:
            return no
        board, run = Board(ledger), request.query_params.get("run") or None
        can_cancel = has_token(request)

        async def stream() -> AsyncIterator[bytes]:
            last = b""
            while not await request.is_disconnected():
                snap = await asyncio.to_thread(board.snapshot, run)
                snap["can_cancel"] = can_cancel
                snap["ledger"] = str(ledger) if "://" not in str(ledger) else "postgresql"
                body = as_json(snap)
                if body != last:
                    last = body
                    yield b"data: " + body + b"\n\n"
                await asyncio.sleep(PUSH_S)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def snapshot(request: Request) -> Response:
        if (no := refused(request)) is not None:
            return no

        def read() -> dict[str, Any]:
            with lock:
                return shared.snapshot(request.query_params.get("run") or None)

        return Response(as_json(await asyncio.to_thread(read)), media_type="application/json")

    async def job(request: Request) -> Response:
        if (no := refused(request)) is not None:
            return no
        found = await asyncio.to_thread(shared.job, request.query_params.get("run", ""),
                                        request.query_params.get("key", ""))
        if found is None:
            return JSONResponse({"error": "no such job"}, status_code=404)
        return Response(as_json(found), media_type="application/json")

    async def do_cancel(request: Request) -> Response:
        if not has_token(request):
            return JSONResponse({"error": "cancelling needs the dashboard's token"}, status_code=403)
        try:
            body = await request.json()
            run, key = str(body["run"]), body.get("job")
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "expected {\"run\": RUN, \"job\": KEY?}"}, status_code=400)
        try:
            lines = await asyncio.to_thread(cancel, run, None if key is None else str(key))
        except LookupError as exc:
            return JSONResponse({"error": f"no run or job {exc} in the ledger"}, status_code=404)
        return JSONResponse({"said": lines})

    async def metrics(request: Request) -> Response:
        if (no := refused(request)) is not None:
            return no
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(await asyncio.to_thread(ledger_metrics, ledger), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/", page), Route("/events", events), Route("/api/snapshot", snapshot), Route("/api/job", job),
        Route("/api/cancel", do_cancel, methods=["POST"]), Route("/metrics", metrics),
    ])


def cmd_dashboard(args: argparse.Namespace) -> int:
    import asyncio

    try:
        import uvicorn
    except ImportError:
        return usage_error("dashboard: needs the dashboard extra: pip install 'actor-run[dashboard]'")
    if not 0 <= args.port <= 65535:
        return usage_error(f"dashboard: --port: expected 0-65535, got {args.port}")
    token = args.token or secrets.token_urlsafe(24)
    if args.token is not None and len(args.token) < 16:
        return usage_error("dashboard: --token: expected at least 16 characters")
    reader = open_reader(args)  # a path that is not a ledger is exit 2 here, before anything listens
    reader.close()
    location = ledger_path(args)

    def cancel(run: str, key: str | None) -> list[str]:
        from actor_run.supervisors.cli.cancel import cancel_target

        return cancel_target(args, run if key is None else key, run=run)

    app = make_app(location, token=token, open_reads=loopback(args.host), cancel=cancel)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            lifespan="off")
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn has a flag, no event)
            await asyncio.sleep(0.05)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            host = f"[{args.host}]" if ":" in args.host else args.host
            print(f"dashboard: http://{host}:{port}/?token={token}", flush=True)
            print("(the token allows cancels; without it the page only reads"
                  + ("" if loopback(args.host) else ", and off loopback nothing is served without it") + ")",
                  flush=True)
        await task

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.stderr.write("actor-run: dashboard stopped\n")
        return Exit.INTERRUPTED
    return Exit.OK if server.started else Exit.FAILED


__all__ = ["add_parser", "cmd_dashboard", "make_app"]
