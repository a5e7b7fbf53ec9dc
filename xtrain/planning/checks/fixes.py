"""Fix lines several checks share: the torch wheel the driver runs, pip in the user's shell, the
driver update."""

from __future__ import annotations

import re

from xtrain.machine.facts import Facts
from xtrain.machine.torch_wheels import index_url, pick_tag, pinned_version
from xtrain.planning.plan import Plan
from xtrain.shell import comment, pip_command


def min_cc(facts: Facts) -> float | None:
    """Lowest compute capability of the cards: torch's view, else guessed from nvidia-smi names."""
    caps = [g.cc for g in facts.gpus if g.cc] or [
        cc for cc in (cc_from_name(n) for n in facts.smi_gpu_names) if cc is not None
    ]
    return min(caps) if caps else None


def torch_index_tag(facts: Facts, version: str | None = None) -> str | None:
    """The PyTorch wheel index tag of this torch release (or of ``version``) that the installed
    driver runs."""
    return pick_tag(version or facts.torch_version, facts.driver_cuda, facts.driver_version, min_cc(facts))


def pip_line(facts: Facts, plan: Plan, args: list[str]) -> str:
    """pip run by the interpreter that runs xtrain, in the user's shell."""
    return pip_command(plan.shell, facts.python_executable or None, args)


def torch_install(facts: Facts, plan: Plan, reinstall: bool, version: str | None = None) -> str | None:
    """The pip line for this torch release (or ``version``) in the CUDA build the driver runs
    (PyPI's build on a machine without an NVIDIA driver); None when the driver runs no build of
    that release."""
    args = ["install"] + (["--force-reinstall"] if reinstall else [])
    args.append(f"torch=={version or pinned_version(facts.torch_version)}")
    if facts.nvidia_smi:
        tag = torch_index_tag(facts, version)
        if tag is None:
            return None
        args += ["--index-url", index_url(tag)]
    return pip_line(facts, plan, args)


def driver_update_lines(facts: Facts) -> list[str]:
    """Comment + check command for "update the driver" (there is no command that does it)."""
    have = f" (it supports CUDA {facts.driver_cuda})" if facts.driver_cuda else ""
    return [
        comment(
            f"update the NVIDIA driver{have} to one for CUDA 12.6 or newer, reboot, then check "
            "the CUDA Version that nvidia-smi reports:"
        ),
        "nvidia-smi",
    ]


def torch_or_driver_fix(facts: Facts, plan: Plan, reinstall: bool) -> str:
    """The torch build this driver runs; where it runs none, the driver update."""
    return torch_install(facts, plan, reinstall=reinstall) or "\n".join(driver_update_lines(facts))


def driver_fix(facts: Facts, plan: Plan) -> str:
    install = torch_install(facts, plan, reinstall=True)
    if install is None:
        return "\n".join(driver_update_lines(facts))
    return "\n".join(
        [comment("update the NVIDIA driver, or install the torch build this driver runs:"), install]
    )


def cc_from_name(name: str) -> float | None:
    """Rough compute capability from a GPU name, for snapshots where torch cannot see the GPU."""
    n = name.upper()
    for pattern, cc in (
        (r"RTX 50\d\d|B200|B100", 10.0),
        (r"H100|H200|H800|GH200", 9.0),
        (r"RTX 40\d\d|L40|L4\b|ADA", 8.9),
        (r"RTX 30\d\d|A10|A40|RTX A\d", 8.6),
        (r"A100|A800|A30", 8.0),
        (r"RTX 20\d\d|T4|TITAN RTX", 7.5),
        (r"V100", 7.0),
        (r"GTX 10\d\d|P100|P40", 6.1),
    ):
        if re.search(pattern, n):
            return cc
    return None
