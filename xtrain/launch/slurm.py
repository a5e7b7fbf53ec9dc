"""An sbatch script that trains on SLURM nodes with ``accelerate launch`` and c10d.

One ``srun`` task per node runs ``accelerate launch`` with the node's rank (``$SLURM_NODEID``);
the first node of the allocation hosts the c10d rendezvous on a port of the job's own. The
accelerate config written next to the script holds everything else (processes, precision,
FSDP/DeepSpeed), so the script stays short and the config stays loadable by accelerate's own
loader. The resources asked for (CPUs, memory, GPUs) follow the plan (``cpus_per_task``,
``mem_per_node``).

Before the time limit (``--signal=B:USR1@N``, to the batch shell only) the script asks every
process of the training step to stop (``scancel --signal=TERM``): each rank saves a checkpoint at
its next step and exits (``xtrain.runtime.signals``), then the script requeues the job, whose next run
resumes from that checkpoint (``run.resume: auto``). USR1 is not sent to the step itself: torchrun's
agent (``accelerate launch``) has no handler for it, so it would die at once and take the workers
with it (``PR_SET_PDEATHSIG``) before they save.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from xtrain.errors import XtrainError
from xtrain.machine.facts import GPU, Facts
from xtrain.planning.plan import Plan

# Where the script puts the first node's host name; the accelerate config leaves the IP out.
MAIN_ADDR_VAR = "MAIN_ADDR"
MAIN_PORT_VAR = "MAIN_PORT"
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM[:SS]
_WORD = re.compile(r"^[A-Za-z0-9_.,@+-]+$")
_MEM = re.compile(r"^[1-9]\d*[KMGT]?$")  # sbatch's --mem: megabytes, or a K/M/G/T suffix
# The rendezvous port: 20000 + job id mod 10000 (below Linux's ephemeral ports, 32768 on), the
# next free one on the first node. Two jobs sharing a node get different ports.
PORT_BASE, PORT_SPAN = 20000, 10000
# Host memory per process when no --mem is given: a GPU rank loads its copy of the weights in host
# memory first (a 7B model in bf16: 14 GiB) and feeds its loader workers; a CPU process trains in it.
MEM_PER_GPU_PROCESS_GIB = 32
MEM_PER_CPU_PROCESS_GIB = 8
MEM_SHARE = 0.9  # of a node's memory (from --facts), at most: the OS keeps the rest
# Seconds before the time limit that the stop starts: a step to finish and a checkpoint to write.
STOP_BEFORE_S = 300


@dataclass
class SlurmJob:
    """What the sbatch script needs to know."""

    nodes: int
    processes_per_node: int
    config_path: str  # the accelerate config (absolute: sbatch runs a copy of the script)
    gpus_per_node: int = 0  # 0: a CPU job, which asks for no GPU
    cpus_per_task: int = 1  # one task per node: every rank of the node and its loader workers
    mem: str = f"{MEM_PER_CPU_PROCESS_GIB}G"  # per node, sbatch's --mem syntax
    port: int | None = None  # None: derived from $SLURM_JOB_ID (a fixed --port otherwise)
    time: str | None = None  # e.g. 04:00:00 or 1-00:00:00
    partition: str | None = None
    job_name: str = "xtrain"
    env: dict[str, str] = field(default_factory=dict)  # the plan's environment variables
    module: str = "xtrain.run"
    stop_before_s: int = STOP_BEFORE_S

    def check(self) -> None:
        if self.nodes < 1:
            raise XtrainError(f"--nodes must be at least 1, got {self.nodes}", "e.g. --nodes 2")
        if self.processes_per_node < 1:
            raise XtrainError(
                f"--gpus-per-node must be at least 1, got {self.processes_per_node}", "e.g. --gpus-per-node 8"
            )
        if self.time is not None and not _TIME.match(self.time):
            raise XtrainError(
                f"--time {self.time!r} is not a SLURM time", "e.g. --time 04:00:00 or 1-00:00:00"
            )
        if not _MEM.match(self.mem):
            raise XtrainError(
                f"--mem {self.mem!r} is not a SLURM memory size", "e.g. --mem 64G or --mem 16000"
            )
        for flag, value in (("--partition", self.partition), ("--job-name", self.job_name)):
            if value is not None and not _WORD.match(value):
                raise XtrainError(f"{flag} {value!r} has spaces or odd characters", f"e.g. {flag} gpu")


def cpus_per_task(plan: Plan, cpu_count: int) -> int:
    """CPUs for the one task of a node: on GPUs, each rank's main process and its DataLoader
    workers (the plan's larger count, media or tokens: the script does not know the task), at
    most the node's cores; on CPUs the ranks compute with every core the plan counted
    (``OMP_NUM_THREADS`` = cores / processes)."""
    if plan.device != "cuda":
        return max(1, cpu_count)
    per_rank = 1 + max(plan.dataloader_workers, plan.media_workers)
    return max(1, min(plan.num_processes * per_rank, cpu_count))


def mem_per_node(plan: Plan, memory_mib: int | None) -> str:
    """Host memory for a node's ranks (``--mem``): a default per process (``MEM_PER_*``), at most
    ``MEM_SHARE`` of the node's memory when a snapshot of a node says how much it has."""
    per = MEM_PER_GPU_PROCESS_GIB if plan.device == "cuda" else MEM_PER_CPU_PROCESS_GIB
    want_mib = plan.num_processes * per * 1024
    if memory_mib and want_mib > memory_mib * MEM_SHARE:
        return f"{int(memory_mib * MEM_SHARE)}M"
    return f"{plan.num_processes * per}G"


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
        f'--num_processes "$((SLURM_NNODES * {job.processes_per_node}))"',
        '--machine_rank "$SLURM_NODEID"',
        f'--main_process_ip "${MAIN_ADDR_VAR}"',
        f'--main_process_port "${MAIN_PORT_VAR}"',
    ]
    if job.nodes > 1:
        args.append("--rdzv_backend c10d")
    return [*args, f"-m {job.module}"]


def _directives(job: SlurmJob) -> list[str]:
    sb = [
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        sb.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    sb += [
        f"#SBATCH --cpus-per-task={job.cpus_per_task}",
        f"#SBATCH --mem={job.mem}",
        "#SBATCH --output=%x-%j.out",
        "#SBATCH --open-mode=append",  # a requeued run adds to the same log
        f"#SBATCH --signal=B:USR1@{job.stop_before_s}",
        "#SBATCH --requeue",
    ]
    if job.time:
        sb.append(f"#SBATCH --time={job.time}")
    if job.partition:
        sb.append(f"#SBATCH --partition={job.partition}")
    return sb


def _port_lines(job: SlurmJob) -> list[str]:
    if job.port is not None:
        return [f"export {MAIN_PORT_VAR}={job.port}"]
    return [
        "# the rendezvous port: this job's own (from its id), past any port in use on this node,",
        "# the first one, where the rendezvous listens",
        f"{MAIN_PORT_VAR}=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))",
        f'while (exec 3<>"/dev/tcp/127.0.0.1/${MAIN_PORT_VAR}") 2>/dev/null; do '
        f"{MAIN_PORT_VAR}=$(({MAIN_PORT_VAR} + 1)); done",
        f"export {MAIN_PORT_VAR}",
    ]


# The batch shell's part of a stop before the time limit: Slurm sends it USR1 (--signal=B:...);
# it asks every process of the training step for a stop (SIGTERM: each rank saves at its next step
# and exits), waits for the step, and requeues the job when the step did not finish on its own.
# `scontrol requeue` ends this script at once, so it comes last.
_STOP_AND_REQUEUE = """\
stop_requested=0
stop_before_time_limit() {
    stop_requested=1
    echo "xtrain: time limit near: the ranks save a checkpoint at their next step; then requeue" >&2
    scancel --signal=TERM "$SLURM_JOB_ID" || true
}
trap stop_before_time_limit USR1
"""

# The ranks' own handlers catch SIGTERM (xtrain.runtime.signals). accelerate's one-process launcher has
# none: it would die at once and leave its worker alone; ignored here (the disposition survives
# exec), it waits for the worker and passes on its exit code. torchrun's agent installs its own
# handler (accelerate offers no --signals_to_handle): it sends SIGTERM on and kills the ranks still
# running 30 s later, so a stop checkpoint must be written within 30 s of the signal.
_IGNORE_TERM = 'trap "" TERM; '

_WAIT_AND_REQUEUE = """\
step=$!
while :; do
    status=0
    wait "$step" || status=$?
    kill -0 "$step" 2>/dev/null || break  # else USR1 interrupted the wait: wait again
done
if [ "$stop_requested" = 1 ] && [ "$status" != 0 ]; then
    echo "xtrain: requeued: the next run resumes from the checkpoint (run.resume: auto)" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


def sbatch_script(job: SlurmJob) -> str:
    """The whole sbatch script. Extra arguments to ``sbatch SCRIPT ...`` go to ``xtrain.run``."""
    job.check()
    env_lines = [f"export {k}={shlex.quote(v)}" for k, v in job.env.items()]
    inner = " \\\n    ".join(launch_args(job)) + ' "$@"'
    on = f"{job.gpus_per_node} GPU(s)" if job.gpus_per_node else "CPUs"
    lines = [
        "#!/bin/bash",
        "# Written by `xtrain configure --slurm`. Submit: sbatch THIS_FILE [--config train.yaml ...]",
        f"# One task per node runs `accelerate launch` with {job.processes_per_node} process(es) on {on};",
        "# the first node hosts the rendezvous. Arguments after the file name go to xtrain.run.",
        f"# {job.stop_before_s} s before the time limit the ranks save a checkpoint and stop, and the job",
        "# goes back into the queue: its next run resumes from that checkpoint (run.resume: auto).",
        *_directives(job),
        "",
        "set -euo pipefail",
        "# sbatch passes on the submitting shell's environment; activate yours here if it does not:",
        "# source .venv/bin/activate",
        f'export {MAIN_ADDR_VAR}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        *_port_lines(job),
        *env_lines,
        "",
        _STOP_AND_REQUEUE,
        "# on each node: a SIGTERM stops the ranks at their next step (they save a checkpoint); the",
        "# launcher ignores it and waits for them (torchrun's agent: 30 s at most)",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '"
        + _IGNORE_TERM
        + "exec "
        + inner
        + '\' xtrain-node "$@" &',
        _WAIT_AND_REQUEUE,
    ]
    return "\n".join(lines)
