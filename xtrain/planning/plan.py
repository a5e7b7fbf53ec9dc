"""What the rules decide: the launch plan and the findings, as plain data.

A ``Plan`` is everything later stages need (accelerate config, launcher, training loop):
backend, processes, precision, environment variables, data-loader settings. Each choice
carries a reason so doctor and the docs can say *why*.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from xtrain.config.values import PRECISIONS
from xtrain.errors import XtrainError
from xtrain.machine.facts import OS_KINDS

Severity = Literal["ok", "warn", "error"]
SEVERITY_ORDER = {"ok": 0, "warn": 1, "error": 2}


@dataclass
class Finding:
    """One thing doctor found: a stable code, a severity, one sentence and the exact fix."""

    code: str
    severity: Severity
    message: str
    fix: str | None = None  # a command or setting in the user's shell syntax


@dataclass
class Overrides:
    """User choices that take precedence over "auto" (CLI flags of doctor/configure/train/bench,
    the launch context of ``python -m xtrain.run``), built by ``xtrain.planning.resolve`` alone."""

    num_processes: int | None = None
    gpu_ids: list[int] | None = None
    mixed_precision: str | None = None  # no | fp16 | bf16
    port: int | None = None
    platform: str | None = None  # force an os_kind (tests/support: run the Windows path on Linux)
    num_machines: int = 1
    machine_rank: int = 0
    main_address: str | None = None
    weights_dtype: str | None = None  # model.dtype of the train config: bfloat16 weights prefer bf16
    # the checkpoint's own dtype (config.json's torch_dtype/dtype), read by the caller where the
    # model's config is on this machine (never downloaded): what model.dtype auto loads on a GPU
    checkpoint_dtype: str | None = None
    # what `accelerate launch` exported (ACCELERATE_MIXED_PRECISION): a choice only where it
    # differs from the machine's default, which is what `xtrain configure` writes (rules._precision)
    launcher_precision: str | None = None
    cpu_threads: int | None = None  # run.cpu_threads: compute threads a process (None: the rules')

    def check(self) -> None:
        """Every choice that needs no facts, checked in this one place before anything is probed:
        one ``XtrainError`` line for the first mistake. (What needs the machine, such as more
        processes than GPUs, is checked by the rules.)"""
        if self.num_processes is not None and self.num_processes < 1:
            raise XtrainError(
                f"--processes must be at least 1, got {self.num_processes}", "e.g. --processes 2"
            )
        if self.mixed_precision is not None and self.mixed_precision not in PRECISIONS:
            raise XtrainError(f"--precision {self.mixed_precision!r} is unknown", "use no, fp16 or bf16")
        if self.launcher_precision is not None and self.launcher_precision not in PRECISIONS:
            raise XtrainError(
                f"accelerate launch exported mixed precision {self.launcher_precision!r}, which xtrain "
                "does not train with",
                "use --mixed_precision no, fp16 or bf16 (or set run.mixed_precision in the train config)",
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:  # (the config's check says it first)
            raise XtrainError(f"run.cpu_threads must be at least 1, got {self.cpu_threads}", "e.g. 1")
        if self.platform is not None and self.platform not in OS_KINDS:
            raise XtrainError(f"unknown platform {self.platform!r}", f"use one of {', '.join(OS_KINDS)}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise XtrainError(f"--port {self.port} is not a TCP port", "use 1024..65535, e.g. --port 29500")
        if self.num_machines < 1:
            raise XtrainError(f"--machines must be at least 1, got {self.num_machines}", "e.g. --machines 2")
        if not 0 <= self.machine_rank < self.num_machines:
            raise XtrainError(
                f"--machine-rank {self.machine_rank} is outside 0..{self.num_machines - 1}",
                "the main machine is rank 0, the others 1, 2, ...",
            )
        if self.num_machines > 1 and not self.main_address:
            raise XtrainError(
                "several machines need the main machine's address",
                "pass --main-address IP (the IP of the rank-0 machine)",
            )


@dataclass
class Plan:
    """How to launch and train on this machine. Produced only by ``xtrain.planning.rules.make_plan``."""

    os_kind: str
    shell: str  # powershell | bash: the syntax fixes and next commands are written in
    device: str  # cuda | mps | cpu
    backend: str | None  # nccl | gloo; None for a single process
    num_processes: int  # on this machine
    gpu_ids: list[int] | None
    mixed_precision: str  # no | fp16 | bf16
    tf32: bool
    launcher: str  # accelerate | spawn (torch.multiprocessing; Windows, where torchrun trips on libuv)
    cpu: bool  # Accelerator(cpu=True): no accelerator, CPU processes form one gloo group
    cpu_staged_allreduce: bool  # gloo + CUDA on Windows: all-reduce gradients via CPU copies
    env: dict[str, str] = field(default_factory=dict)
    main_address: str = "127.0.0.1"
    main_port: int = 29500
    num_machines: int = 1
    machine_rank: int = 0
    dataloader_workers: int = 0  # DataLoader workers per process for tokenised rows
    media_workers: int = 0  # ... for rows that decode images or audio (Task.decodes_media)
    pin_memory: bool = False
    # compute threads each process sets (torch.set_num_threads; OMP_NUM_THREADS for the processes a
    # launcher starts); None: torch's default, or an OMP_NUM_THREADS the user set (planning/threads.py)
    cpu_threads: int | None = None
    # why run.compile (torch.compile) cannot work here; None: it can (rules.compile_blocker)
    compile_blocker: str | None = None
    # the 16-bit format the weights are in (bf16 | fp16; None: fp32 or unknown): model.dtype, else
    # the checkpoint's; checks.precision warns when the chosen precision narrows their range
    weights_half: str | None = None
    reasons: dict[str, str] = field(default_factory=dict)  # choice -> why

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_machines

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def summary(self, batch: str | None = None) -> str:
        """One line a human reads: processes, backend, precision and the effective batch: ``batch``,
        a run's own in numbers (``RunSettings.batch_line``), else how any config's is split."""
        n = self.world_size
        parts = [
            f"{n} process{'es' if n != 1 else ''}",
            f"on {self.device}" + (f" {self.gpu_ids}" if self.gpu_ids else ""),
            self.backend or "no process group",
            self.mixed_precision if self.mixed_precision != "no" else "fp32",
        ]
        if self.tf32:
            parts.append("TF32")
        return ", ".join(parts) + "; " + (batch or f"effective batch = per-device x {n} x accumulation")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)


@dataclass
class Diagnosis:
    """The rules' whole answer for one snapshot."""

    plan: Plan
    findings: list[Finding]

    @property
    def worst(self) -> Severity:
        worst: Severity = "ok"
        for f in self.findings:
            if SEVERITY_ORDER[f.severity] > SEVERITY_ORDER[worst]:
                worst = f.severity
        return worst

    @property
    def has_errors(self) -> bool:
        return self.worst == "error"
