"""The fakes' checks against the vendor's document are memoized (fakes/openapi_server.py): as strict
as a fresh check each time. RunPod's own document and its own examples, over real HTTP on loopback."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from werkzeug.wrappers import Request, Response

from fakes.openapi_server import _MISS, OPENAPI, OpenAPIFake, _checker, _Verdicts, document, json_response

DOC = OPENAPI / "runpod-rest-v2.json"


def _example(path: str, method: str, status: str | None, name: str) -> Any:
    """An example the document itself gives, of a request body (status None) or of a response."""
    op = document(DOC)["paths"][path][method]
    where = op["requestBody"] if status is None else op["responses"][status]
    return copy.deepcopy(where["content"]["application/json"]["examples"][name]["value"])


POD_BODY = _example("/v2/pods", "post", None, "gpuPod")


class Answers:
    """What the fake's GET /v2/pods answers: the document's example, or `pods` when set."""

    pods: Any = None


@pytest.fixture
def fake() -> Iterator[tuple[OpenAPIFake, Answers]]:
    answers = Answers()
    f = OpenAPIFake(DOC, token="k")

    @f.route("GET", "/v2/pods")
    def pods(req: Request) -> Response:
        return json_response(answers.pods if answers.pods is not None else _example("/v2/pods", "get", "200", "pods"))

    @f.route("POST", "/v2/pods")
    def create(req: Request) -> Response:
        return json_response(_example("/v2/pods", "post", "201", "pod"), 201)

    f.start()
    try:
        yield f, answers
    finally:
        f.stop()


@pytest.fixture
def client(fake: tuple[OpenAPIFake, Answers]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake[0].url, headers={"Authorization": "Bearer k"}, timeout=30) as c:
        yield c


def test_a_bad_response_is_reported_each_time_it_is_sent(fake: tuple[OpenAPIFake, Answers],
                                                         client: httpx.Client) -> None:
    f, answers = fake
    answers.pods = {"pods": "none"}  # the document: an array of Pod
    for _ in range(2):
        assert client.get("/v2/pods").status_code == 200
    assert len(f.violations) == 2
    assert all(v.startswith("response 200 to GET /v2/pods: ") and "pods" in v for v in f.violations)
    assert f.violations[0] == f.violations[1]


def test_a_bad_request_is_refused_and_reported_each_time_it_is_sent(fake: tuple[OpenAPIFake, Answers],
                                                                    client: httpx.Client) -> None:
    f, _ = fake
    bad = {**POD_BODY, "name": ""}  # minLength 1
    answers = [client.post("/v2/pods", json=bad) for _ in range(2)]
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].json() == answers[1].json()
    assert len(f.violations) == 2
    assert all(v.startswith("request POST /v2/pods: InvalidRequestBody") for v in f.violations)
    assert f.count("POST", "/v2/pods", 201) == 0


# one request the document allows and one it refuses, apart only in a header (the bearer scheme),
# the query (a boolean) or the body (a name of minLength 1)
GOOD_BAD = {
    "header": ({"method": "GET", "url": "/v2/pods", "headers": {"Authorization": "Bearer k"}},
               {"method": "GET", "url": "/v2/pods", "headers": {"Authorization": "Basic k"}}),
    "query": ({"method": "GET", "url": "/v2/pods", "params": {"includeClusterPods": "true"}},
              {"method": "GET", "url": "/v2/pods", "params": {"includeClusterPods": "maybe"}}),
    "body": ({"method": "POST", "url": "/v2/pods", "json": POD_BODY},
             {"method": "POST", "url": "/v2/pods", "json": {**POD_BODY, "name": ""}}),
}


@pytest.mark.parametrize("part", sorted(GOOD_BAD))
@pytest.mark.parametrize("bad_first", [False, True])
def test_requests_apart_in_one_checked_part_are_checked_apart(fake: tuple[OpenAPIFake, Answers],
                                                              client: httpx.Client, part: str,
                                                              bad_first: bool) -> None:
    f, _ = fake
    good, bad = GOOD_BAD[part]
    for request in ([bad, good] if bad_first else [good, bad]) * 2:  # the second round is remembered
        status = client.request(**request).status_code
        assert (status == 400) == (request is bad), (part, request, status, f.violations)
    assert len(f.violations) == 2
    assert all(v.startswith(f"request {bad['method']} /v2/pods: ") for v in f.violations)


def test_the_same_request_and_answer_are_checked_once(fake: tuple[OpenAPIFake, Answers],
                                                      client: httpx.Client) -> None:
    f, _ = fake
    verdicts = _checker(DOC, "", None).verdicts
    client.get("/v2/pods", params={"includeClusterPods": "false"})  # seen at most by earlier tests
    hits = verdicts.hits
    for _ in range(5):
        assert client.get("/v2/pods", params={"includeClusterPods": "false"}).status_code == 200
    assert verdicts.hits - hits == 10  # the request and its answer, each time
    assert f.violations == []


def test_verdicts_keep_the_most_recently_used_within_their_bounds() -> None:
    v = _Verdicts(entries=2, size=10)
    v.put(("a",), None, 1)
    v.put(("b",), "bad", 1)
    assert v.get(("a",)) is None  # a is now the most recent
    v.put(("c",), None, 1)  # past 2 entries: b goes
    assert v.get(("b",)) is _MISS
    assert v.get(("a",)) is None
    assert v.get(("c",)) is None
    v.put(("big",), "bad", 9)  # past 10 bytes with both a and c: the older (a) goes
    assert [v.get(("a",)), v.get(("c",)), v.get(("big",))] == [_MISS, None, "bad"]
