"""The shared HTTP client of rented clouds and the GPU table (httpx.MockTransport: one adapter's unit)."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest
import trio

from actor_run.protocols.clouds.gpus import our_name, vendor_ids
from actor_run.protocols.clouds.http import MAX_RETRY_AFTER_S, NoAnswer, ProviderAPI, RateLimited, retry_after_s


def answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://x/"))


def test_retry_after_is_read_as_seconds_or_a_date_and_bounded() -> None:
    assert retry_after_s(answer(429, **{"Retry-After": "3"}), 1.0) == 3.0
    assert retry_after_s(answer(429), 1.5) == 1.5
    assert retry_after_s(answer(429, **{"Retry-After": "86400"}), 1.0) == MAX_RETRY_AFTER_S
    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 <= retry_after_s(answer(429, **{"Retry-After": soon}), 1.0) <= 5.0


def test_a_429_repeats_the_same_call_and_gives_up_when_bounded() -> None:
    seen: list[tuple[str, bytes, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.content, request.headers["authorization"]))
        return httpx.Response(429 if len(seen) < 3 else 201, headers={"Retry-After": "0"})

    async def main() -> None:
        api = ProviderAPI("x", "http://x", {"Authorization": "Bearer k"}, transport=httpx.MockTransport(handler))
        resp = await api.call("POST", "/v2/pods", json={"name": "a"})
        assert resp.status_code == 201
        assert api.statistics().rate_limited == 2
        assert len(set(seen)) == 1  # the same call each time
        always = ProviderAPI("x", "http://x", {}, max_rate_limited=2,
                             transport=httpx.MockTransport(lambda r: httpx.Response(429, headers={"Retry-After": "0"})))
        with pytest.raises(RateLimited):
            await always.call("GET", "/v2/pods")
        assert always.statistics().calls == 3
        await api.aclose()
        await always.aclose()

    trio.run(main)


def test_no_answer_in_time_is_no_answer_and_the_key_is_not_in_it() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async def main() -> None:
        api = ProviderAPI("x", "http://x", {"Authorization": "Bearer sekrit"}, transport=httpx.MockTransport(handler))
        with pytest.raises(NoAnswer) as info:
            await api.call("GET", "/v2/pods")
        assert "sekrit" not in str(info.value)
        await api.aclose()

    trio.run(main)


def test_our_gpu_names_map_to_each_vendor() -> None:
    assert vendor_ids("h100", "runpod")[0] == "NVIDIA H100 80GB HBM3"
    assert vendor_ids("A100-80G", "hyperstack") == ("A100-80G-PCIe", "A100-80G-PCIe-NVLink")
    assert vendor_ids("gpu_1x_gh200", "lambda") == ("gpu_1x_gh200",)  # unknown: the vendor's own id
    assert our_name("gpu_1x_h100_pcie", "lambda") == "H100"
    assert our_name("NVIDIA Z9", "runpod") == "NVIDIA Z9"
