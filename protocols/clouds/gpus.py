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

_FOLDED = {name.lower(): name for name in GPUS}

# --- the CUDA floor of each GPU class (kept apart from GPUS: one column, one merge) -----------------
# ours -> the oldest CUDA toolkit that builds for its compute capability: a host whose driver tops
# out below it (Vast's `cuda_max_good`) cannot run a job built for the GPU. From NVIDIA's own pages:
# the CUDA GPUs table (developer.nvidia.com/cuda-gpus) gives each GPU's compute capability; the CUDA
# toolkit release notes give the first release for it: sm_80 in CUDA 11.0, sm_86 in 11.1, sm_89 and
# sm_90 in 11.8 ("support for the NVIDIA Hopper and Ada Lovelace architectures"), sm_100 in 12.8
# ("support for the NVIDIA Blackwell architecture").
MIN_CUDA: dict[str, float] = {
    "A100": 11.0, "A100-80G": 11.0,  # compute capability 8.0
    "A6000": 11.1,  # 8.6
    "L40S": 11.8, "RTX4090": 11.8,  # 8.9
    "H100": 11.8, "H200": 11.8,  # 9.0
    "B200": 12.8,  # 10.0
}


def min_cuda(gpu: str) -> float:
    """The CUDA floor of our GPU class `gpu` (0.0 for a name the table does not know)."""
    ours = _FOLDED.get(gpu.lower())
    return MIN_CUDA.get(ours, 0.0) if ours else 0.0


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


__all__ = ["GPUS", "MIN_CUDA", "gpu_names", "min_cuda", "our_name", "vendor_ids"]
