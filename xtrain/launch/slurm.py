"""An sbatch script that trains on several SLURM nodes with ``accelerate launch`` and c10d.

One ``srun`` task per node runs ``accelerate launch`` with the node's rank (``$SLURM_NODEID``);
the first node of the allocation hosts the c10d rendezvous. The accelerate config written next
to the script holds everything else (processes, precision, FSDP/DeepSpeed), so the script stays
short and the config stays loadable by accelerate's own loader.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from xtrain.errors import XtrainError
from xtrain.machine.facts import GPU, Facts

# Where the script puts the first node's host name; the accelerate config leaves the IP out.
MAIN_ADDR_VAR = "MAIN_ADDR"
MAIN_PORT_VAR = "MAIN_PORT"
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM[:SS]
_WORD = re.compile(r"^[A-Za-z0-9_.,@+-]+$")


@dataclass
class SlurmJob:
    """What the sbatch script needs to know."""

    nodes: int
    gpus_per_node: int
    config_path: str  # the accelerate config (absolute: sbatch runs a copy of the script)
    port: int = 29500
    time: str | None = None  # e.g. 04:00:00 or 1-00:00:00
    partition: str | None = None
    job_name: str = "xtrain"
    env: dict[str, str] = field(default_factory=dict)  # the plan's environment variables
    module: str = "xtrain.run"

    def check(self) -> None:
        if self.nodes < 1:
            raise XtrainError(f"--nodes must be at least 1, got {self.nodes}", "e.g. --nodes 2")
        if self.gpus_per_node < 1:
            raise XtrainError(
                f"--gpus-per-node must be at least 1, got {self.gpus_per_node}", "e.g. --gpus-per-node 8"
            )
        if self.time is not None and not _TIME.match(self.time):
            raise XtrainError(
                f"--time {self.time!r} is not a SLURM time", "e.g. --time 04:00:00 or 1-00:00:00"
            )
        for flag, value in (("--partition", self.partition), ("--job-name", self.job_name)):
            if value is not None and not _WORD.match(value):
                raise XtrainError(f"{flag} {value!r} has spaces or odd characters", f"e.g. {flag} gpu")


def cluster_facts(gpus_per_node: int, port: int = 29500) -> Facts:
    """A generic Linux GPU node, for planning when no snapshot of a compute node is given.

    The GPU model is unknown (no compute capability), so the rules pick fp16, which every CUDA
    GPU runs; ``--precision bf16`` suits A100/H100 nodes, or pass ``--facts`` saved on a node.
    """
    return Facts(
        os_kind="linux",
        hostname="compute-node",
        hostname_resolves=True,
        cpu_count=8 * gpus_per_node,
        torch_version="unknown",
        torch_cuda="unknown",
        cuda_available=True,
        nccl_available=True,
        gloo_available=True,
        nvidia_smi=True,
        gpus=[GPU(index=i, name="GPU of the cluster", memory_mib=0) for i in range(gpus_per_node)],
        port=port,
    )


def _double_quoted(text: str) -> str:
    """``text`` for bash inside the single-quoted ``bash -c '...'`` payload."""
    if "'" in text:
        raise XtrainError(f"the path {text!r} has a single quote", "choose a path without quotes")
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def launch_args(job: SlurmJob) -> list[str]:
    """The ``accelerate launch`` command for one node, one option per item; bash on the node
    expands the ``$VARS`` (the node's rank is ``$SLURM_NODEID``)."""
    args = [
        "accelerate launch",
        "--config_file " + _double_quoted(job.config_path),
        '--num_machines "$SLURM_NNODES"',
        f'--num_processes "$((SLURM_NNODES * {job.gpus_per_node}))"',
        '--machine_rank "$SLURM_NODEID"',
        f'--main_process_ip "${MAIN_ADDR_VAR}"',
        f'--main_process_port "${MAIN_PORT_VAR}"',
    ]
    if job.nodes > 1:
        args.append("--rdzv_backend c10d")
    return [*args, f"-m {job.module}"]


def sbatch_script(job: SlurmJob) -> str:
    """The whole sbatch script. Extra arguments to ``sbatch SCRIPT ...`` go to ``xtrain.run``."""
    job.check()
    sb = [
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={job.gpus_per_node}",
        "#SBATCH --output=%x-%j.out",
    ]
    if job.time:
        sb.append(f"#SBATCH --time={job.time}")
    if job.partition:
        sb.append(f"#SBATCH --partition={job.partition}")
    env_lines = [f"export {k}={shlex.quote(v)}" for k, v in job.env.items()]
    inner = " \\\n    ".join(launch_args(job)) + ' "$@"'
    lines = [
        "#!/bin/bash",
        "# Written by `xtrain configure --slurm`. Submit: sbatch THIS_FILE [--config train.yaml ...]",
        f"# One task per node runs `accelerate launch` with {job.gpus_per_node} process(es) per node;",
        "# the first node hosts the rendezvous. Arguments after the file name go to xtrain.run.",
        *sb,
        "",
        "set -euo pipefail",
        "# sbatch passes on the submitting shell's environment; activate yours here if it does not:",
        "# source .venv/bin/activate",
        f'export {MAIN_ADDR_VAR}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export {MAIN_PORT_VAR}={job.port}",
        *env_lines,
        "",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'exec " + inner + '\' xtrain-node "$@"',
        "",
    ]
    return "\n".join(lines)
