"""Checks of bitsandbytes, which ``model.quantization`` (4bit/8bit) and the 8-bit optimizers
need: not installed (a hint: only those settings need it), older than xtrain supports, or a build
without the native library this torch needs (machine/quant_support.py tells from file names)."""

from __future__ import annotations

from xtrain.machine.facts import Facts, version_tuple
from xtrain.machine.quant_support import MIN_BITSANDBYTES, PACKAGE, cuda_library_for
from xtrain.planning.checks.fixes import pip_line
from xtrain.planning.plan import Finding, Plan

NEEDED_FOR = "model.quantization (4bit/8bit) and optim.name adamw_8bit/paged_adamw_8bit"
REQUIREMENT = f"{PACKAGE}>={MIN_BITSANDBYTES}"


def needed_backend(facts: Facts) -> str | None:
    """What this torch makes bitsandbytes load, in words: ``CUDA 12.6`` for a CUDA build of torch
    (a library of that CUDA major), else ``cpu``; None without torch."""
    if facts.torch_version is None:
        return None
    return f"CUDA {facts.torch_cuda}" if facts.torch_cuda else "cpu"


def check_bitsandbytes(facts: Facts, plan: Plan) -> list[Finding]:
    if PACKAGE not in facts.packages:
        return []  # a snapshot from before xtrain looked: nothing is known
    version = facts.packages[PACKAGE]
    if version is None:
        return [
            Finding(
                "bitsandbytes-missing",
                "ok",
                f"bitsandbytes is not installed: only {NEEDED_FOR} need it.",
                pip_line(facts, plan, ["install", REQUIREMENT]),
            )
        ]
    upgrade = pip_line(facts, plan, ["install", "--upgrade", REQUIREMENT])
    if version_tuple(version) < version_tuple(MIN_BITSANDBYTES):
        return [
            Finding(
                "bitsandbytes-old",
                "warn",
                f"bitsandbytes {version} is older than {MIN_BITSANDBYTES}, the oldest xtrain supports "
                f"for {NEEDED_FOR}.",
                upgrade,
            )
        ]
    backends = facts.bitsandbytes_backends
    want = needed_backend(facts)
    if backends is None or want is None:
        return [Finding("bitsandbytes", "ok", f"bitsandbytes {version} is installed.")]
    library = (
        cuda_library_for(facts.torch_cuda, backends)
        if facts.torch_cuda
        else ("cpu" if "cpu" in backends else None)
    )
    if library is None:
        shipped = ", ".join(backends) or "none"
        # --no-deps: a forced reinstall would otherwise reinstall torch too, from PyPI (on Windows
        # a CPU build in place of the CUDA one)
        reinstall = ["install", "--upgrade", "--force-reinstall", "--no-deps", REQUIREMENT]
        return [
            Finding(
                "bitsandbytes-no-backend",
                "warn",
                f"bitsandbytes {version} has no native library for this torch ({want}; it ships: "
                f"{shipped}): {NEEDED_FOR} fail when bitsandbytes loads ('No compatible CUDA binary found').",
                pip_line(facts, plan, reinstall),
            )
        ]
    return [Finding("bitsandbytes", "ok", f"bitsandbytes {version} loads its {library} library here.")]
