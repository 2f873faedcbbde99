"""RunPod's two HTTP services as the `runpod-serverless` cloud speaks them, over the shared client
(clouds/http.py: pooled, bounded in time, 429 waited out as asked): REST v2 (`/v2/serverless`,
`/v2/catalog`) and the serverless queue API (`/v2/{endpoint}/run`, `/status`, `/stream`,
`/cancel`, `/health`; runpod.md §11), each its own base URL.

An answer comes back as an `Answer` for the caller to classify, except 401/403, which raise
`Refused(guard)` (stop, never retry); no answer, or 429s past what one call waits out, raise
`Unreachable` (chained from the client's `NoAnswer`/`NotSent`/`RateLimited`, which the create
reads to tell "maybe made" from "never sent"). The key goes only into the `Authorization` header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from actor_run.protocols.clouds.http import (
    APIStatistics,
    NoAnswer,
    ProviderAPI,
    RateLimited,
    body_json,
    is_auth_refusal,
    short,
)
from actor_run.protocols.failures import Code, Refused, Unreachable

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx


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

    def __init__(self, *, rest_url: str, queue_url: str, key: str,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        self._rest = ProviderAPI("runpod", rest_url, headers, transport=transport)
        self._queue = ProviderAPI("runpod-queue", queue_url, headers, transport=transport)

    @staticmethod
    async def _call(api: ProviderAPI, method: str, path: str, body: Any, params: dict[str, str] | None) -> Answer:
        try:
            resp = await api.call(method, path, json=body, params=params)
        except (NoAnswer, RateLimited) as exc:
            raise Unreachable(str(exc)) from exc
        if is_auth_refusal(resp.status_code):
            raise Refused(Code.GUARD, f"runpod: {method} {path}: {short(resp)}")
        decoded = body_json(resp)
        return Answer(resp.status_code, decoded if decoded is not None else resp.text)

    async def rest(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None) -> Answer:
        return await self._call(self._rest, method, path, body, params)

    async def queue(self, method: str, endpoint_id: str, path: str, body: Any = None) -> Answer:
        return await self._call(self._queue, method, f"/v2/{endpoint_id}/{path}", body, None)

    def statistics(self) -> APIStatistics:
        """Both services' calls, 429s and seconds waited, summed."""
        a, b = self._rest.statistics(), self._queue.statistics()
        return APIStatistics(calls=a.calls + b.calls, rate_limited=a.rate_limited + b.rate_limited,
                             waited_s=a.waited_s + b.waited_s)

    async def aclose(self) -> None:
        await self._rest.aclose()
        await self._queue.aclose()
