"""A loopback fake of a provider's HTTP API, held to the vendor's own OpenAPI document.

    fake = OpenAPIFake(OPENAPI / "runpod-rest-v2.json", base_path="")
    @fake.route("GET", "/v2/pods/{id}")
    def get_pod(req: Request, id: str) -> Response: ...
    fake.start()          # a real HTTP server on 127.0.0.1 in a thread; fake.url is its base
    ...
    fake.stop()
    assert fake.violations == []   # what the real API would have refused, or a reply it never gives

Every request is checked against the document before a handler sees it (a request the real API
would reject is answered 400 and recorded in `violations`), and every response the handler makes
is checked too (a fake that drifts from the real API is recorded as well). The pytest fixtures
that start fakes assert `violations` is empty, so a violation fails the test.

`calls` logs each request (method, path template, status); `rate_limit(n, retry_after)` answers
the next n requests 429 with a Retry-After header (the vendor's own response shape is up to the
subclass via `too_many`); `transient_errors(fraction, seed)` answers that fraction of the requests
(drawn from a seeded generator) with a 500, half of them doing nothing and half doing the work
first (as a vendor whose gateway fails after its backend acted), `faults` logging each
(method, template, "before" | "after").
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from openapi_core import Config, OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

OPENAPI = Path(__file__).resolve().parent / "openapi"  # the vendors' documents, copied in
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request drowns what a test prints
Handler = Callable[..., Response]


@functools.cache
def _document(path: Path) -> dict[str, Any]:
    text = path.read_text()
    # libyaml's loader where PyYAML has it (Hyperstack's 650 KB document: 0.5 s against 3 s), the same result
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc: dict[str, Any] = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=loader)
    return doc


def document(path: Path) -> dict[str, Any]:
    """A vendor's document, as read (shared: never change it)."""
    return _document(path)


@functools.cache
def _openapi(path: Path, base_path: str, relax: Callable[[dict[str, Any]], None] | None = None) -> OpenAPI:
    """The vendor's document as is, with our loopback address added to its servers (nothing else);
    loaded once per process. The document itself is not checked here (a big one takes seconds, in
    every test process): test_rented.py checks each once. `relax` (a module-level function, so the
    cache keys on it) edits the copy where the vendor's own client and docs contradict the document
    (each edit cites its contract line: fakes/vastai.py)."""
    doc = copy.deepcopy(_document(path))
    if relax is not None:
        relax(doc)
    loopback = {"url": "http://127.0.0.1:{port}" + base_path, "variables": {"port": {"default": "80"}}}
    doc["servers"] = [loopback, *doc.get("servers", [])]
    # RFC 9457 problem documents are JSON too (openapi-core knows only application/json by name)
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads}, spec_validator_cls=None)
    return OpenAPI.from_dict(doc, config=config)


class _Handler(WSGIRequestHandler):
    """Werkzeug drops headers whose names hold an underscore; a vendor may use one (Hyperstack's
    `api_key`), so they are kept here, as the vendor's own servers keep them."""

    def make_environ(self) -> Any:
        environ = super().make_environ()
        for key, value in self.headers.items():
            if "_" in key:
                environ.setdefault("HTTP_" + key.upper().replace("-", "_"), value)
        return environ


def json_response(body: Any, status: int = 200, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, content_type=content_type, headers=headers)


class OpenAPIFake:
    """A provider's API on loopback; subclasses add routes and state (see the module docstring)."""

    def __init__(self, document: Path, *, base_path: str = "", token: str = "test-key",
                 relax: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.document = document
        self.relax = relax
        self.base_path = base_path.rstrip("/")
        self.token = token
        self.lock = threading.RLock()  # the state of the fake; handlers run on the server's threads
        self.routes: list[tuple[str, re.Pattern[str], str, Handler]] = []
        self.calls: list[tuple[str, str, int]] = []
        self.violations: list[str] = []
        self._limited: list[float] = []  # Retry-After values of the next 429s to send
        self.rate_limited_sent = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.changed = threading.Condition(self.lock)  # notified after every request
        # statuses the vendor sends that its document does not describe, each with the contract
        # line that says so: their bodies are not checked (requests still are)
        self.undocumented: dict[int, str] = {}
        self._transient: tuple[float, random.Random] | None = None
        self.faults: list[tuple[str, str, str]] = []

    # --- routes -----------------------------------------------------------------------------------

    def route(self, method: str, template: str) -> Callable[[Handler], Handler]:
        pattern = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.base_path + template) + "$")

        def add(fn: Handler) -> Handler:
            self.routes.append((method.upper(), pattern, template, fn))
            return fn

        return add

    # --- what subclasses shape in the vendor's words ----------------------------------------------

    def authorized(self, req: Request) -> bool:
        return req.headers.get("Authorization", "") == f"Bearer {self.token}"

    def unauthorized(self) -> Response:
        return json_response({"error": "unauthorized"}, 401)

    def too_many(self, retry_after: float) -> Response:
        return json_response({"error": "rate limited"}, 429, headers={"Retry-After": f"{retry_after:g}"})

    def not_found(self) -> Response:
        return json_response({"error": "not found"}, 404)

    def invalid(self, problem: str) -> Response:
        return json_response({"error": problem}, 400)

    # --- faults -----------------------------------------------------------------------------------

    def rate_limit(self, times: int, retry_after: float = 1.0) -> None:
        with self.lock:
            self._limited.extend([retry_after] * times)

    def transient_errors(self, fraction: float, seed: int = 0) -> None:
        """Answer `fraction` of the requests from now on with a transient 500 (see the module docstring)."""
        with self.lock:
            self._transient = (fraction, random.Random(seed))
            # every vendor's gateway sends a 5xx now and then, documented or not
            self.undocumented.setdefault(500, "a transient server error (any HTTP API; injected by the test)")

    def server_error(self) -> Response:
        return json_response({"error": "internal server error"}, 500)

    # --- the server -------------------------------------------------------------------------------

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        req = Request(environ)
        resp, template = self._answer(req)
        with self.lock:
            self.calls.append((req.method, template, resp.status_code))
            self.changed.notify_all()
        return resp(environ, start_response)

    def _answer(self, req: Request) -> tuple[Response, str]:
        spec = _openapi(self.document, self.base_path, self.relax)
        for method, pattern, template, fn in self.routes:
            m = pattern.match(req.path)
            if m is None or method != req.method:
                continue
            try:
                spec.validate_request(WerkzeugOpenAPIRequest(req))
            except Exception as exc:
                self._violation(f"request {req.method} {req.path}: {_reason(exc)}")
                return self.invalid(f"rejected by the vendor's schema: {_reason(exc)}"), template
            with self.lock:
                if self._limited:
                    resp = self.too_many(self._limited.pop(0))
                    self.rate_limited_sent += 1
                elif not self.authorized(req) and not self.authorized_other(req, template, m.groupdict()):
                    resp = self.unauthorized()
                elif self._transient is not None and self._transient[1].random() < self._transient[0]:
                    when = self._transient[1].choice(("before", "after"))
                    if when == "after":
                        fn(req, **m.groupdict())  # the work is done, the answer lost
                    self.faults.append((req.method, template, when))
                    resp = self.server_error()
                else:
                    resp = fn(req, **m.groupdict())
            if resp.status_code in self.undocumented:
                return resp, template
            try:
                spec.validate_response(WerkzeugOpenAPIRequest(req), WerkzeugOpenAPIResponse(resp))
            except Exception as exc:
                self._violation(f"response {resp.status_code} to {req.method} {req.path}: {_reason(exc)}")
            return resp, template
        self._violation(f"{req.method} {req.path}: no such route in the fake")
        return self.not_found(), req.path

    def authorized_other(self, req: Request, template: str, params: dict[str, str]) -> bool:
        """Another credential the vendor accepts for this call (a pod-scoped key)."""
        return False

    def _violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)

    def start(self) -> OpenAPIFake:
        _openapi(self.document, self.base_path, self.relax)  # read before the first request, not inside it
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True, request_handler=_Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}{self.base_path}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def wait_for(self, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Until `check()` (called under the lock) is truthy; its value, or AssertionError after timeout."""
        with self.lock:
            value = self.changed.wait_for(check, timeout=timeout)
        if not value:
            raise AssertionError(f"the fake did not reach {check} within {timeout} s")
        return value

    def count(self, method: str, template: str, status: int | None = None) -> int:
        with self.lock:
            return sum(1 for m, t, s in self.calls if m == method and t == template and (status is None or s == status))


def _reason(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    cause = exc.__cause__ or exc.__context__
    for _ in range(3):
        if cause is None:
            break
        extra = getattr(cause, "schema_errors", None)
        parts.append(f"{type(cause).__name__}: {cause}" + (f" {[str(e)[:300] for e in extra]}" if extra else ""))
        cause = cause.__cause__ or cause.__context__
    return " <- ".join(parts)[:4000]
