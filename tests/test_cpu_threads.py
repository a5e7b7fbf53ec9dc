"""A CPU run's compute threads (issue 60), decided by the rules from the machine's facts (saved
snapshots: tests/fixtures/machines/linux-cpu-busy.json is this 2-core machine at a load of 5), with
the reason; an OMP_NUM_THREADS the user set or run.cpu_threads wins; doctor's finding on a loaded
CPU gives the line in the user's shell; the run applies the plan's count and gives it back."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import load_machine

from xtrain.errors import XtrainError
from xtrain.planning.plan import Overrides
from xtrain.planning.resolve import diagnose
from xtrain.planning.rules import make_plan
from xtrain.planning.threads import cpu_threads


def _busy_finding(diagnosis):
    return next((f for f in diagnosis.findings if f.code == "cpu-busy"), None)


def test_a_busy_cpu_gets_one_thread_and_doctor_says_so_in_the_user_s_shell() -> None:
    busy = load_machine("linux-cpu-busy")
    assert busy.load_average == 5.14 and busy.cpu_count == 2
    d = diagnose(busy)
    assert d.plan.cpu_threads == 1 and d.plan.env["OMP_NUM_THREADS"] == "1"
    assert "the load average 5.1 leaves 0 of 2 cores free" in d.plan.reasons["threads"]
    found = _busy_finding(d)
    assert found is not None and found.severity == "warn" and found.fix == "export OMP_NUM_THREADS=1"
    assert "load average 5.1 on 2 cores" in found.message and "10-25x slower" in found.message
    windows = _busy_finding(diagnose(busy, Overrides(platform="windows")))
    assert windows is not None and windows.fix == '$env:OMP_NUM_THREADS = "1"'


def test_an_idle_or_unknown_load_keeps_torch_s_default_for_one_process() -> None:
    idle = load_machine("linux-cpu")  # a snapshot without the load (Windows has none): as before
    assert idle.load_average is None
    for facts in (idle, replace(idle, load_average=0.3)):
        d = diagnose(facts)
        assert d.plan.cpu_threads is None and "OMP_NUM_THREADS" not in d.plan.env
        assert _busy_finding(d) is None
    assert "the CPU is idle" in make_plan(replace(idle, load_average=0.3)).reasons["threads"]
    two = make_plan(idle, Overrides(num_processes=2))  # several processes: cores / processes
    assert two.cpu_threads == 1 and two.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    "cores, load, processes, expected",
    [(2, 1.4, 1, 1), (16, 2.3, 1, 14), (16, 6.0, 2, 5), (16, 30.0, 4, 1), (8, 0.2, 2, 4), (8, 0.2, 1, None)],
)
def test_the_threads_are_the_cores_the_load_leaves_free(cores, load, processes, expected) -> None:
    facts = replace(load_machine("linux-cpu"), cpu_count=cores, load_average=load)
    assert cpu_threads(facts, "cpu", processes)[0] == expected


def test_the_user_s_choice_wins() -> None:
    busy = load_machine("linux-cpu-busy")
    mine = replace(busy, launch_env={"OMP_NUM_THREADS": "2"})
    d = diagnose(mine)  # set in the shell: torch reads it, nothing said over it
    assert d.plan.cpu_threads is None and "OMP_NUM_THREADS" not in d.plan.env and _busy_finding(d) is None
    assert d.plan.reasons["threads"] == "OMP_NUM_THREADS=2 set in the environment (torch reads it)"
    asked = make_plan(busy, Overrides(cpu_threads=2))  # run.cpu_threads
    assert asked.cpu_threads == 2 and asked.env["OMP_NUM_THREADS"] == "2"
    gpu = make_plan(load_machine("linux-2x3090"), Overrides(cpu_threads=3))
    assert gpu.cpu_threads == 3 and make_plan(load_machine("linux-2x3090")).cpu_threads is None
    with pytest.raises(XtrainError, match="run.cpu_threads must be at least 1"):
        make_plan(busy, Overrides(cpu_threads=0))


def test_the_config_key_and_the_probe() -> None:
    from xtrain.machine.probes.system import probe_load
    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config

    cfg = load_config(None, ["run.cpu_threads=3"])
    assert resolve(cfg, facts=load_machine("linux-cpu-busy")).plan.cpu_threads == 3
    with pytest.raises(XtrainError, match="run.cpu_threads"):
        load_config(None, ["run.cpu_threads=0"])
    found = probe_load(load_machine("linux-cpu"))  # this machine's, where the OS keeps one
    assert found == {} or found["load_average"] >= 0
