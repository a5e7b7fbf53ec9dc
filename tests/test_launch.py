"""xtrain.launch.launcher: both launchers for real, with 2 gloo CPU processes, plus the env they set."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from xtrain.errors import XtrainError
from xtrain.launch.accelerate_launcher import accelerate_args, accelerate_launch
from xtrain.launch.env import PLAN_ENV, plan_env
from xtrain.launch.launcher import launch, runs_here
from xtrain.launch.rendezvous import free_port
from xtrain.launch.spawn import spawn
from xtrain.launch.worker_errors import WorkerFailed
from xtrain.machine.facts import GPU, Facts
from xtrain.planning.plan import Overrides, Plan
from xtrain.planning.rules import make_plan

TESTS = Path(__file__).parent


def cpu_facts() -> Facts:
    return Facts(
        os_kind="linux", hostname="box", torch_version="2.13.0+cpu", gloo_available=True, cpu_count=2
    )


def cpu_plan(platform: str = "linux", processes: int = 2) -> Plan:
    return make_plan(cpu_facts(), Overrides(num_processes=processes, platform=platform))


def gpu_plan(gpus: str) -> Plan:
    facts = Facts(
        os_kind="linux",
        hostname="box",
        torch_version="2.13.0+cu126",
        torch_cuda="12.6",
        cuda_available=True,
        nccl_available=True,
        gloo_available=True,
        gpus=[GPU(i, "NVIDIA A100-SXM4-80GB", 81920, (8, 0)) for i in range(4)],
    )
    return make_plan(facts, Overrides(gpu_ids=[int(x) for x in gpus.split(",")]))


@pytest.fixture
def worker_env(monkeypatch, tmp_path):
    """Make tests/launch_worker.py importable in every child, whatever starts it; keep a user's
    accelerate default config out of the test."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("XTRAIN_TEST_MARK", "inherited")
    import accelerate.commands.launch as acc_launch

    monkeypatch.setattr(acc_launch, "default_config_file", str(tmp_path / "no-default-config.yaml"))
    return tmp_path


def read_ranks(folder: Path, n: int) -> list[dict]:
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(n)]


# -- fast: what each launcher is given ----------------------------------------------------------
def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_plan_env_carries_plan_and_windows_libuv():
    plan = cpu_plan("windows")
    env = plan_env(plan)
    assert env["USE_LIBUV"] == "0"
    assert Plan.from_dict(json.loads(env[PLAN_ENV])) == plan
    assert "CUDA_VISIBLE_DEVICES" not in env  # no GPUs in a CPU plan


def test_plan_env_selects_gpus_through_existing_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert plan_env(gpu_plan("1,3"))["CUDA_VISIBLE_DEVICES"] == "1,3"
    # torch's index 1 is physical GPU 6 when the user already hid some
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7,5")
    assert plan_env(gpu_plan("1,3"))["CUDA_VISIBLE_DEVICES"] == "6,5"


def test_accelerate_args_parse_with_accelerates_parser():
    from accelerate.commands.launch import launch_command_parser

    plan = cpu_plan()
    argv = accelerate_args("xtrain.run", ["--config", "c.yaml"], plan, port=12345)
    args = launch_command_parser().parse_args(argv)
    assert args.multi_gpu and not args.cpu
    assert args.num_processes == 2
    assert args.main_process_ip == "127.0.0.1" and args.main_process_port == 12345
    assert args.module and args.training_script == "xtrain.run"
    assert args.training_script_args == ["--config", "c.yaml"]
    assert args.mixed_precision == "no"


def test_accelerate_args_one_process_uses_the_simple_launcher():
    from accelerate.commands.launch import launch_command_parser

    args = launch_command_parser().parse_args(accelerate_args("m", [], cpu_plan(processes=1), port=1))
    assert not args.multi_gpu and args.num_processes == 1


@pytest.mark.slow
def test_accelerate_launch_one_process(worker_env):
    plan = cpu_plan("linux", processes=1)
    assert accelerate_launch(["launch_worker", "single", str(worker_env)], plan) == 0
    env = json.loads((worker_env / "single.json").read_text())["env"]
    assert Plan.from_dict(json.loads(env["XTRAIN_PLAN"])) == plan


# -- slow: real processes ---------------------------------------------------------------------------
@pytest.mark.slow
def test_spawn_allreduce_and_env(worker_env):
    import launch_worker

    plan = cpu_plan("windows")  # forced Windows plan: spawn + USE_LIBUV=0
    assert plan.launcher == "spawn"
    port = free_port()
    before = dict(os.environ)
    spawn(launch_worker.allreduce, (str(worker_env),), plan, port=port)
    assert dict(os.environ) == before  # the parent's environment is restored
    ranks = read_ranks(worker_env, 2)
    for r, got in enumerate(ranks):
        assert got["sum"] == 3.0 and got["world"] == 2
        env = got["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
        assert env["USE_LIBUV"] == "0"
        assert env["XTRAIN_TEST_MARK"] == "inherited"
        assert Plan.from_dict(json.loads(env["XTRAIN_PLAN"])) == plan


@pytest.mark.slow
def test_spawn_failure_names_the_rank(worker_env):
    import launch_worker

    with pytest.raises(WorkerFailed) as info:
        spawn(launch_worker.allreduce, (str(worker_env), 1), cpu_plan("windows"), port=free_port())
    e = info.value
    assert isinstance(e, XtrainError)
    assert e.rank == 1
    assert "rank 1" in e.one_line() and "boom on rank 1" in e.one_line()
    assert "Traceback" in e.details  # the worker's traceback is kept for whoever wants it
    assert "\n" not in e.one_line()


@pytest.mark.slow
def test_accelerate_launch_allreduce_and_env(worker_env):
    plan = cpu_plan("linux")
    assert plan.launcher == "accelerate"
    port = free_port()
    code = accelerate_launch(["launch_worker", str(worker_env)], plan, port=port)
    assert code == 0
    for r, got in enumerate(read_ranks(worker_env, 2)):
        assert got["sum"] == 3.0 and got["world"] == 2
        env = got["env"]
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
        assert Plan.from_dict(json.loads(env["XTRAIN_PLAN"])) == plan


@pytest.mark.slow
def test_accelerate_launch_failure(worker_env):
    plan = cpu_plan("linux")
    assert accelerate_launch(["launch_worker", str(worker_env), "1"], plan, port=free_port()) != 0
    with pytest.raises(WorkerFailed) as info:
        launch("launch_worker", [str(worker_env), "1"], plan, port=free_port())
    assert info.value.rank == 1 and "rank 1" in info.value.one_line()


@pytest.mark.slow
def test_launch_picks_the_plans_launcher(worker_env):
    # Windows plan -> spawn (USE_LIBUV=0 reaches the workers); module target, as training uses it.
    launch("launch_worker", [str(worker_env)], cpu_plan("windows"), port=free_port())
    assert [r["env"]["USE_LIBUV"] for r in read_ranks(worker_env, 2)] == ["0", "0"]


def test_launch_single_process_runs_here_with_plan_env(worker_env, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # launch_worker, as -m finds it
    monkeypatch.delenv("USE_LIBUV", raising=False)
    for key in ("LOCAL_WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    plan = cpu_plan("windows", processes=1)
    launch("launch_worker", ["single", str(worker_env)], plan)
    env = json.loads((worker_env / "single.json").read_text())["env"]
    assert env["USE_LIBUV"] == "0" and env["RANK"] is None
    assert Plan.from_dict(json.loads(env["XTRAIN_PLAN"])) == plan
    assert "USE_LIBUV" not in os.environ and "XTRAIN_PLAN" not in os.environ  # restored after
    assert "LOCAL_WORLD_SIZE" not in os.environ and "MASTER_PORT" not in os.environ  # the worker's own too


def test_one_process_runs_here_unless_it_needs_another_gpu_selection():
    cpu = cpu_plan("linux", processes=1)
    assert runs_here(cpu) and not runs_here(cpu_plan("linux", processes=2))
    first = dataclasses.replace(cpu, device="cuda", cpu=False, gpu_ids=[0])
    assert runs_here(first)
    # --gpus 1: CUDA may be initialised here by the probe; a child gets CUDA_VISIBLE_DEVICES=1 first
    assert not runs_here(dataclasses.replace(first, gpu_ids=[1]))


# -- the smoke test on top of the launcher ----------------------------------------------------------
def test_bus_bandwidth_is_nccl_tests_formula():
    from xtrain.launch.smoke import bus_bandwidth

    assert bus_bandwidth(2_000_000_000, 1.0, 2) == (2.0, 2.0)  # 2(n-1)/n = 1 for two ranks
    assert bus_bandwidth(2_000_000_000, 1.0, 4) == (2.0, 3.0)  # 2*3/4 = 1.5


@pytest.mark.slow
def test_smoke_reports_a_broken_backend_without_raising():
    import dataclasses

    from xtrain.launch.smoke import run_smoke

    # A plan asking this CPU-only torch for NCCL: every rank fails in init_process_group.
    plan = dataclasses.replace(cpu_plan("windows"), backend="nccl")
    result = run_smoke(plan, size_mib=1, iters=2, port=free_port())
    assert not result.ok and not result.allreduce_ok
    assert "NCCL" in result.error and "rank" in result.error
