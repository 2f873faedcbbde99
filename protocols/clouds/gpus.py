"""Our GPU names and each vendor's ids for them: the one table every adapter reads.

A candidate says `gpu = "H100"`; RunPod calls that GPU type "NVIDIA H100 80GB HBM3", Hyperstack's
flavors say "H100-80G-PCIe" in their `gpu` field, Lambda sells it as instance type
"gpu_1x_h100_pcie". An entry lists every id the vendor uses for it, preferred first. Names are
matched without regard to case; a name missing here is passed through as the vendor's own id (so a
vendor's new GPU can be asked for before the table knows it).
"""

from __future__ import annotations

# ours -> vendor -> the vendor's ids for one such GPU on a machine (single-GPU machines)
GPUS: dict[str, dict[str, tuple[str, ...]]] = {
    "H100": {
        "runpod": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
        "hyperstack": ("H100-80G-PCIe", "H100-80G-SXM5", "H100-80G-PCIe-NVLink"),
        "lambda": ("gpu_1x_h100_pcie", "gpu_1x_h100_sxm5"),
    },
    "H200": {
        "runpod": ("NVIDIA H200",),
        "hyperstack": ("H200-141G-SXM5",),
        "lambda": ("gpu_1x_h200_sxm5",),
    },
    "A100-80G": {
        "runpod": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "hyperstack": ("A100-80G-PCIe", "A100-80G-PCIe-NVLink"),
        "lambda": ("gpu_1x_a100_sxm4_80gb",),
    },
    "A100": {
        "runpod": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "hyperstack": ("A100-80G-PCIe",),
        "lambda": ("gpu_1x_a100_sxm4", "gpu_1x_a100"),
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
    },
    "RTX4090": {
        "runpod": ("NVIDIA GeForce RTX 4090",),
        "hyperstack": (),
        "lambda": (),
    },
    "A6000": {
        "runpod": ("NVIDIA RTX A6000",),
        "hyperstack": ("RTX-A6000",),
        "lambda": ("gpu_1x_a6000",),
    },
    "B200": {
        "runpod": ("NVIDIA B200",),
        "hyperstack": ("B200-180G-SXM",),
        "lambda": ("gpu_1x_b200_sxm6",),
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

_FOLDED = {name.lower(): name for name in GPUS}


def vendor_ids(gpu: str, vendor: str) -> tuple[str, ...]:
    """The vendor's ids for our GPU `gpu` (preferred first); an unknown name is taken as the vendor's own id."""
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


def gpu_names(vendor: str = "") -> frozenset[str]:
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


__all__ = ["GPUS", "GPU_MEMORY_GB", "gpu_memory_gb", "gpu_names", "our_name", "vendor_ids"]
