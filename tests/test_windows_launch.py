"""The Windows launch rules without a Windows machine: which launcher and accelerate config a
plan gets, and how `python -m xtrain.run` reads accelerate's single-process launch. The real
processes run in test_launch_modes.py (accelerate-windows-config, under a libuv-less torch)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import load_machine

from xtrain.config.schema import TrainConfig
from xtrain.launch import accelerate_config as ac
from xtrain.machine.facts import Facts
from xtrain.machine.probes import torch_stack
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Overrides
from xtrain.planning.resolve import resolve
from xtrain.planning.rules import make_plan


def test_this_torch_has_no_libuv_free_torchrun() -> None:
    """torch 2.13's torchrun stores do not pass use_libuv (pytorch#148283): the probe says so."""
    import torch  # noqa: F401  (the probe looks only at an imported torch)

    assert torch_stack.probe_torchrun_libuv(Facts()) == {"torchrun_honours_use_libuv": False}


def test_windows_uses_spawn_and_a_single_process_accelerate_config() -> None:
    plan = make_plan(load_machine("windows-2x4090"))
    assert plan.launcher == "spawn" and plan.backend == "gloo" and plan.cpu_staged_allreduce
    cfg = ac.config_for(plan)
    assert cfg["distributed_type"] == "NO" and cfg["num_processes"] == 2
    assert "accelerate launch -m xtrain.run" in ac.next_commands(plan, None)


@pytest.mark.parametrize("field", ["torchrun_honours_use_libuv", "libuv_ok"])
def test_a_torch_whose_torchrun_works_on_windows_switches_back(field: str) -> None:
    facts = dataclasses.replace(load_machine("windows-2x4090"), **{field: True})
    plan = make_plan(facts)
    assert plan.launcher == "accelerate" and plan.env.get("USE_LIBUV") == "0"
    assert ac.config_for(plan)["distributed_type"] == "MULTI_GPU"


def test_forcing_windows_on_linux_keeps_the_windows_path() -> None:
    facts = dataclasses.replace(load_machine("linux-2x3090"), libuv_ok=True, torchrun_honours_use_libuv=True)
    assert make_plan(facts, Overrides(platform="windows")).launcher == "spawn"


SIMPLE_LAUNCH = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_single_launch_is_read_from_accelerate_simple_launcher_env() -> None:
    def single(env: dict[str, str]) -> bool:
        return LaunchContext.from_env(env).single_launch

    assert single(SIMPLE_LAUNCH)
    assert not single({**SIMPLE_LAUNCH, "WORLD_SIZE": "2"})  # torchrun: already a rank
    assert not single({"ACCELERATE_MIXED_PRECISION": "fp16"})  # num_processes 1
    assert not single({"MASTER_ADDR": "127.0.0.1"})  # not accelerate


def test_single_launch_starts_one_worker_per_gpu_accelerate_left_visible() -> None:
    cpu = load_machine("linux-cpu")
    visible = LaunchContext.from_env({**SIMPLE_LAUNCH, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert resolve(TrainConfig(), platform="windows", facts=cpu, context=visible).plan.num_processes == 2
    # without CUDA_VISIBLE_DEVICES: the plan's count for this machine (one process on a CPU)
    alone = LaunchContext.from_env(SIMPLE_LAUNCH)
    assert resolve(TrainConfig(), platform="windows", facts=cpu, context=alone).plan.num_processes == 1


# -- the Job Object that ends every worker with the launcher (Windows; checked here by its layout
# and its calls, against winnt.h and the Win32 documentation) -------------------------------------
def test_job_limit_struct_has_the_x64_layout_of_winnt_h() -> None:
    import ctypes

    from xtrain.runtime.lifetime import job_limit_struct

    ext = job_limit_struct(ctypes.c_uint32)  # DWORD is 32 bits on Windows (a C long is 8 bytes here)
    basic = ext._fields_[0][1]
    assert ctypes.sizeof(basic) == 64 and ctypes.sizeof(ext) == 144  # x64 sizes
    assert basic.LimitFlags.offset == 16 and basic.Affinity.offset == 48
    assert ext.IoInfo.offset == 64 and ext.ProcessMemoryLimit.offset == 112


class FakeKernel32:
    """Records the calls a kill-on-close job makes; ``fail`` names a call that returns 0."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.calls = fail, []

    def _call(self, name: str, *args, result=1):
        self.calls.append((name, args))
        return 0 if name == self.fail else result

    def CreateJobObjectW(self, attributes, name):
        return self._call("CreateJobObjectW", attributes, name, result=77)

    def SetInformationJobObject(self, job, info_class, info, size):
        flags = info._obj.BasicLimitInformation.LimitFlags  # byref(...)._obj: the struct itself
        return self._call("SetInformationJobObject", job, info_class, flags, size)

    def GetCurrentProcess(self):
        return -1  # Win32's pseudo-handle of the calling process

    def AssignProcessToJobObject(self, job, process):
        return self._call("AssignProcessToJobObject", job, process)

    def CloseHandle(self, handle):
        return self._call("CloseHandle", handle)


def test_kill_on_close_job_holds_this_process(monkeypatch) -> None:
    import ctypes

    from xtrain.runtime import lifetime

    monkeypatch.setattr(lifetime, "_job_handle", None)
    k32 = FakeKernel32()
    assert lifetime._windows_kill_on_close_job(k32, lifetime.job_limit_struct(ctypes.c_uint32))
    size = ctypes.sizeof(lifetime.job_limit_struct(ctypes.c_uint32))
    assert k32.calls == [
        ("CreateJobObjectW", (None, None)),
        ("SetInformationJobObject", (77, 9, 0x2000, size)),  # JobObjectExtendedLimitInformation
        ("AssignProcessToJobObject", (77, -1)),
    ]
    assert lifetime._job_handle == 77  # kept open: closing it would kill the job at once
    assert lifetime._windows_kill_on_close_job(FakeKernel32(fail="CreateJobObjectW"))  # once only


@pytest.mark.parametrize("fail", ["CreateJobObjectW", "SetInformationJobObject", "AssignProcessToJobObject"])
def test_a_refused_job_is_closed_and_reported(monkeypatch, fail: str) -> None:
    import ctypes

    from xtrain.runtime import lifetime

    monkeypatch.setattr(lifetime, "_job_handle", None)
    k32 = FakeKernel32(fail=fail)
    assert not lifetime._windows_kill_on_close_job(k32, lifetime.job_limit_struct(ctypes.c_uint32))
    assert lifetime._job_handle is None
    closed = [c for c in k32.calls if c[0] == "CloseHandle"]
    assert closed == ([] if fail == "CreateJobObjectW" else [("CloseHandle", (77,))])
