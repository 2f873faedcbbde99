"""Our GPU names and each vendor's ids for them: the one table every adapter reads.

A candidate says `gpu = "H100"`; RunPod calls that GPU type "NVIDIA H100 80GB HBM3", Hyperstack's
flavors say "H100-80G-PCIe" in their `gpu` field, Lambda sells it as instance type
"gpu_1x_h100_pcie". An entry lists every id the vendor uses for it, preferred first. Names are
matched without regard to case; a name missing here is passed through as the vendor's own id (so a
vendor's new GPU can be asked for before the table knows it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# ours -> vendor -> the vendor's ids for one such GPU on a machine (single-GPU machines)
GPUS: dict[str, dict[str, tuple[str, ...]]] = {
    "H100": {
        "runpod": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
        "hyperstack": ("H100-80G-PCIe", "H100-80G-SXM5", "H100-80G-PCIe-NVLink"),
        "lambda": ("gpu_1x_h100_pcie", "gpu_1x_h100_sxm5"),
        "vastai": ("H100 SXM", "H100 PCIE", "H100 NVL"),
        "shadeform": ("H100",),
    },
    "H200": {
        "runpod": ("NVIDIA H200",),
        "hyperstack": ("H200-141G-SXM5",),
        "lambda": ("gpu_1x_h200_sxm5",),
        "vastai": ("H200", "H200 NVL"),
        "shadeform": ("H200",),
    },
    "A100-80G": {
        "runpod": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "hyperstack": ("A100-80G-PCIe", "A100-80G-PCIe-NVLink"),
        "lambda": ("gpu_1x_a100_sxm4_80gb",),
        "vastai": ("A100 SXM4", "A100 PCIE"),
        "shadeform": ("A100_80G",),
    },
    "A100": {
        "runpod": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "hyperstack": ("A100-80G-PCIe",),
        "lambda": ("gpu_1x_a100_sxm4", "gpu_1x_a100"),
        "vastai": ("A100 SXM4", "A100 PCIE", "A100X"),
        "shadeform": ("A100_80G", "A100"),
    },
    "A100-40G": {
        "runpod": (),
        "hyperstack": (),
        "lambda": ("gpu_1x_a100_sxm4", "gpu_1x_a100"),
    },
    "L40S": {
        "runpod": ("NVIDIA L40S",),
        "hyperstack": ("L40",),
        "lambda": (),
        "vastai": ("L40S",),
        "shadeform": ("L40S",),
    },
    "RTX4090": {
        "runpod": ("NVIDIA GeForce RTX 4090",),
        "hyperstack": (),
        "lambda": (),
        "vastai": ("RTX 4090",),
        "shadeform": ("RTX4090",),
    },
    "A6000": {
        "runpod": ("NVIDIA RTX A6000",),
        "hyperstack": ("RTX-A6000",),
        "lambda": ("gpu_1x_a6000",),
        "vastai": ("RTX A6000",),
        "shadeform": ("A6000",),
    },
    "B200": {
        "runpod": ("NVIDIA B200",),
        "hyperstack": ("B200-180G-SXM",),
        "lambda": ("gpu_1x_b200_sxm6",),
        "vastai": ("B200",),
        "shadeform": ("B200",),
    },
}

# Memory per GPU in GB, from NVIDIA's data sheets: H100 (SXM5 and PCIe) 80 GB; H200 141 GB; A100
# 40 GB or 80 GB (our plain "A100" is the 40 GB one: the least it may be, so an out-of-memory job moves
# on to a GPU certain to be bigger); L40S 48 GB; GeForce RTX 4090 24 GB; RTX A6000 48 GB; B200 180 GB
# (DGX B200: 1,440 GB across 8 GPUs).
# https://www.nvidia.com/en-us/data-center/h100/ (H100 Tensor Core GPU datasheet)
# https://www.nvidia.com/en-us/data-center/h200/
# https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
# https://www.nvidia.com/en-us/data-center/l40s/
# https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/
# https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf
# https://www.nvidia.com/en-us/data-center/dgx-b200/
GPU_MEMORY_GB: dict[str, float] = {
    "H100": 80, "H200": 141, "A100-80G": 80, "A100": 40, "A100-40G": 40, "L40S": 48, "RTX4090": 24, "A6000": 48,
    "B200": 180,
}

# --- CUDA floor ---------------------------------------------------------------------------------
# The oldest CUDA version that runs on each class: the first CUDA toolkit whose release notes add the
# class's compute capability (its driver branch is the one that toolkit ships with). An image whose
# CUDA is older cannot run a kernel built for the GPU; a place with no image at or above the floor is
# skipped before any create. A100 (sm_80): CUDA 11.0; RTX A6000 (sm_86): CUDA 11.1; L40S and RTX 4090
# (Ada, sm_89) and H100 (Hopper, sm_90): CUDA 11.8; H200 (sm_90, supported from the R550 data-center
# driver): CUDA 12.4; B200 (Blackwell, sm_100): CUDA 12.8.
# https://developer.nvidia.com/cuda-gpus (compute capability of each GPU)
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ (11.0: Ampere A100; 11.1: sm_86; 11.8: Ada and Hopper;
#   12.8: Blackwell)
# https://docs.nvidia.com/cuda/ampere-compatibility-guide/  https://docs.nvidia.com/cuda/hopper-compatibility-guide/
# https://docs.nvidia.com/cuda/ada-compatibility-guide/  https://docs.nvidia.com/cuda/blackwell-compatibility-guide/
# https://docs.nvidia.com/datacenter/tesla/tesla-release-notes-550-54-14/ (R550: H200 supported)
CUDA_FLOOR: dict[str, tuple[int, int]] = {
    "A100": (11, 0), "A100-80G": (11, 0), "A100-40G": (11, 0), "A6000": (11, 1), "L40S": (11, 8),
    "RTX4090": (11, 8), "H100": (11, 8), "H200": (12, 4), "B200": (12, 8),
}

_CUDA_WORDS = re.compile(r"cuda[\s_-]*v?(\d{2}|\d)\.(\d+)", re.IGNORECASE)  # "CUDA 12.2", "cuda12.4", "cuda-12.8"
_CUDA_TAG = re.compile(r"(?<![a-z0-9])cu(1\d)(\d)\d?(?![0-9])", re.IGNORECASE)  # "cu1281" (12.8.1), "cu124", "cu118"


def cuda_floor(gpu: str) -> tuple[int, int] | None:
    """The oldest CUDA (major, minor) the class of shape `gpu` runs on; None when the table does not
    know the class (any image is taken)."""
    ours = _FOLDED.get(gpu_class(gpu).lower())
    return CUDA_FLOOR.get(ours) if ours is not None else None


def no_image(region: str, gpu: str) -> str:
    """Why a place with stock gets no offer: `region` lists no image whose CUDA the class of `gpu`
    needs (said by `actor-run plan`: capabilities.PassingOver)."""
    floor = cuda_floor(gpu)
    need = f"CUDA {floor[0]}.{floor[1]} or newer" if floor is not None else "the image asked for"
    return f"{region}: no image with {need} for {gpu_class(gpu)}"


def newest_image(images: Iterable[tuple[str, tuple[int, int] | None]], floor: tuple[int, int]) -> str:
    """Of (name, the CUDA it carries) pairs, the name with the newest CUDA at or above `floor` ("":
    none; an image whose CUDA is unknown never qualifies)."""
    fit = [(cuda, name) for name, cuda in images if cuda is not None and cuda >= floor]
    return max(fit)[1] if fit else ""


def image_cuda(image: str) -> tuple[int, int] | None:
    """The CUDA (major, minor) an image's name says it carries ("Ubuntu Server 22.04 LTS R535 CUDA
    12.2", "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"), or None when the name does not say."""
    for pattern in (_CUDA_WORDS, _CUDA_TAG):
        m = pattern.search(image)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def cuda_text(version: tuple[int, int] | None) -> str:
    return "" if version is None else f"{version[0]}.{version[1]}"


# What `nvidia-smi --query-gpu=name` prints for each class (a regular expression, searched without
# regard to case), from the names NVIDIA's drivers give the boards: "NVIDIA H100 80GB HBM3", "NVIDIA
# H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA L40S", "NVIDIA GeForce RTX
# 4090", "NVIDIA RTX A6000", "NVIDIA B200". Our plain "A100" is any A100 (40 GB is the least it may be).
SMI_NAMES: dict[str, str] = {
    "H100": r"\bH100\b", "H200": r"\bH200\b", "A100-80G": r"\bA100\b.*\b80\s?GB", "A100": r"\bA100\b",
    "A100-40G": r"\bA100\b.*\b40\s?GB", "L40S": r"\bL40S\b", "RTX4090": r"\bRTX 4090\b", "A6000": r"\bRTX A6000\b",
    "B200": r"\bB200\b",
}

_FOLDED = {name.lower(): name for name in GPUS}

# --- the CUDA floor of each GPU class (kept apart from GPUS: one column, one merge) -----------------
# ours -> the oldest CUDA toolkit that builds for its compute capability: a host whose driver tops
# out below it (Vast's `cuda_max_good`) cannot run a job built for the GPU. From NVIDIA's own pages:
# the CUDA GPUs table (developer.nvidia.com/cuda-gpus) gives each GPU's compute capability; the CUDA
# toolkit release notes give the first release for it: sm_80 in CUDA 11.0, sm_86 in 11.1, sm_89 and
# sm_90 in 11.8 ("support for the NVIDIA Hopper and Ada Lovelace architectures"), sm_100 in 12.8
# ("support for the NVIDIA Blackwell architecture").
MIN_CUDA: dict[str, float] = {
    "A100": 11.0, "A100-40G": 11.0, "A100-80G": 11.0,  # compute capability 8.0
    "A6000": 11.1,  # 8.6
    "L40S": 11.8, "RTX4090": 11.8,  # 8.9
    "H100": 11.8, "H200": 11.8,  # 9.0
    "B200": 12.8,  # 10.0
}


def min_cuda(gpu: str) -> float:
    """The CUDA floor of our GPU class `gpu` (0.0 for a name the table does not know)."""
    ours = _FOLDED.get(gpu.lower())
    return MIN_CUDA.get(ours, 0.0) if ours else 0.0


class ShapeError(ValueError):
    """A GPU shape that is not `<class>` or `<class>:<count>` with a count of at least 1."""


def parse_shape(gpu: str) -> tuple[str, int]:
    """(class, count) of a GPU shape: `H100:8` is eight H100s on one machine, `H100` one, "" none
    asked (any). Raises ShapeError on a count that is not a whole number of at least 1."""
    name, sep, count = gpu.partition(":")
    name = name.strip()
    if not sep:
        return name, 1
    if not count.strip().isdigit() or int(count) < 1 or not name:
        raise ShapeError(f"expected <GPU> or <GPU>:<count> (H100:8), got {gpu!r}")
    return name, int(count)


def shape(gpu: str, count: int) -> str:
    """The shape for `count` GPUs of class `gpu`: `gpu` itself for one, `gpu:count` for more."""
    return gpu if count == 1 or not gpu else f"{gpu}:{count}"


def gpu_class(gpu: str) -> str:
    """The class of a shape (`H100` of `H100:8`); a malformed count is left to the spec's check."""
    return gpu.partition(":")[0].strip()


def gpu_count(gpu: str) -> int:
    """How many GPUs a shape asks for (1 when it names no count, or an unreadable one)."""
    try:
        return parse_shape(gpu)[1]
    except ShapeError:
        return 1


def same_shape(a: str, b: str) -> bool:
    """Whether two shapes name the same class (without regard to case) and count."""
    return gpu_class(a).lower() == gpu_class(b).lower() and gpu_count(a) == gpu_count(b)


def smi_matches(smi_name: str, gpu: str) -> bool:
    """Whether a GPU `nvidia-smi` names `smi_name` is of our class `gpu` (a shape's class). A class the
    table does not know matches a name that contains it (a vendor's own id), or any name for ""."""
    ours = _FOLDED.get(gpu_class(gpu).lower())
    if ours is None:
        want = gpu_class(gpu).lower()
        return not want or want in smi_name.lower()
    return re.search(SMI_NAMES.get(ours, re.escape(ours)), smi_name, re.IGNORECASE) is not None


def vendor_ids(gpu: str, vendor: str) -> tuple[str, ...]:
    """The vendor's ids for our GPU `gpu` (preferred first; a shape's class: `H100:8` gives H100's);
    an unknown name is taken as the vendor's own id."""
    gpu = gpu_class(gpu)
    ours = _FOLDED.get(gpu.lower())
    if ours is None:
        return (gpu,) if gpu else ()
    return GPUS[ours].get(vendor, ())


def our_name(vendor_id: str, vendor: str) -> str:
    """Our name for a vendor id, or the id itself when the table has no entry for it."""
    for ours, vendors in GPUS.items():
        if vendor_id in vendors.get(vendor, ()):
            return ours
    return vendor_id


def gpu_names(vendor: str = "") -> frozenset[str]:  # the classes: a shape's count is checked apart
    """The GPU names a candidate may say for `vendor`: ours, and the vendor's own ids."""
    return frozenset(GPUS) | {i for ids in GPUS.values() for i in ids.get(vendor, ())}


def gpu_memory_gb(gpu: str) -> float | None:
    """All the GPU memory a machine of `gpu` has, in GB: one GPU's memory (`GPU_MEMORY_GB`), times
    the count of a shape like `H100:8`. None when the table does not know the class (or `gpu` is
    empty): nothing can be said to be bigger or smaller than it."""
    name, _, count = gpu.partition(":")
    ours = _FOLDED.get(name.strip().lower())
    if ours is None or ours not in GPU_MEMORY_GB:
        return None
    n = int(count) if count.strip().isdigit() and int(count) > 0 else 1
    return GPU_MEMORY_GB[ours] * n


__all__ = [
    "CUDA_FLOOR",
    "GPUS",
    "GPU_MEMORY_GB",
    "MIN_CUDA",
    "SMI_NAMES",
    "ShapeError",
    "cuda_floor",
    "cuda_text",
    "gpu_class",
    "gpu_count",
    "gpu_memory_gb",
    "gpu_names",
    "image_cuda",
    "min_cuda",
    "newest_image",
    "no_image",
    "our_name",
    "parse_shape",
    "same_shape",
    "shape",
    "smi_matches",
    "vendor_ids",
]
