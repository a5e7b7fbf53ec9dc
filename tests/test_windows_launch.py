"""The Windows launch rules without a Windows machine: which launcher and accelerate config a
plan gets, and how `python -m xtrain.run` reads accelerate's single-process launch. The real
processes run in test_launch_modes.py (accelerate-windows-config, under a libuv-less torch)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import load_machine

from xtrain.launch import accelerate_config as ac
from xtrain.machine.facts import Facts
from xtrain.machine.probes import torch_stack
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan
from xtrain.run import accelerate_single_launch, single_launch_processes
from xtrain.train.config.schema import TrainConfig


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


def test_single_launch_is_read_from_accelerate_simple_launcher_env() -> None:
    simple = {"ACCELERATE_MIXED_PRECISION": "fp16", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert accelerate_single_launch(simple)
    assert not accelerate_single_launch({**simple, "WORLD_SIZE": "2"})  # torchrun: already a rank
    assert not accelerate_single_launch({"ACCELERATE_MIXED_PRECISION": "fp16"})  # num_processes 1
    assert not accelerate_single_launch({"MASTER_ADDR": "127.0.0.1"})  # not accelerate


def test_single_launch_starts_one_worker_per_gpu_accelerate_left_visible(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert single_launch_processes(TrainConfig(), "windows") == 2
