"""How many compute threads each CPU training process runs: a pure rule of the machine's facts.

torch starts one compute thread a core (OpenMP). On a CPU other work already keeps busy, those
threads wait on each other at every operation's barrier: a one-process run on 2 cores at a load
of 4-6 was 10-25x slower with torch's default than with one thread, with the same numbers
(FIELD_NOTES; docs/performance.md#cpu-threads). So the plan gives a CPU run the cores the load
leaves free (at least one a process), cores / processes on an idle machine with several
processes, and torch's own default to one process on an idle one. ``run.cpu_threads`` decides
instead, and an ``OMP_NUM_THREADS`` already set is left to torch (it reads it)."""

from __future__ import annotations

from xtrain.machine.facts import Facts

THREADS_ENV = "OMP_NUM_THREADS"
MEASURED = "10-25x slower measured on a busy 2-core machine"


def free_cores(facts: Facts) -> int | None:
    """The cores the 1-minute load average leaves free, rounded (None: the load is not known:
    Windows, a snapshot without it)."""
    if facts.load_average is None:
        return None
    return max(0, round(facts.cpu_count - facts.load_average))


def busy(facts: Facts) -> bool:
    """Other work keeps at least one core busy."""
    free = free_cores(facts)
    return free is not None and free < facts.cpu_count


def cpu_threads(
    facts: Facts, device: str, processes: int, asked: int | None = None
) -> tuple[int | None, str | None]:
    """(the compute threads each process sets, None: torch's default; why, None: nothing to say:
    a GPU computes) for ``processes`` processes on this machine training on ``device``;
    ``asked``: ``run.cpu_threads``."""
    if asked is not None:
        return asked, f"{asked} compute thread(s) per process: run.cpu_threads={asked}"
    given = facts.launch_env.get(THREADS_ENV)
    if given is not None:
        return None, f"{THREADS_ENV}={given} set in the environment (torch reads it)"
    if device != "cpu":
        return None, None
    share = max(1, facts.cpu_count // processes)
    free = free_cores(facts)
    if free is not None and free < facts.cpu_count:
        threads = max(1, min(share, free // processes))
        return threads, (
            f"{threads} compute thread(s) per process: the load average {facts.load_average:.1f} leaves "
            f"{free} of {facts.cpu_count} cores free (more threads would wait on each other: {MEASURED})"
        )
    if processes > 1:
        return share, f"{share} compute thread(s) per process: cores / processes"
    known = "the CPU is idle" if free is not None else "the load is not known here"
    return None, f"torch's default, a thread a core ({known})"
