"""accelerate_configs/*.yaml: every preset loads with accelerate's own loader, and each equals
what ``config_for`` writes for the machine it is meant for (so presets and the rules agree)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from xtrain.launch import accelerate_config as ac
from xtrain.machine.facts import GPU, Facts
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan

PRESETS_DIR = Path(__file__).resolve().parents[1] / "accelerate_configs"
PRESET_FILES = sorted(PRESETS_DIR.glob("*.yaml"))


def cuda_machine(os_kind: str, name: str, n: int, cc: tuple[int, int], mib: int) -> Facts:
    return Facts(
        os_kind=os_kind,
        hostname="host",
        hostname_resolves=True,
        cpu_count=32,
        torch_version="2.13.0",
        torch_cuda="12.6",
        cuda_available=True,
        nccl_available=os_kind != "windows",
        gloo_available=True,
        libuv_ok=os_kind != "windows",
        nvidia_smi=True,
        gpus=[GPU(i, name, mib, cc) for i in range(n)],
    )


WINDOWS_2X4090 = cuda_machine("windows", "NVIDIA GeForce RTX 4090", 2, (8, 9), 24564)
WSL2_2X4090 = cuda_machine("wsl2", "NVIDIA GeForce RTX 4090", 2, (8, 9), 24564)
LINUX_8XA100 = cuda_machine("linux", "NVIDIA A100-SXM4-80GB", 8, (8, 0), 81920)
LINUX_1XH100 = cuda_machine("linux", "NVIDIA H100 80GB HBM3", 1, (9, 0), 81559)
LINUX_2X3090 = cuda_machine("linux", "NVIDIA GeForce RTX 3090", 2, (8, 6), 24576)
LINUX_CPU = Facts(os_kind="linux", hostname="host", cpu_count=2, torch_version="2.13.0", gloo_available=True)
TWO_MACHINES = {"num_machines": 2, "main_address": "192.168.1.10"}

# preset name -> (machine, overrides, config_for options)
EXPECTED = {
    "windows-2gpu": (WINDOWS_2X4090, Overrides(), {}),
    "wsl2-2gpu": (WSL2_2X4090, Overrides(), {}),
    "linux-ngpu": (LINUX_8XA100, Overrides(), {}),
    "single-gpu": (LINUX_1XH100, Overrides(), {}),
    "cpu-multiprocess": (LINUX_CPU, Overrides(num_processes=2), {}),
    "two-machines-rank0": (LINUX_2X3090, Overrides(machine_rank=0, **TWO_MACHINES), {}),
    "two-machines-rank1": (LINUX_2X3090, Overrides(machine_rank=1, **TWO_MACHINES), {}),
    "fsdp-ngpu": (LINUX_8XA100, Overrides(), {"fsdp": True}),
    "deepspeed-zero2": (LINUX_8XA100, Overrides(), {"deepspeed": "zero2"}),
    "deepspeed-zero3": (LINUX_8XA100, Overrides(), {"deepspeed": "zero3"}),
}


def test_every_preset_is_known():
    assert {p.stem for p in PRESET_FILES} == set(EXPECTED)


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_loads_with_accelerate(path: Path):
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(yaml_file=str(path))
    assert cfg.num_processes >= 1
    ac.validate(path)  # the same check `xtrain configure` runs


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_starts_with_when_to_use_it(path: Path):
    lines = path.read_text(encoding="utf-8").splitlines()
    comments = [line for line in lines if line.startswith("#")]
    assert lines[0].startswith(f"# Preset {path.name}:")
    assert len(comments) >= 3


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_equals_config_for_its_machine(name: str):
    facts, overrides, options = EXPECTED[name]
    plan = make_plan(facts, overrides)
    want = ac.config_for(plan, **options)
    got = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert got == want


def test_two_machine_presets_differ_only_in_rank():
    r0 = yaml.safe_load((PRESETS_DIR / "two-machines-rank0.yaml").read_text(encoding="utf-8"))
    r1 = yaml.safe_load((PRESETS_DIR / "two-machines-rank1.yaml").read_text(encoding="utf-8"))
    assert {k for k in r0 if r0[k] != r1.get(k)} == {"machine_rank"}
    assert r0["rdzv_backend"] == "c10d" and r0["num_processes"] == 4  # total over both machines
