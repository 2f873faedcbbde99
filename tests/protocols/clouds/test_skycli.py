"""What the skypilot cloud reads from `sky`'s output: request ids, JSON lists, prices."""

from __future__ import annotations

import pytest

from actor_run.protocols.clouds.skycli import (
    SkyFailed,
    _clusters,
    _decode,
    _requests,
    lowest_json,
    lowest_table,
    submitted,
)
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


def test_a_down_request_id_is_read_whatever_the_case_of_its_label() -> None:
    # 0.14's `sky down --async` (command.py _down_or_stop_clusters): the label is 'sky.' + 'Terminating'
    down = ("\n\x1b[32mSubmitted sky.Terminating request: 7c5e0a52-1d3b-4e0f-9a8e-52d0e1f4b0aa\x1b[0m\n"
            "├── Check logs with: sky api logs 7c5e0a52\n└── To cancel the request, run: sky api cancel 7c5e0a52\n\n"
            "Terminating cluster ar-x...done.\n")
    assert submitted(down) == "7c5e0a52-1d3b-4e0f-9a8e-52d0e1f4b0aa"
    assert submitted("Cluster(s) not found (tip: see `sky status`).\n") is None


SHOW_GPUS_T4 = (  # `sky show-gpus T4:1 --infra aws/us-east-1`: one table per name the pattern matches
    "GPU  QTY  CLOUD  INSTANCE_TYPE  DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION     \n"
    "T4   1.0  AWS    g4dn.xlarge    16GB        4      16GB      $ 0.526       $ 0.216            us-east-1  \n"
    "\n\n"
    "GPU  QTY  CLOUD  INSTANCE_TYPE  DEVICE_MEM  vCPUs  HOST_MEM  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION     \n"
    "T4g  1.0  AWS    g5g.xlarge     16GB        4      8GB       $ 0.420       $ 0.159            us-east-1  \n"
)


def test_the_price_is_that_of_exactly_the_asked_gpu_name_in_a_table() -> None:
    assert lowest_table(SHOW_GPUS_T4, "T4", spot=False) == 0.526  # not T4g's 0.420
    assert lowest_table(SHOW_GPUS_T4, "T4", spot=True) == 0.216
    assert lowest_table(SHOW_GPUS_T4, "T4g", spot=False) == 0.42
    missing = ("GPU  QTY  CLOUD  INSTANCE_TYPE  HOURLY_PRICE  HOURLY_SPOT_PRICE  REGION\n"
               "T4   1.0  AWS    g4dn.xlarge    -             -                  us-east-1\n")
    assert lowest_table(missing, "T4", spot=False) is None  # no price is no price, not $0
    not_found = "Resources 'H200' with requested quantity 1 not found on AWS. To show available accelerators, ..."
    assert lowest_table(not_found, "H200", spot=False) is None


def test_the_price_is_that_of_exactly_the_asked_gpu_name_in_json() -> None:
    row = {"cloud": "AWS", "accelerator_count": 1.0, "region": "us-east-1", "cpu_count": 4.0}
    text = ('{"A100": [], "A100-80GB": [' + json_row(row, "p4de", 5.0, 2.0) + "],"
            ' "L4": [' + json_row(row, "g6.xlarge", 0.8048, "NaN") + "],"
            ' "L40S": [' + json_row(row, "g6e.xlarge", 1.861, 0.7329) + "]}")
    assert lowest_json(text, "L4", "aws/us-east-1", spot=False) == 0.8048  # not L40S's
    assert lowest_json(text, "L4", "aws/us-east-1", spot=True) is None  # NaN: no spot price
    assert lowest_json(text, "A100", "aws/us-east-1", spot=False) is None  # not A100-80GB's
    assert lowest_json(text, "L40S", "aws/us-west-2", spot=False) is None  # another region's row
    assert lowest_json("{}", "T4", "aws/us-east-1", spot=False) is None
    with pytest.raises(SkyFailed, match="no JSON object"):
        lowest_json("Traceback ...", "T4", "aws/us-east-1", spot=False)


def json_row(base: dict[str, object], kind: str, price: float, spot: float | str) -> str:
    import json

    return json.dumps({**base, "instance_type": kind, "price": price}).rstrip("}") + f', "spot_price": {spot}}}'


def test_a_failed_launch_is_classified_by_the_exception_it_printed() -> None:
    unavailable = "sky.exceptions.ResourcesUnavailableError: Failed to provision all possible launchable resources."
    assert classify(unavailable) == Code.NO_CAPACITY
    assert classify("botocore: An error occurred (InsufficientInstanceCapacity) ...") == Code.NO_CAPACITY
    quota = unavailable + " Failed to provision on cloud AWS due to VcpuLimitExceeded: You have requested more vCPU"
    assert classify(quota) == Code.QUOTA  # wrapped by SkyPilot, still the account's quota
    assert classify("RuntimeError: Failed to set up the cluster: the setup command exited 1") == Code.LAUNCH_FAILED
