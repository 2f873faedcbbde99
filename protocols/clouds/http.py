"""What every rented cloud's API client shares: one pooled httpx client per provider and account,
a timeout on every call, 429 waited out and repeated (bounded), and the answer's status sorted
into what it proves.

    api = ProviderAPI("runpod", "https://api.runpod.io", {"Authorization": "Bearer ..."})
    resp = await api.call("GET", "/v2/pods")         # a 429 waited out (Retry-After), then repeated
    api.statistics()                                  # calls, 429s honoured, seconds waited

A call that gets no answer in time raises `NoAnswer` (the request may have reached the provider);
one whose connection could not even be opened raises `NotSent` (it did not). The headers (the key)
never reach an exception, a log line or `statistics()`.

httpx is imported by the first call (about 0.2 s of CPU, rich with it): a process that builds a
rented cloud to read its settings, check a key or list nothing (`offers`, `clouds check`, a sweep
of clouds without a key) never loads it.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actor_run.protocols.failures import ActorRunError
from actor_run.protocols.logs import logger
from actor_run.protocols.redact import MIN_LENGTH, REDACTED, add_secret, redact

if TYPE_CHECKING:
    import httpx

MAX_RATE_LIMITED = 8  # 429s in a row one call waits out before it gives up
MAX_RETRY_AFTER_S = 60.0  # the longest single wait a Retry-After may ask for
DEFAULT_RETRY_AFTER_S = 1.0  # a 429 without Retry-After: wait this, doubling


class NoAnswer(ActorRunError):
    """The provider did not answer in time, or the connection broke mid-call: it may have acted."""


class NotSent(NoAnswer):
    """The request never left (no connection): the provider cannot have acted on it."""


class RateLimited(ActorRunError):
    """The provider answered 429 more often in a row than one call waits out."""


class APIStatistics(msgspec.Struct, frozen=True, kw_only=True):
    calls: int  # requests sent, each repeat of a 429'd call counted
    rate_limited: int  # 429s received (each was waited out before the repeat)
    waited_s: float  # seconds spent waiting on Retry-After


def retry_after_s(resp: httpx.Response, fallback: float) -> float:
    """Seconds a 429 (or 503) asks us to wait: `Retry-After` as seconds or an HTTP date, bounded."""
    value = resp.headers.get("retry-after", "").strip()
    wait = fallback
    if value:
        try:
            wait = float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value) if value else None
            if when is not None:
                wait = when.timestamp() - time.time()
    return min(max(wait, 0.0), MAX_RETRY_AFTER_S)


def is_auth_refusal(status: int) -> bool:
    """401/403: the key is wrong or lacks the right: `guard` (stop, never retry)."""
    return status in (401, 403)


def is_server_error(status: int) -> bool:
    """5xx: the provider failed; whether it acted is unknown (on a create: `ambiguous_create`)."""
    return 500 <= status <= 599


def body_json(resp: httpx.Response) -> Any:
    """The answer's JSON, or None when it has none or it is not JSON."""
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        return None


def short(resp: httpx.Response, limit: int = 300) -> str:
    """The status and the start of the body, for a failure's detail. A body may echo the request's
    headers (the key): every value of them, and every secret this process knows, is masked first."""
    text = resp.text.strip().replace("\n", " ")
    with contextlib.suppress(RuntimeError):  # a response made without a request (a unit test's)
        for value in resp.request.headers.values():
            for part in (value, *value.split()):
                if len(part) >= MIN_LENGTH:
                    text = text.replace(part, REDACTED)
    return f"HTTP {resp.status_code}: {redact(text)[:limit]}"


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client of this process: making one loads the CA bundle (about
    20 ms of CPU), and a client is made per account and per event loop."""
    import httpx

    return httpx.create_ssl_context()


class ProviderAPI:
    """One provider account's API: a pooled keep-alive client, every call bounded in time."""

    def __init__(
        self, provider: str, base_url: str, headers: dict[str, str], *, timeout_s: float = 30.0,
        max_rate_limited: int = MAX_RATE_LIMITED, transport: httpx.AsyncBaseTransport | None = None,
        pace: Callable[[str, str], float] | None = None,
    ) -> None:
        """`pace(method, path)`: the first wait after a 429 that names none (no Retry-After), for a
        vendor that documents a minimum interval per endpoint (Vast); DEFAULT_RETRY_AFTER_S else."""
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_rate_limited = max_rate_limited
        self._headers = headers
        add_secret(*headers.values())  # a key echoed back in any text is masked (protocols/redact.py)
        self._transport = transport
        self._pace = pace
        self._client: httpx.AsyncClient | None = None
        self._calls = 0
        self._rate_limited = 0
        self._waited_s = 0.0
        self._log = logger.bind(cloud=provider)

    def _open(self) -> httpx.AsyncClient:
        # made at the first call, on the reactor: httpx binds its pool to the running event loop
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
                follow_redirects=True, transport=self._transport, verify=_tls(),
                event_hooks={"request": [self._strip_elsewhere]},
            )
        return self._client

    async def _strip_elsewhere(self, request: httpx.Request) -> None:
        """Each request of a call, its redirects' too (httpx calls request hooks for every hop): one
        going to another origin than the provider's (scheme, host, port) carries none of this
        client's headers. httpx drops `Authorization` there itself, but not a vendor's own header
        (Hyperstack's `api_key`): a redirect to another host would have been handed the key."""
        import httpx

        base, url = httpx.URL(self.base_url), request.url
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
            for name in self._headers:
                request.headers.pop(name, None)

    async def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
                   ) -> httpx.Response:
        """Send one request; a 429 is waited out (Retry-After) and the same request sent again."""
        import httpx

        client = self._open()
        fallback = self._pace(method, path) if self._pace is not None else DEFAULT_RETRY_AFTER_S
        for _ in range(self.max_rate_limited + 1):
            self._calls += 1
            try:
                # trio's own bound as well as httpx's: a server that trickles bytes cannot hold us
                with trio.fail_after(self.timeout_s * 2):
                    resp = await client.request(method, path, json=json, params=params)
            except httpx.ConnectError as exc:
                raise NotSent(f"{self.provider}: {method} {path}: cannot connect: {exc}") from exc
            except (httpx.TransportError, trio.TooSlowError) as exc:
                raise NoAnswer(f"{self.provider}: {method} {path}: no answer: {type(exc).__name__}") from exc
            if resp.status_code != 429:
                return resp
            wait = retry_after_s(resp, fallback)
            fallback = min(fallback * 2, MAX_RETRY_AFTER_S)
            self._rate_limited += 1
            self._waited_s += wait
            self._log.info("{}: {} {} rate-limited; waiting {:.1f} s as asked", self.provider, method, path, wait)
            await trio.sleep(wait)
        raise RateLimited(f"{self.provider}: {method} {path}: still rate-limited after "
                          f"{self.max_rate_limited} waits")

    def statistics(self) -> APIStatistics:
        return APIStatistics(calls=self._calls, rate_limited=self._rate_limited, waited_s=self._waited_s)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with trio.CancelScope(shield=True):
                await client.aclose()
