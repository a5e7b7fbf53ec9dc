"""The CPU other work keeps busy: what a CPU run's compute threads would do there."""

from __future__ import annotations

from xtrain.machine.facts import Facts
from xtrain.planning.plan import Finding, Plan
from xtrain.planning.threads import MEASURED, THREADS_ENV
from xtrain.shell import set_env


def loaded(facts: Facts) -> bool:
    """Other work keeps at least half the cores (and at least one) busy."""
    return facts.load_average is not None and facts.load_average >= max(1.0, facts.cpu_count / 2)


def check_cpu_busy(facts: Facts, plan: Plan) -> list[Finding]:
    """A CPU plan on a loaded CPU: the threads the plan gives each process instead of torch's a
    core, and the line that does the same for the user's own torch programs. Nothing when
    OMP_NUM_THREADS is set already (the user chose) or the plan trains on a GPU."""
    if plan.device != "cpu" or plan.cpu_threads is None or not loaded(facts):
        return []
    threads = plan.cpu_threads
    return [
        Finding(
            "cpu-busy",
            "warn",
            f"the CPU is busy: load average {facts.load_average:.1f} on {facts.cpu_count} cores. torch "
            "starts a compute thread a core, and threads beyond the free cores wait on each other "
            f"({MEASURED}): xtrain's CPU runs here take {threads} a process; set {THREADS_ENV} for "
            "your own torch programs.",
            set_env(plan.shell, THREADS_ENV, str(threads)),
        )
    ]
