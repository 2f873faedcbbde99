"""RunPod's two HTTP services as this cloud speaks them: REST v2 (`/v2/serverless`, `/v2/catalog`)
and the serverless queue API (`/v2/{endpoint}/run`, `/status`, `/stream`, `/cancel`, `/health`).

One pooled httpx client for both. A 429 waits its `Retry-After` (bounded) and repeats the same
call; 401/403 raise `Refused(guard)`; anything else comes back as an `Answer` for the caller to
classify, except a transport error, which raises `Unreachable`. The API key goes only into the
`Authorization` header, never into a message or a log line.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import msgspec
import trio

from actor_run.protocols.failures import Code, Refused, Unreachable

MAX_429_WAITS = 6
MAX_RETRY_AFTER_S = 60.0


class Answer(msgspec.Struct, frozen=True):
    status: int
    body: Any  # decoded JSON, or the text when it was not JSON

    def detail(self) -> str:
        """The error text of a problem+json (`detail`, `title`), a v1 envelope (`error`, `message`) or the text."""
        b = self.body
        if isinstance(b, dict):
            for key in ("detail", "error", "message", "title"):
                if isinstance(b.get(key), str) and b[key]:
                    return str(b[key])
        return str(b)[:300]


class RunPodApi:
    """`await api.rest("POST", "/v2/serverless", body)`, `await api.queue("GET", endpoint, "health")`."""

    def __init__(self, *, rest_url: str, queue_url: str, api_key_env: str, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.rest_url, self.queue_url = rest_url.rstrip("/"), queue_url.rstrip("/")
        self.api_key_env = api_key_env
        self._client: httpx.AsyncClient | None = None
        self._timeout, self._transport = timeout_s, transport
        self.calls = 0  # HTTP requests sent (bench/providers.py reads it)
        self.waited_429 = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            key = os.environ.get(self.api_key_env, "")
            if not key:
                raise Refused(Code.GUARD, f"runpod-serverless: set the API key in ${self.api_key_env}")
            self._client = httpx.AsyncClient(
                headers={"Authorization": f"Bearer {key}"}, timeout=self._timeout, transport=self._transport,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))
        return self._client

    async def call(self, method: str, url: str, body: Any = None, params: dict[str, str] | None = None) -> Answer:
        client = self._http()
        for _ in range(MAX_429_WAITS + 1):
            self.calls += 1
            try:
                r = await client.request(method, url, json=body, params=params)
            except httpx.HTTPError as exc:
                raise Unreachable(f"runpod: {method} {url.split('?')[0]}: {type(exc).__name__}: {exc}") from exc
            if r.status_code == 429:
                self.waited_429 += 1
                try:
                    wait = float(r.headers.get("Retry-After", "1"))
                except ValueError:
                    wait = 1.0
                await trio.sleep(min(max(wait, 0.0), MAX_RETRY_AFTER_S))
                continue
            try:
                decoded: Any = r.json() if r.content else None
            except ValueError:
                decoded = r.text
            answer = Answer(r.status_code, decoded)
            if r.status_code in (401, 403):
                raise Refused(Code.GUARD, f"runpod: {method} {url.split('?')[0]}: {r.status_code} {answer.detail()}")
            return answer
        raise Unreachable(f"runpod: {method} {url}: still 429 after {MAX_429_WAITS} waits")

    async def rest(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None) -> Answer:
        return await self.call(method, self.rest_url + path, body, params)

    async def queue(self, method: str, endpoint_id: str, path: str, body: Any = None) -> Answer:
        return await self.call(method, f"{self.queue_url}/v2/{endpoint_id}/{path}", body)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
