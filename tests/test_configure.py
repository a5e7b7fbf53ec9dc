"""`xtrain configure` and xtrain/launch/accelerate_config.py.

Unit tests of the pure parts, then the command end to end as a subprocess (HF_HOME always
points into a tmp dir: the real ~/.cache is never touched), and real launches that prove the
written configs start the right processes: 2 CPU processes forming one gloo group, and two
"machines" (two launches on this host) meeting through a c10d rendezvous on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import yaml
from support import warm
from test_presets import LINUX_2X3090, LINUX_8XA100, LINUX_CPU, WINDOWS_2X4090, cuda_machine

from xtrain.errors import XtrainError
from xtrain.launch import accelerate_config as ac
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan

REPO = Path(__file__).resolve().parents[1]

# Written by the launched processes: world size and rank as accelerate sees them, and the
# result of an all-reduce, which only comes out right when all ranks form one group.
TINY_SCRIPT = """
import json, os, sys
import torch
from accelerate import Accelerator

acc = Accelerator(cpu=True)
total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), reduction="sum").item()
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as f:
    json.dump({"num_processes": acc.num_processes, "process_index": acc.process_index,
               "sum": total, "distributed_type": acc.distributed_type.value}, f)
acc.wait_for_everyone()
torch.distributed.destroy_process_group()
"""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def env_for(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HOME"] = str(tmp_path / "hf")  # never the real ~/.cache
    env.pop("XDG_CACHE_HOME", None)
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def xtrain(tmp_path: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, "-m", "xtrain", "configure", *args],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def save_facts(tmp_path: Path, facts, name: str = "facts.json") -> Path:
    path = tmp_path / name
    path.write_text(facts.to_json(), encoding="utf-8")
    return path


def load(path: Path):
    from accelerate.commands.config.config_args import ClusterConfig

    return ClusterConfig.from_yaml_file(yaml_file=str(path))


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:"), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_facts():
    return replace(LINUX_CPU, hostname=socket.gethostname(), hostname_resolves=True)


# ---------------------------------------------------------------------------------------------
# config_for (pure)
# ---------------------------------------------------------------------------------------------
def test_cluster_keys_are_accelerates_fields():
    import dataclasses

    from accelerate.commands.config.config_args import ClusterConfig

    assert set(ac.CLUSTER_KEYS) == {f.name for f in dataclasses.fields(ClusterConfig)}


def test_one_cpu_process_is_not_distributed():
    cfg = ac.config_for(make_plan(LINUX_CPU))
    assert cfg["distributed_type"] == "NO" and cfg["num_processes"] == 1 and cfg["use_cpu"] is True
    assert "main_process_ip" not in cfg


def test_cpu_processes_use_the_torchrun_path():
    # MULTI_CPU would go to accelerate's simple launcher, which starts one process.
    cfg = ac.config_for(make_plan(LINUX_CPU, Overrides(num_processes=2)))
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["use_cpu"] is True
    assert cfg["num_processes"] == 2 and cfg["gpu_ids"] == "all"
    assert (cfg["main_process_ip"], cfg["main_process_port"]) == ("127.0.0.1", 29500)
    assert cfg["rdzv_backend"] == "static" and cfg["mixed_precision"] == "no"


def test_gpu_subsets():
    four = cuda_machine("linux", "NVIDIA A100-SXM4-80GB", 4, (8, 0), 81920)
    assert ac.config_for(make_plan(four, Overrides(gpu_ids=[0, 1])))["gpu_ids"] == "all"
    cfg = ac.config_for(make_plan(four, Overrides(gpu_ids=[1, 3])))
    assert cfg["gpu_ids"] == "1,3" and cfg["num_processes"] == 2
    one = ac.config_for(make_plan(four, Overrides(gpu_ids=[2])))
    assert one["distributed_type"] == "NO" and one["gpu_ids"] == "2"


def test_gpu_ids_follow_an_existing_cuda_visible_devices():
    assert ac.physical_gpu_ids("1", "2,3") == "3"
    assert ac.physical_gpu_ids("0,1", "GPU-aa, GPU-bb") == "GPU-aa,GPU-bb"
    assert ac.physical_gpu_ids("all", "2,3") == "all"
    assert ac.physical_gpu_ids("1,3", None) == "1,3"


def test_multi_node_counts_processes_over_all_machines():
    plan = make_plan(
        LINUX_2X3090, Overrides(num_machines=3, machine_rank=2, main_address="10.0.0.5", port=29555)
    )
    cfg = ac.config_for(plan)
    assert cfg["num_processes"] == 6 and cfg["num_machines"] == 3 and cfg["machine_rank"] == 2
    assert cfg["rdzv_backend"] == "c10d" and cfg["same_network"] is False
    assert (cfg["main_process_ip"], cfg["main_process_port"]) == ("10.0.0.5", 29555)


def test_windows_plan_gets_a_single_process_config():
    """No torchrun on Windows (its rendezvous needs libuv): accelerate starts one process and
    xtrain.run spawns the 2 workers (test_launch_modes.py runs it under a libuv-less torch)."""
    cfg = ac.config_for(make_plan(WINDOWS_2X4090))
    assert cfg["distributed_type"] == "NO" and cfg["num_processes"] == 2
    assert cfg["mixed_precision"] == "fp16" and cfg["main_process_ip"] == "127.0.0.1"


def test_fsdp_and_deepspeed_need_gpus_and_exclude_each_other():
    with pytest.raises(XtrainError, match="needs CUDA"):
        ac.config_for(make_plan(LINUX_CPU, Overrides(num_processes=2)), fsdp=True)
    with pytest.raises(XtrainError, match="exclude"):
        ac.config_for(make_plan(LINUX_8XA100), fsdp=True, deepspeed="zero2")
    with pytest.raises(XtrainError, match="unknown DeepSpeed"):
        ac.config_for(make_plan(LINUX_8XA100), deepspeed="zero4")


def test_dynamo_backend():
    cfg = ac.config_for(make_plan(LINUX_8XA100), dynamo="inductor")
    assert cfg["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    with pytest.raises(XtrainError):
        ac.config_for(make_plan(LINUX_8XA100), dynamo="warp-speed")


def _launch_args(path: Path):
    """accelerate launch's own argument processing of a config file (no processes started)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "xtrain.run"])
    return _validate_launch_command(args)


def test_fsdp_config_reaches_accelerates_plugin(tmp_path):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils import launch as launch_utils

    path = tmp_path / "fsdp.yaml"
    ac.write_config(ac.config_for(make_plan(LINUX_8XA100), fsdp=True), path)
    assert load(path).distributed_type.value == "FSDP"
    args, _, _ = _launch_args(path)
    assert args.use_fsdp and args.num_processes == 8
    with mock.patch.object(launch_utils, "is_port_in_use", lambda port: False):
        env = launch_utils.prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    fsdp_env = {k: v for k, v in env.items() if k.startswith("FSDP_")}
    with mock.patch.dict(os.environ, fsdp_env):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_config_reaches_accelerates_plugin(tmp_path, stage):
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils import launch as launch_utils

    path = tmp_path / f"{stage}.yaml"
    ac.write_config(ac.config_for(make_plan(LINUX_8XA100), deepspeed=stage), path)
    assert load(path).distributed_type.value == "DEEPSPEED"
    args, defaults, _ = _launch_args(path)
    assert args.use_deepspeed
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    with mock.patch.object(launch_utils, "is_port_in_use", lambda port: False):
        _, env = launch_utils.prepare_deepspeed_cmd_env(args)
    # accelerate would export this and override the loop's accumulation: it must stay unset
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env
    ds_env = {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}
    with mock.patch.dict(os.environ, ds_env):
        plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == (2 if stage == "zero2" else 3)
    assert plugin.gradient_accumulation_steps == "auto"


def test_multi_node_deepspeed_uses_torchrun_on_each_node():
    plan = make_plan(LINUX_8XA100, Overrides(num_machines=2, main_address="10.0.0.5"))
    assert (
        ac.config_for(plan, deepspeed="zero3")["deepspeed_config"]["deepspeed_multinode_launcher"]
        == "standard"
    )


# ---------------------------------------------------------------------------------------------
# default location, writing, backups
# ---------------------------------------------------------------------------------------------
def test_default_config_path_matches_accelerate(tmp_path):
    """Same formula as accelerate's config_args.py, for HF_HOME, XDG_CACHE_HOME and neither."""
    code = (
        "import importlib, json, os\n"
        "import accelerate.commands.config.config_args as ca\n"
        "from xtrain.launch.accelerate_config import default_config_path\n"
        "out = []\n"
        "for env in ({'HF_HOME': '/x/hf'}, {'XDG_CACHE_HOME': '/x/xdg'}, {}):\n"
        "    for k in ('HF_HOME', 'XDG_CACHE_HOME'): os.environ.pop(k, None)\n"
        "    os.environ.update(env)\n"
        "    importlib.reload(ca)\n"
        "    out.append([ca.default_config_file, str(default_config_path())])\n"
        "print(json.dumps(out))\n"
    )
    proc = warm.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    pairs = json.loads(proc.stdout)
    assert pairs[0][1] == "/x/hf/accelerate/default_config.yaml"
    assert pairs[1][1] == "/x/xdg/huggingface/accelerate/default_config.yaml"
    for theirs, ours in pairs:
        assert theirs == ours


def test_write_refuses_existing_and_backs_up_with_force(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("old: content\n")
    cfg = ac.config_for(make_plan(LINUX_CPU))
    with pytest.raises(XtrainError, match="exists; use --force"):
        ac.write_config(cfg, path)
    assert path.read_text() == "old: content\n"
    result = ac.write_config(cfg, path, force=True)
    assert result.backup_path is not None and result.backup_path.name.startswith("cfg.bak-")
    assert result.backup_path.suffix == ".yaml"
    assert result.backup_path.read_text() == "old: content\n"
    assert yaml.safe_load(path.read_text()) == cfg
    # a second forced write in the same second gets its own backup name
    again = ac.write_config(cfg, path, force=True)
    assert again.backup_path != result.backup_path and again.backup_path.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_write_to_unwritable_place_is_a_user_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(XtrainError, match="cannot create"):
        ac.write_config({"distributed_type": "NO"}, blocker / "sub" / "cfg.yaml")
    with pytest.raises(XtrainError, match="is a directory"):
        ac.write_config({"distributed_type": "NO"}, tmp_path)


def test_validate_rejects_what_accelerate_rejects(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: NO\nxtrain_setting: 1\n")
    with pytest.raises(XtrainError, match="does not load with accelerate"):
        ac.validate(bad)


# ---------------------------------------------------------------------------------------------
# next commands
# ---------------------------------------------------------------------------------------------
def test_next_commands_bash(tmp_path):
    plan = make_plan(cuda_machine("wsl2", "NVIDIA GeForce RTX 4090", 2, (8, 9), 24564))
    with mock.patch.dict(os.environ, {"HF_HOME": str(tmp_path / "hf")}):
        at_default = ac.next_commands(plan, ac.default_config_path())
        elsewhere = ac.next_commands(plan, tmp_path / "my config.yaml")
    assert "export NCCL_P2P_DISABLE=1" in at_default
    assert "accelerate launch -m xtrain.run" in at_default
    assert f"accelerate launch --config_file '{tmp_path}/my config.yaml' -m xtrain.run" in elsewhere


def test_next_commands_powershell_headline_command():
    plan = make_plan(WINDOWS_2X4090)
    lines = ac.next_commands(plan, None)
    assert lines[0] == '$env:USE_LIBUV = "0"'
    assert "accelerate launch -m xtrain.run" in lines  # works: the config runs no torchrun
    assert "xtrain train YOUR.yaml --processes 2   # your own job" in lines
    assert not any("export " in line for line in lines)


# ---------------------------------------------------------------------------------------------
# the command, end to end
# ---------------------------------------------------------------------------------------------
def test_configure_output_writes_a_loadable_file(tmp_path):
    proc = xtrain(tmp_path, "--output", "x.yaml")  # probes this machine for real
    assert proc.returncode == 0, proc.stderr
    cfg = load(tmp_path / "x.yaml")
    assert cfg.num_processes >= 1 and cfg.compute_environment.value == "LOCAL_MACHINE"
    assert "accelerate launch --config_file x.yaml -m xtrain.run" in proc.stdout
    assert not (tmp_path / "hf").exists()  # --output: the default location is left alone


def test_configure_default_location_under_hf_home(tmp_path):
    facts = save_facts(tmp_path, cpu_facts())
    proc = xtrain(tmp_path, "--facts", str(facts), "--processes", "2")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    cfg = load(path)
    assert cfg.num_processes == 2 and cfg.distributed_type.value == "MULTI_GPU" and cfg.use_cpu
    assert "accelerate launch -m xtrain.run" in proc.stdout  # default file: no --config_file


def test_dry_run_writes_nothing(tmp_path):
    facts = save_facts(tmp_path, cpu_facts())
    proc = xtrain(tmp_path, "--facts", str(facts), "--processes", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "distributed_type: MULTI_GPU" in proc.stdout and "dry run" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["facts.json"]


def test_existing_file_refused_then_backed_up_with_force(tmp_path):
    facts = save_facts(tmp_path, cpu_facts())
    target = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    target.parent.mkdir(parents=True)
    target.write_text("# the user's own config\ndistributed_type: 'NO'\n")

    refused = xtrain(tmp_path, "--facts", str(facts), "--processes", "2")
    assert_one_line_error(refused, "exists; use --force")
    assert target.read_text() == "# the user's own config\ndistributed_type: 'NO'\n"
    assert len(list(target.parent.iterdir())) == 1

    forced = xtrain(tmp_path, "--facts", str(facts), "--processes", "2", "--force")
    assert forced.returncode == 0, forced.stderr
    backups = [p for p in target.parent.iterdir() if ".bak-" in p.name]
    assert len(backups) == 1 and backups[0].name.startswith("default_config.bak-")
    assert backups[0].read_text() == "# the user's own config\ndistributed_type: 'NO'\n"
    assert str(backups[0]) in forced.stdout
    assert load(target).num_processes == 2


def test_overrides_appear_in_the_file(tmp_path):
    four_3090 = cuda_machine("linux", "NVIDIA GeForce RTX 3090", 4, (8, 6), 24576)
    facts = save_facts(tmp_path, four_3090)
    args = ["--facts", str(facts), "--gpus", "1,3", "--precision", "bf16", "--port", "29601", "-o", "o.yaml"]
    proc = xtrain(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    cfg = load(tmp_path / "o.yaml")
    assert (cfg.gpu_ids, cfg.num_processes, cfg.mixed_precision) == ("1,3", 2, "bf16")
    assert cfg.main_process_port == 29601 and cfg.main_process_ip == "127.0.0.1"


def test_gpus_with_cuda_visible_devices_set(tmp_path):
    two = cuda_machine("linux", "NVIDIA A100-SXM4-80GB", 2, (8, 0), 81920)
    two = replace(two, cuda_visible_devices="2,3")
    proc = xtrain(tmp_path, "--facts", str(save_facts(tmp_path, two)), "--gpus", "1", "-o", "g.yaml")
    assert proc.returncode == 0, proc.stderr
    assert load(tmp_path / "g.yaml").gpu_ids == "3"  # torch's GPU 1 is the card listed as 3


def test_multi_node_flags(tmp_path):
    facts = save_facts(tmp_path, LINUX_2X3090)
    args = ["--facts", str(facts), "--machines", "2", "--machine-rank", "1"]
    proc = xtrain(tmp_path, *args, "--main-address", "10.1.2.3", "--port", "29650", "-o", "r1.yaml")
    assert proc.returncode == 0, proc.stderr
    cfg = load(tmp_path / "r1.yaml")
    assert (cfg.num_machines, cfg.machine_rank, cfg.num_processes) == (2, 1, 4)
    assert (cfg.main_process_ip, cfg.main_process_port, cfg.rdzv_backend) == ("10.1.2.3", 29650, "c10d")
    assert "--machine-rank R --main-address 10.1.2.3 --port 29650" in proc.stdout


@pytest.mark.parametrize("flag", ["--fsdp", "--deepspeed=zero2", "--deepspeed=zero3"])
def test_fsdp_and_deepspeed_flags(tmp_path, flag):
    facts = save_facts(tmp_path, LINUX_8XA100)
    proc = xtrain(tmp_path, "--facts", str(facts), flag, "-o", "s.yaml")
    assert proc.returncode == 0, proc.stderr
    cfg = load(tmp_path / "s.yaml")
    if flag == "--fsdp":
        assert cfg.distributed_type.value == "FSDP" and cfg.fsdp_config["fsdp_version"] == 2
    else:
        assert cfg.distributed_type.value == "DEEPSPEED"
        assert cfg.deepspeed_config["zero_stage"] == int(flag[-1])


def test_deepspeed_on_windows_gets_a_note(tmp_path):
    facts = save_facts(tmp_path, WINDOWS_2X4090)
    proc = xtrain(tmp_path, "--facts", str(facts), "--deepspeed", "zero2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "DeepSpeed does not train on native Windows" in proc.stdout


def test_windows_next_commands_in_powershell(tmp_path):
    facts = save_facts(tmp_path, WINDOWS_2X4090)
    proc = xtrain(tmp_path, "--facts", str(facts), "-o", "w.yaml")
    assert proc.returncode == 0, proc.stderr
    assert '$env:USE_LIBUV = "0"' in proc.stdout
    assert "accelerate launch --config_file w.yaml -m xtrain.run" in proc.stdout
    written = load(tmp_path / "w.yaml")
    assert written.num_processes == 2 and written.distributed_type.value == "NO"


BAD_INPUTS = {
    "processes-0": (["--processes", "0"], "--processes must be at least 1"),
    "precision": (["--precision", "fp8"], "--precision 'fp8' is unknown"),
    "gpu-7": (["--gpus", "7"], "GPU 7"),
    "gpus-text": (["--gpus", "a,b"], "not a list of GPU ids"),
    "port": (["--port", "70000"], "not a TCP port"),
    "deepspeed": (["--deepspeed", "zero4"], "--deepspeed"),
    "fsdp+deepspeed": (["--fsdp", "--deepspeed", "zero2"], "exclude each other"),
    "rank": (["--machines", "2", "--machine-rank", "2", "--main-address", "10.0.0.1"], "--machine-rank 2"),
    "no-main-address": (["--machines", "2"], "--main-address"),
    "slurm-without-nodes": (["--slurm", "job.sbatch"], "--slurm needs --nodes"),
    "nodes-without-slurm": (["--nodes", "2"], "need --slurm"),
    "unwritable": (["--output", "blocker/cfg.yaml"], "cannot create"),
    "facts-missing": (["--facts", "nowhere.json"], "cannot read facts file"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, name):
    args, words = BAD_INPUTS[name]
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    facts = save_facts(tmp_path, cuda_machine("linux", "NVIDIA GeForce RTX 3090", 2, (8, 6), 24576))
    if "--facts" not in args:
        args = ["--facts", str(facts), *args]
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = xtrain(tmp_path, *args)
    assert_one_line_error(proc, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "blocker").read_text() == "a file where a folder is expected"


def test_cli_import_stays_light():
    code = "import sys, xtrain.cli, xtrain.commands.configure; print(sorted(m for m in ('torch', 'accelerate', 'transformers') if m in sys.modules))"  # noqa: E501
    proc = warm.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# the written configs really start processes
# ---------------------------------------------------------------------------------------------
def run_tiny(tmp_path: Path, config: Path, out: Path, **popen) -> subprocess.Popen:
    script = tmp_path / "tiny.py"
    script.write_text(TINY_SCRIPT)
    env = env_for(tmp_path)
    env.pop("ACCELERATE_USE_CPU", None)
    return warm.popen(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            str(script),
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def read_ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


@pytest.mark.slow
def test_written_cpu_config_starts_two_processes_in_one_group(tmp_path):
    port = free_port()
    proc = xtrain(tmp_path, "--processes", "2", "--port", str(port), "--output", "two.yaml")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    out.mkdir()
    launch = run_tiny(tmp_path, tmp_path / "two.yaml", out)
    log, _ = launch.communicate(timeout=240)
    assert launch.returncode == 0, log
    ranks = read_ranks(out)
    assert [r["process_index"] for r in ranks] == [0, 1]
    assert all(r["num_processes"] == 2 and r["sum"] == 3.0 for r in ranks)
    assert all(r["distributed_type"] == "MULTI_CPU" for r in ranks)


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


@pytest.mark.slow
def test_two_machines_meet_through_c10d_on_this_host(tmp_path):
    """Two `accelerate launch` runs with the rank-0 and rank-1 configs: one group of 2."""
    facts = save_facts(tmp_path, cpu_facts())
    port = free_port()
    for rank in (0, 1):
        args = ["--facts", str(facts), "--machines", "2", "--machine-rank", str(rank)]
        proc = xtrain(
            tmp_path, *args, "--main-address", "127.0.0.1", "--port", str(port), "-o", f"r{rank}.yaml"
        )
        assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    out.mkdir()
    # rank 0 first: it hosts the rendezvous store (on a real cluster only it has that address)
    main = run_tiny(tmp_path, tmp_path / "r0.yaml", out, start_new_session=True)
    other = None
    try:
        wait_for_port(port, main)
        other = run_tiny(tmp_path, tmp_path / "r1.yaml", out, start_new_session=True)
        log1, _ = other.communicate(timeout=240)
        log0, _ = main.communicate(timeout=240)
    finally:
        for p in (main, other):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert main.returncode == 0, log0
    assert other.returncode == 0, log1
    ranks = read_ranks(out)
    assert [r["process_index"] for r in ranks] == [0, 1]
    assert all(r["num_processes"] == 2 and r["sum"] == 3.0 for r in ranks)


# ---------------------------------------------------------------------------------------------
# --slurm: the sbatch script
# ---------------------------------------------------------------------------------------------
def node_argv(script_text: str, rank: int, nnodes: int, extra: list[str]) -> list[str]:
    """What `accelerate launch` receives on node ``rank``: the script's payload expanded by bash."""
    payload = node_command(script_text).replace("exec accelerate launch", "printf '%s\\n'", 1)
    env = {"PATH": os.environ["PATH"], "SLURM_NNODES": str(nnodes), "SLURM_NODEID": str(rank)}
    env.update({"MAIN_ADDR": "node001", "MAIN_PORT": "29777"})
    proc = warm.run(["bash", "-c", payload, "xtrain-node", *extra], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_slurm_script_and_its_launch_line_parse(tmp_path):
    from accelerate.commands.launch import launch_command_parser

    args = ["--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "4", "--time", "02:00:00"]
    proc = xtrain(tmp_path, *args, "--partition", "gpu", "--job-name", "lora", "--port", "29777")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sbatch"
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and os.access(script, os.X_OK)
    assert warm.run(["bash", "-n", str(script)]).returncode == 0
    assert sbatch_directives(text) == {
        "job-name": "lora",
        "nodes": "2",
        "ntasks-per-node": "1",
        "gpus-per-node": "4",
        # a generic node (8 cores a GPU): each rank and its 4 loader workers; 32G a GPU process
        "cpus-per-task": "20",
        "mem": "128G",
        "output": "%x-%j.out",
        "open-mode": "append",
        "signal": "B:USR1@300",  # to the batch shell, which stops the ranks and requeues
        "requeue": "",
        "time": "02:00:00",
        "partition": "gpu",
    }
    assert "export MAIN_PORT=29777" in text  # --port: fixed; else derived from the job id
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    # the accelerate config next to it: the whole cluster, the address left to the script
    cfg = load(tmp_path / "job.accelerate.yaml")
    assert (cfg.num_machines, cfg.num_processes, cfg.rdzv_backend) == (2, 8, "c10d")
    assert cfg.main_process_ip is None and cfg.mixed_precision == "fp16" and not cfg.use_cpu
    for rank in (0, 1):
        argv = node_argv(text, rank, 2, ["--config", "train.yaml"])
        parsed = launch_command_parser().parse_args(argv)
        assert Path(parsed.config_file) == tmp_path / "job.accelerate.yaml"
        assert (parsed.num_machines, parsed.num_processes, parsed.machine_rank) == (2, 8, rank)
        assert (parsed.main_process_ip, parsed.main_process_port) == ("node001", 29777)
        assert parsed.rdzv_backend == "c10d" and parsed.module
        assert (parsed.training_script, parsed.training_script_args) == (
            "xtrain.run",
            ["--config", "train.yaml"],
        )


def test_slurm_resources_and_port_follow_the_plan(tmp_path, monkeypatch, capsys):
    from xtrain.cli import main
    from xtrain.launch import slurm as sl

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))

    def directives(name: str, *args: str) -> dict[str, str]:
        files = ["--slurm", f"{name}.sbatch", "--output", f"{name}.yaml"]
        code = main(["configure", *files, "--nodes", "1", *args])
        assert code == 0, capsys.readouterr().err
        return sbatch_directives((tmp_path / f"{name}.sbatch").read_text())

    # a CPU node's snapshot: no GPU asked for, every core for the process, 8G (a CPU process)
    cpu = save_facts(tmp_path, replace(cpu_facts(), cpu_count=6, memory_mib=65536))
    got = directives("cpu", "--facts", str(cpu))
    assert "gpus-per-node" not in got and (got["cpus-per-task"], got["mem"]) == ("6", "8G")
    # a node snapshot with less memory than the default asks for (2 x 32G): 90% of it
    small = save_facts(tmp_path, replace(LINUX_2X3090, memory_mib=32768), "small.json")
    assert directives("small", "--facts", str(small))["mem"] == f"{int(32768 * sl.MEM_SHARE)}M"
    assert directives("mem", "--gpus-per-node", "2", "--mem", "200G")["mem"] == "200G"
    # the port: the job's own, past one in use on the first node
    text = (tmp_path / "cpu.sbatch").read_text()
    script = "\n".join(line for line in text.splitlines() if "MAIN_PORT" in line and "--main" not in line)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 20000 + 4242))
    busy.listen()
    with busy:
        for job_id, port in (("4243", 24243), ("14242", 24243)):  # 14242 % 10000 = 4242: taken
            env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id}
            argv = ["bash", "-c", script + '\necho "$MAIN_PORT"']
            run = warm.run(argv, env=env, capture_output=True, text=True)
            assert run.stdout.split() == [str(port)], run.stderr


def test_slurm_existing_files_are_kept(tmp_path):
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n# mine\n")
    args = ["--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1"]
    refused = xtrain(tmp_path, *args)
    assert_one_line_error(refused, "exists; use --force")
    assert not (tmp_path / "job.accelerate.yaml").exists()  # nothing half-written
    forced = xtrain(tmp_path, *args, "--force")
    assert forced.returncode == 0, forced.stderr
    backups = list(tmp_path.glob("job.bak-*.sbatch"))
    assert len(backups) == 1 and backups[0].read_text() == "#!/bin/bash\n# mine\n"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--nodes", "0", "--gpus-per-node", "1"], "--nodes must be at least 1"),
        (["--nodes", "2"], "--gpus-per-node"),
        (["--nodes", "2", "--gpus-per-node", "1", "--time", "two hours"], "not a SLURM time"),
        (["--nodes", "2", "--gpus-per-node", "1", "--partition", "a b"], "--partition"),
        (["--nodes", "2", "--gpus-per-node", "1", "--machines", "2"], "--slurm sets machines"),
        (["--nodes", "1", "--gpus-per-node", "1", "--mem", "lots"], "not a SLURM memory size"),
        (["--nodes", "1", "--gpus-per-node", "1", "--facts", "CPU_NODE"], "has no GPU"),
    ],
)
def test_slurm_bad_input(tmp_path, args, words):
    if "CPU_NODE" in args:
        args[args.index("CPU_NODE")] = str(save_facts(tmp_path, cpu_facts()))
    before = sorted(tmp_path.iterdir())
    proc = xtrain(tmp_path, "--slurm", "job.sbatch", *args)
    assert_one_line_error(proc, words)
    assert sorted(tmp_path.iterdir()) == before


FAKE_SRUN = """#!/bin/bash
# srun stand-in: run the command once per "node" on this host, node 0 first (it hosts the
# rendezvous store, as the first node of a real allocation does).
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i "$@" &
    pids+=($!)
    if [ "$i" -eq 0 ]; then
        for _ in $(seq 600); do
            (exec 3<>"/dev/tcp/127.0.0.1/$MAIN_PORT") 2>/dev/null && break
            kill -0 "${pids[0]}" 2>/dev/null || break
            sleep 0.2
        done
    fi
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
"""


@pytest.mark.slow
def test_slurm_script_runs_two_nodes_on_this_host(tmp_path):
    """The whole sbatch script, with srun/scontrol stand-ins: 2 "nodes" x 1 CPU process."""
    facts = save_facts(tmp_path, cpu_facts())
    port = free_port()
    args = ["--facts", str(facts), "--slurm", "job.sbatch", "--nodes", "2", "--processes", "1"]
    proc = xtrain(tmp_path, *args, "--port", str(port))
    assert proc.returncode == 0, proc.stderr
    tiny = tmp_path / "tiny.py"
    tiny.write_text(TINY_SCRIPT)
    text = (tmp_path / "job.sbatch").read_text()
    assert text.count("-m xtrain.run") == 1
    (tmp_path / "job.sbatch").write_text(text.replace("-m xtrain.run", str(tiny)))  # the payload only
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\necho 127.0.0.2\n")
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    env = env_for(tmp_path)
    env.pop("ACCELERATE_USE_CPU", None)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    env.update({"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[001-002]"})
    out = tmp_path / "out"
    out.mkdir()
    run = warm.run(
        ["bash", str(tmp_path / "job.sbatch"), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ranks = read_ranks(out)
    assert [r["process_index"] for r in ranks] == [0, 1]
    assert all(r["num_processes"] == 2 and r["sum"] == 3.0 for r in ranks)


# ---------------------------------------------------------------------------------------------
# docs/configure.md stays true
# ---------------------------------------------------------------------------------------------
def doc_blocks(lang: str) -> list[list[str]]:
    text = (REPO / "docs" / "configure.md").read_text(encoding="utf-8")
    return [block.strip().splitlines() for block in re.findall(rf"```{lang}\n(.*?)```", text, re.S)]


def test_doc_next_commands_are_what_configure_prints(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    wsl2 = cuda_machine("wsl2", "NVIDIA GeForce RTX 4090", 2, (8, 9), 24564)
    bash = ac.next_commands(make_plan(wsl2), ac.default_config_path())
    powershell = ac.next_commands(make_plan(WINDOWS_2X4090), ac.default_config_path())
    assert bash in doc_blocks("bash")
    assert powershell in doc_blocks("powershell")


def test_doc_configure_commands_run(tmp_path, monkeypatch, capsys):
    """Every `xtrain configure` line in the docs runs (as --dry-run, planned for an 8-GPU node)."""
    import shlex

    from xtrain.cli import main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    facts = save_facts(tmp_path, LINUX_8XA100, "node.json")
    lines = [line for block in doc_blocks("bash") for line in block if line.startswith("xtrain configure")]
    assert len(lines) >= 8
    for line in lines:
        argv = shlex.split(line, comments=True)[1:]
        if "--facts" not in argv and "--slurm" not in argv:
            argv += ["--facts", str(facts)]
        code = main([*argv, "--dry-run"])
        out = capsys.readouterr()
        assert code == 0, (line, out.err)
        assert "Next:" in out.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.json"]


# -- reading a generated SLURM script ----------------------------------------------------------
def sbatch_directives(text: str) -> dict[str, str]:
    """The ``#SBATCH --key=value`` lines of a script, as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?\s*$", line)
        if m:
            out[m.group(1)] = m.group(2) or ""
    return out


def node_command(text: str) -> str:
    """The command each node runs (the ``bash -c '...'`` payload of the srun line)."""
    m = re.search(r"bash -c '(.*?)' xtrain-node", text, re.S)
    if not m:
        raise ValueError("no srun launch line in this script")
    return m.group(1)
