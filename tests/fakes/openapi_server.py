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
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from openapi_core import Config, OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIResponse
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict
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
def _checker(path: Path, base_path: str, relax: Callable[[dict[str, Any]], None] | None = None) -> _Checker:
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
    return _Checker(OpenAPI.from_dict(doc, config=config), _headers_read(doc))


def _headers_read(doc: dict[str, Any]) -> tuple[str, ...]:
    """Every request header openapi-core can read under `doc`: each header parameter's and each API
    key's name (both are `{"in": "header", "name": ...}` wherever they stand, $ref'd or inline),
    Authorization (HTTP schemes) and Cookie (cookie parameters and keys); lower-cased, sorted."""
    names = {"authorization", "cookie"}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("in") == "header" and isinstance(node.get("name"), str):
                names.add(node["name"].lower())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return tuple(sorted(names))


_MISS = object()
Key = tuple[Any, ...]


class _Verdicts:
    """What the document said of each request or response seen, by its key: None (it holds) or why
    not. The least recently used go past `entries` keys or `size` bytes of bodies. Any thread."""

    def __init__(self, entries: int = 4096, size: int = 64 << 20) -> None:
        self.entries, self.size = entries, size
        self._lock = threading.Lock()
        self._seen: OrderedDict[Key, tuple[str | None, int]] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def get(self, key: Key) -> Any:
        """The verdict for `key`, or `_MISS`."""
        with self._lock:
            found = self._seen.get(key)
            if found is None:
                self.misses += 1
                return _MISS
            self._seen.move_to_end(key)
            self.hits += 1
            return found[0]

    def put(self, key: Key, verdict: str | None, size: int) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = (verdict, size)
            self._bytes += size
            while len(self._seen) > self.entries or self._bytes > self.size:
                _, (_, gone) = self._seen.popitem(last=False)
                self._bytes -= gone


class _SeenRequest:
    """A request as openapi-core reads it (its `Request` protocol), made of its memo key's parts (and
    of werkzeug's parse of them)."""

    def __init__(self, key: Key, req: Request) -> None:
        method, _host, self.path, _query, headers, self.content_type, body = key
        self.host_url = req.host_url  # the key's but for the fake's own port (_Checker.request_key)
        self.method = method.lower()
        self.body = body
        # req.args and req.cookies are werkzeug's parse of the key's query string and Cookie header
        self.parameters = RequestParameters(query=ImmutableMultiDict(req.args),
                                            header=Headers([(n, v) for n, values in headers for v in values]),
                                            cookie=req.cookies)


class _SeenResponse:
    """A response as openapi-core reads it (its `Response` protocol), made of its memo key's parts alone."""

    def __init__(self, key: Key) -> None:
        _request, self.status_code, self.content_type, headers, self.data = key
        self.headers = Headers(list(headers))


class _Checker:
    """One vendor's document (`spec`), the request headers it can read and its verdicts so far."""

    def __init__(self, spec: OpenAPI, headers: tuple[str, ...]) -> None:
        self.spec = spec
        self.headers = headers
        self.verdicts = _Verdicts()

    def request_key(self, req: Request, port: int) -> Key:
        """Everything openapi-core reads of `req` (werkzeug's adapter: WerkzeugOpenAPIRequest), but
        the fake's own `port` in its URL, a new one each test: the loopback server that `_checker`
        puts first in the document has `{port}` free (no enum), so any port finds the same server."""
        host = req.host_url
        own = f"//127.0.0.1:{port}/"
        if host.endswith(own):
            host = host[: -len(own)] + "//127.0.0.1:{port}/"
        headers = tuple((name, tuple(req.headers.getlist(name))) for name in self.headers)
        return (req.method, host, req.root_path + req.path, req.query_string, headers,
                req.content_type or "application/octet-stream", req.get_data(as_text=False))

    def check_request(self, req: Request, port: int) -> tuple[Key, str | None]:
        """The request's key and verdict (None: the document allows it), checked at its first sight."""
        key = self.request_key(req, port)
        verdict = self.verdicts.get(key)
        if verdict is _MISS:
            try:
                # the validator itself: OpenAPI.validate_request adds only type guards (runtime
                # Protocol checks, a good share of a check's time) that _SeenRequest passes
                self.spec.request_validator.validate(_SeenRequest(key, req))
                verdict = None
            except Exception as exc:
                verdict = _reason(exc)
            self.verdicts.put(key, verdict, len(key[-1]))
        return key, verdict

    def check_response(self, request_key: Key, req: Request, resp: Response) -> str | None:
        """The response's verdict (None: the document allows it as the answer to the request)."""
        data = WerkzeugOpenAPIResponse(resp).data  # a streamed body is read into a copy, as openapi-core does
        key = ("response", request_key, resp.status_code, str(resp.mimetype), tuple(resp.headers.items()), data)
        verdict = self.verdicts.get(key)
        if verdict is _MISS:
            try:
                self.spec.response_validator.validate(_SeenRequest(request_key, req), _SeenResponse(key[1:]))
                verdict = None
            except Exception as exc:
                verdict = _reason(exc)
            self.verdicts.put(key, verdict, len(data) + len(request_key[-1]))
        return verdict


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
        self.port = 0  # the server's, once started
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
        checker = _checker(self.document, self.base_path, self.relax)
        for method, pattern, template, fn in self.routes:
            m = pattern.match(req.path)
            if m is None or method != req.method:
                continue
            request_key, problem = checker.check_request(req, self.port)
            if problem is not None:
                self._violation(f"request {req.method} {req.path}: {problem}")
                return self.invalid(f"rejected by the vendor's schema: {problem}"), template
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
            problem = checker.check_response(request_key, req, resp)
            if problem is not None:
                self._violation(f"response {resp.status_code} to {req.method} {req.path}: {problem}")
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
        _checker(self.document, self.base_path, self.relax)  # read before the first request, not inside it
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True, request_handler=_Handler)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}{self.base_path}"
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

