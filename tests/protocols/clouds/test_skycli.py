"""What the skypilot cloud reads from `sky`'s output: request ids, JSON lists, prices."""

from __future__ import annotations

import pytest

from actor_run.protocols.clouds.skycli import SkyFailed, _clusters, _decode, _requests, cheapest, submitted
from actor_run.protocols.clouds.skypilot import classify
from actor_run.protocols.failures import Code

LAUNCHED = (  # the contract's `sky launch --async` output, coloured as in a terminal
    "Command to run: echo hi\nRunning on cluster: lease-t1\n"
    "\x1b[32mSubmitted sky.launch request: 34cef3f6-d959-41e1-981c-35abd944d134\x1b[0m\n"
    "├── Check logs with: sky api logs 34cef3f6\n└── To cancel the request, run: sky api cancel 34cef3f6\n"
)


def test_a_submitted_request_id_is_read_through_colour_codes() -> None:
    assert submitted(LAUNCHED) == "34cef3f6-d959-41e1-981c-35abd944d134"
    assert submitted("Cluster(s) not found: lease-t1.\n") is None


def test_json_lists_are_read_past_a_warning_line() -> None:
    out = '[WARNING] the flag is ignored\n[{"request_id": "34cef3f6", "name": "sky.launch", "status": "FAILED"}]\n'
    [r] = _decode(out, _requests, "sky api status")
    assert (r.verb, r.status, r.cluster_name) == ("launch", "FAILED", None)
    assert _decode("[]\n", _clusters, "sky status") == []
    with pytest.raises(SkyFailed, match="sky status: no JSON list"):
        _decode("Traceback (most recent call last): ...", _clusters, "sky status")


def test_the_cheapest_price_is_read_from_a_show_gpus_table() -> None:
    table = (
        "GPU   QTY  CLOUD  INSTANCE_TYPE   DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION\n"
        "A10G  1    AWS    g5.2xlarge      24GB        8      32GB      $ 1.212       $ 0.485            us-east-1\n"
        "A10G  1    AWS    g5.xlarge       24GB        4      16GB      $ 1.006       $ 0.402            us-east-1\n"
    )
    assert cheapest(table, spot=False) == 1.006
    assert cheapest(table, spot=True) == 0.402
    assert cheapest("Resources 'X' not found in AWS.", spot=False) is None


def test_a_failed_launch_is_classified_by_the_exception_it_printed() -> None:
    unavailable = "sky.exceptions.ResourcesUnavailableError: Failed to provision all possible launchable resources."
    assert classify(unavailable) == Code.NO_CAPACITY
    assert classify("botocore: An error occurred (InsufficientInstanceCapacity) ...") == Code.NO_CAPACITY
    quota = unavailable + " Failed to provision on cloud AWS due to VcpuLimitExceeded: You have requested more vCPU"
    assert classify(quota) == Code.QUOTA  # wrapped by SkyPilot, still the account's quota
    assert classify("RuntimeError: Failed to set up the cluster: the setup command exited 1") == Code.LAUNCH_FAILED
