"""Which PyTorch wheel an NVIDIA driver runs: the torch version to pin and the CUDA index tag.

Pure data and functions (no torch import): doctor's fixes print ``torch==X.Y.Z --index-url
https://download.pytorch.org/whl/cuXYZ`` for the release the user has, with the newest CUDA build
of that release that the installed driver supports.
"""

from __future__ import annotations

import re

PYTORCH_INDEX = "https://download.pytorch.org/whl"
RECOMMENDED_TORCH = "2.13.0"  # what the docs install (docs/windows-powershell.md, linux.md, wsl2.md)

# CUDA builds on download.pytorch.org per torch release, oldest CUDA first. Sources:
# - 2.6-2.10: pytorch.org "Previous PyTorch Versions" install commands (2.6 cu118/cu124/cu126,
#   2.7 cu118/cu126/cu128, 2.8 cu126/cu128/cu129, 2.9 and 2.10 cu126/cu128/cu130); recalled,
#   not re-checked here (no network): the rows xtrain's docs rely on are 2.11-2.13.
# - 2.11 and 2.13: shared/FIELD_NOTES.md ("torch.distributed on Windows", tags by release).
# - 2.12: build matrix 12.6 / 13.0 / 13.2 (aws/deep-learning-containers#6231,
#   mjun0812/flash-attention-prebuild-wheels#95); cu128 removed (googlecolab/colabtools#5982).
CUDA_TAGS: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 6): ("cu118", "cu124", "cu126"),
    (2, 7): ("cu118", "cu126", "cu128"),
    (2, 8): ("cu126", "cu128", "cu129"),
    (2, 9): ("cu126", "cu128", "cu130"),
    (2, 10): ("cu126", "cu128", "cu130"),
    (2, 11): ("cu126", "cu128", "cu130"),
    (2, 12): ("cu126", "cu130", "cu132"),
    (2, 13): ("cu126", "cu130"),
}
# CUDA 13 builds need compute capability >= 7.5 (FIELD_NOTES: no Maxwell/Pascal/Volta kernels).
MIN_CC_CUDA13 = 7.5
# Lowest driver branch per CUDA major under minor-version compatibility (NVIDIA, "CUDA
# Compatibility: Minor Version Compatibility", table 1): 13.x >= 580, 12.x >= 525, 11.x >= 450.
DRIVER_BRANCH_FOR_CUDA_MAJOR = {13: 580, 12: 525, 11: 450}


# Windows wheels built without gloo's libuv transport, the only one gloo has on Windows:
# init_process_group("gloo") fails with "makeDeviceForHostname(): unsupported gloo device"
# (pytorch#150381). gloo's CMakeLists set USE_LIBUV OFF under MSVC in gloo accd654 (#398,
# 2024-11-26) and back ON in 3135b0b (#472, 2025-12-01); pytorch PR#170491 (2025-12-16) moved
# torch's third_party/gloo past it. Checked here in the released win_amd64 wheels on PyPI (the CPU
# builds): torch_cpu.dll of 2.8.0, 2.9.0, 2.9.1 and 2.10.0 has no makeUVDevice (the uv transport's
# factory), that of 2.6.0, 2.7.0, 2.7.1, 2.11.0, 2.12.0 and 2.13.0 has it. Not checked: the CUDA
# builds on download.pytorch.org (built from the same source; users report 2.8.0+cu128 failing:
# vllm-windows#19, GPT-SoVITS#2626, OneTrainer#1122) and the nightlies (inferred below).
WINDOWS_GLOO_BROKEN: tuple[tuple[int, int], ...] = ((2, 8), (2, 9), (2, 10))
# 2.11 nightlies built before PR#170491 was merged (2025-12-16) carry 2.10's gloo: inferred from
# the merge date, not checked in a nightly wheel.
WINDOWS_GLOO_FIXED_NIGHTLY = 20251217
# A working release to move to when the recommended one has no build for the driver: the last
# release before the break (cu118 builds for older drivers).
WINDOWS_GLOO_FALLBACK = "2.7.1"


def _numbers(text: str | None, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:n])


def tag_cuda(tag: str) -> tuple[int, int]:
    """cu126 -> (12, 6), cu130 -> (13, 0)."""
    digits = tag.removeprefix("cu")
    return int(digits[:-1]), int(digits[-1])


def release(torch_version: str | None) -> tuple[int, int]:
    """(major, minor) of a torch version; the recommended release when unknown."""
    got = _numbers((torch_version or "").split("+")[0], 2)
    return (got[0], got[1]) if len(got) == 2 else _numbers(RECOMMENDED_TORCH, 2)  # type: ignore[return-value]


def pinned_version(torch_version: str | None) -> str:
    """The public version to pin (``2.13.0+cpu`` -> ``2.13.0``); the recommended one when unknown."""
    public = (torch_version or "").split("+")[0].strip()
    return public if re.fullmatch(r"\d+\.\d+(\.\d+)?", public) else RECOMMENDED_TORCH


def windows_gloo_broken(torch_version: str | None) -> bool:
    """Is this a torch whose Windows build cannot create a gloo device (pytorch#150381)?"""
    rel = release(torch_version) if torch_version else None
    if rel in WINDOWS_GLOO_BROKEN:
        return True
    nightly = re.search(r"\.dev(\d{8})", torch_version or "")
    return rel == (2, 11) and nightly is not None and int(nightly.group(1)) < WINDOWS_GLOO_FIXED_NIGHTLY


def tags_for(torch_version: str | None) -> tuple[str, ...]:
    """CUDA tags published for this release (the nearest known release outside the table)."""
    rel = release(torch_version)
    known = sorted(CUDA_TAGS)
    if rel in CUDA_TAGS:
        return CUDA_TAGS[rel]
    nearest = (
        known[-1] if rel > known[-1] else known[0] if rel < known[0] else max(k for k in known if k < rel)
    )
    return CUDA_TAGS[nearest]


def driver_max_cuda(driver_cuda: str | None, driver_version: str | None) -> tuple[int, int] | None:
    """Highest CUDA the driver runs: nvidia-smi's "CUDA Version", else from the driver branch
    (minor-version compatibility covers the whole major then)."""
    got = _numbers(driver_cuda, 2)
    if len(got) == 2:
        return got[0], got[1]
    branch = _numbers(driver_version, 1)
    if branch:
        for major, floor in sorted(DRIVER_BRANCH_FOR_CUDA_MAJOR.items(), reverse=True):
            if branch[0] >= floor:
                return major, 99
    return None


def pick_tag(
    torch_version: str | None,
    driver_cuda: str | None,
    driver_version: str | None,
    min_cc: float | None = None,
) -> str | None:
    """The newest CUDA build of this torch release that the driver runs; None when none does
    (the driver must be updated). An unknown driver gets the oldest CUDA 12 build."""
    tags = [
        t for t in tags_for(torch_version) if tag_cuda(t)[0] < 13 or min_cc is None or min_cc >= MIN_CC_CUDA13
    ]
    have = driver_max_cuda(driver_cuda, driver_version)
    if have is None:
        return next((t for t in tags if tag_cuda(t)[0] == 12), tags[0] if tags else None)
    fitting = [t for t in tags if tag_cuda(t) <= have]
    if fitting:
        return fitting[-1]
    # A 12.0-12.5 driver runs a cu126 build through minor-version compatibility.
    return next((t for t in tags if tag_cuda(t)[0] == have[0]), None)


def index_url(tag: str) -> str:
    return f"{PYTORCH_INDEX}/{tag}"
