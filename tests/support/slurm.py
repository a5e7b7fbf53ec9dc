"""A one-node SLURM for tests: munged, slurmctld and slurmd on this host with a temporary
slurm.conf, or the SLURM already running here (``sinfo`` answers).

Debian's slurm-wlm 22.05 and munge (``apt-get install slurm-wlm munge``) run it as root in a few
seconds. Where the programs are missing (or not root), ``start`` skips the test with one reason.
Every daemon it starts is stopped by its own pid; the jobs it submitted are cancelled first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PROGRAMS = ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo", "slurmctld", "slurmd", "munged")
UP_TIMEOUT_S = 30

CONF = """\
ClusterName=xtraintest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock,cred_expire=10
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# (cred_expire=10: a requeued job may start again 10 s later, not Slurm's default 120 s.)


@dataclass
class Slurm:
    env: dict[str, str]  # SLURM_CONF for the clients (empty: the running SLURM's own)
    node: str  # this host: jobs run here (their files are in this host's temporary folder)
    jobs: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout
        )

    def submit(self, script: Path, args: list[str], env: dict[str, str], cwd: Path) -> str:
        """``sbatch SCRIPT ARGS`` from ``cwd`` with ``env`` (sbatch passes it on to the job)."""
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--nodelist={self.node}", str(script), *args],
            env={**env, **self.env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def state(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", job).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job: str, timeout_s: float, until: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
             "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")) -> dict[str, str]:  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state(job)
            if state.get("JobState") in until:
                return state
            time.sleep(1)
        raise AssertionError(f"job {job} still {self.state(job).get('JobState')} after {timeout_s} s")


def _missing() -> str | None:
    gone = [p for p in PROGRAMS if shutil.which(p) is None]
    if gone:
        return f"SLURM is not installed here (no {', '.join(gone)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a private SLURM needs root (slurmd runs the jobs)"
    return None


def _running(node: str) -> bool:
    """A SLURM answers here and this host is one of its nodes."""
    if shutil.which("sinfo") is None or "SLURM_CONF" in os.environ:
        return False
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and node in proc.stdout.split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_resources() -> tuple[int, int]:
    """CPUs and memory (MiB) as slurmd itself counts them."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    cpus = int(re.search(r"CPUs=(\d+)", out).group(1))  # type: ignore[union-attr]
    memory = int(re.search(r"RealMemory=(\d+)", out).group(1))  # type: ignore[union-attr]
    return cpus, memory


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(10):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    # a daemon of a throw-away SLURM: its state need not be saved
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextmanager
def start() -> Iterator[Slurm]:
    """A SLURM to submit to: the running one, else a private one-node SLURM in a new folder under
    the system's temporary folder (munged's socket path must stay short)."""
    node = socket.gethostname().split(".")[0]
    if _running(node):
        slurm = Slurm(env={}, node=node)
        yield slurm
        for job in slurm.jobs:
            slurm.run("scancel", job)
        return
    why = _missing()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="xtrain-slurm-"))
    root.chmod(0o755)  # munged wants its socket's folder reachable
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cpus, memory = _node_resources()
    conf = root / "slurm.conf"
    conf.write_text(CONF.format(root=root, node=node, cpus=cpus, memory=memory,
                                ctld_port=_free_port(), d_port=_free_port()))  # fmt: skip
    env = {"SLURM_CONF": str(conf)}
    slurm = Slurm(env=env, node=node)
    daemons = [
        ["munged", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
         f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed"],
        ["slurmctld", "-i"],
        ["slurmd"],
    ]  # fmt: skip
    try:
        for argv in daemons:
            proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, f"{argv[0]} did not start: {proc.stderr}"
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "idle" not in slurm.run("sinfo", "-h", "-o", "%T").stdout:
            assert time.monotonic() < deadline, (root / "slurmctld.log").read_text()[-2000:]
            time.sleep(0.5)
        yield slurm
    finally:
        for job in slurm.jobs:
            slurm.run("scancel", job)
        for name in ("slurmd", "slurmctld", "munged"):
            _stop(root / f"{name}.pid")
        shutil.rmtree(root, ignore_errors=True)
