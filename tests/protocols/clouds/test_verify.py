"""protocols/clouds/verify.py and the GPU table's shapes and CUDA floor (protocols/clouds/gpus.py):
what a machine's nvidia-smi and clock must say before a job runs there, which image a GPU class can
boot, and which SSH hosts offer a shape and are checked. No machine, no network."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.clouds.gpus import (
    CUDA_FLOOR,
    GPU_MEMORY_GB,
    ShapeError,
    cuda_floor,
    image_cuda,
    parse_shape,
    smi_matches,
)
from actor_run.protocols.clouds.verify import MachineCheck, check_script, judge
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import CandidateSpec

T = 1_800_000_000.0


def smi(*names: str, clock: float = T, code: int = 0) -> str:
    return "\n".join([*names, f"actor-run-check smi-exit {code}", f"actor-run-check clock {int(clock)}"]) + "\n"


def test_shapes_parse_and_a_bad_count_is_refused() -> None:
    assert parse_shape("H100:8") == ("H100", 8)
    assert parse_shape("A100-80G") == ("A100-80G", 1)
    assert parse_shape("") == ("", 1)
    for bad in ("H100:0", "H100:x", ":8", "H100:-1"):
        with pytest.raises(ShapeError):
            parse_shape(bad)


def test_every_class_with_memory_has_a_cuda_floor_and_blackwell_needs_more_than_hopper() -> None:
    assert set(CUDA_FLOOR) == set(GPU_MEMORY_GB)
    assert cuda_floor("B200:8") == (12, 8) > cuda_floor("H100") == (11, 8)  # type: ignore[operator]
    assert cuda_floor("made-up-gpu") is None


@pytest.mark.parametrize(("image", "cuda"), [
    ("Ubuntu Server 22.04 LTS R535 CUDA 12.2", (12, 2)),
    ("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404", (12, 8)),
    ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", (12, 1)),
    ("nvcr.io/nvidia/pytorch:24.01-py3", None),
    ("Ubuntu Server 22.04 LTS", None),
])
def test_an_images_cuda_is_read_from_its_name(image: str, cuda: tuple[int, int] | None) -> None:
    assert image_cuda(image) == cuda


@pytest.mark.parametrize(("name", "gpu", "ok"), [
    ("NVIDIA H100 80GB HBM3", "H100", True),
    ("NVIDIA H100 PCIe", "H100:8", True),
    ("NVIDIA A100-SXM4-80GB", "A100-80G", True),
    ("NVIDIA A100-SXM4-40GB", "A100-80G", False),
    ("NVIDIA A100-PCIE-40GB", "A100", True),
    ("NVIDIA GeForce RTX 4090", "A100", False),
    ("NVIDIA L40", "L40S", False),
])
def test_nvidia_smi_names_are_matched_through_the_table(name: str, gpu: str, ok: bool) -> None:
    assert smi_matches(name, gpu) is ok


def test_a_machine_with_the_asked_gpus_and_clock_passes() -> None:
    want = MachineCheck(gpu="A100-80G:2")
    assert judge(want, smi("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"), T - 0.5, T + 0.5) == ""


def test_too_few_another_class_no_driver_and_a_skewed_clock_are_each_named() -> None:
    want = MachineCheck(gpu="H100:8")
    few = judge(want, smi(*["NVIDIA H100 80GB HBM3"] * 7), T, T)
    assert few.startswith("nvidia-smi lists 7 H100s, 8 asked")
    other = judge(want, smi(*["NVIDIA A100-SXM4-80GB"] * 8), T, T)
    assert "lists 0 H100s, 8 asked (it lists: 8 x NVIDIA A100-SXM4-80GB)" in other
    none = judge(want, smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                           code=9), T, T)
    assert none.startswith("nvidia-smi sees no NVIDIA GPU (exit 9")
    skewed = judge(MachineCheck(gpu="H100"), smi("NVIDIA H100 PCIe", clock=T - 300), T, T)
    assert skewed == "its clock is 300 s behind the controller's (at most 60 s)"
    assert judge(MachineCheck(gpu="H100"), smi("NVIDIA H100 PCIe", clock=T + 59), T, T) == ""


def test_check_gpu_false_asks_only_the_clock() -> None:
    want = MachineCheck(gpu="H100", check_gpu=False)
    assert "nvidia-smi" not in check_script(want)
    assert judge(want, f"actor-run-check clock {int(T)}\n", T, T) == ""


def test_ssh_hosts_declare_their_gpus_slots_cannot_exceed_them_and_they_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"clouds\.ssh\.hosts\.box\.slots: 8 slots on a host with 4 GPUs"):
        make_cloud("ssh", {"hosts": {"box": {"address": "127.0.0.1", "gpus": "A100:4", "slots": 8}}}, tmp_path)
    with pytest.raises(SpecError, match=r"clouds\.ssh\.hosts\.box\.gpus"):
        make_cloud("ssh", {"hosts": {"box": {"address": "127.0.0.1", "gpus": "A100:0"}}}, tmp_path)
    cloud = make_cloud("ssh", {"hosts": {"box": {"address": "127.0.0.1", "gpus": "A100:4", "slots": 2},
                                         "plain": {"address": "127.0.0.2"}}}, tmp_path)

    def offered(gpu: str) -> list[tuple[str, str]]:
        found = trio.run(cloud.offers, CandidateSpec(cloud="ssh", gpu=gpu), 0)
        return [(o.host, o.gpu) for o in found]

    assert offered("A100:4") == [("box", "A100:4"), ("plain", "A100:4")]  # a host that declares none: as before
    assert offered("A100:8") == [("plain", "A100:8")]  # box has 4
    assert offered("H100") == [("plain", "H100")]
    assert offered("") == [("box", "A100:2"), ("plain", "")]  # a slot's share of the host's GPUs
    box = cloud.machine_check(Offer(cloud="ssh", host="box", region="box", gpu="A100:2"))
    assert (box.gpu, box.check_gpu, box.check_clock) == ("A100:2", True, True)
    assert cloud.machine_check(Offer(cloud="ssh", host="plain", region="plain")) is None  # promises no GPU
