"""Rules on the fixture machines: the plan each must get, the findings and their fixes.

Pure functions on saved snapshots: nothing here touches this machine. Each finding the
foundation issue lists is triggered by changing one fixture with ``dataclasses.replace``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MACHINE_NAMES, load_machine

from xtrain.errors import XtrainError
from xtrain.machine.facts import GPU, Facts, is_geforce, is_rtx40
from xtrain.planning.plan import Diagnosis, Finding, Overrides, Plan
from xtrain.planning.resolve import diagnose
from xtrain.planning.rules import make_plan

# -- the plan and findings every fixture machine must give --------------------------------------
# plan fields that are checked per machine
PLAN_FIELDS = (
    "shell",
    "device",
    "backend",
    "num_processes",
    "gpu_ids",
    "mixed_precision",
    "tf32",
    "launcher",
    "cpu",
    "cpu_staged_allreduce",
    "env",
    "dataloader_workers",
    "media_workers",
    "pin_memory",
    "main_address",
    "main_port",
)
P2P_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}

EXPECTED: dict[str, tuple[dict, dict[str, str]]] = {
    "windows-2x4090": (
        dict(
            shell="powershell",
            device="cuda",
            backend="gloo",  # no NCCL in Windows wheels
            num_processes=2,
            gpu_ids=[0, 1],
            mixed_precision="fp16",  # GeForce
            tf32=True,
            launcher="spawn",  # torchrun's stores need libuv
            cpu=False,
            cpu_staged_allreduce=True,  # gloo CUDA all-reduce crash (pytorch#186535)
            env={"USE_LIBUV": "0"},
            dataloader_workers=0,
            media_workers=4,  # decoding overlaps the GPU step; spawned, persistent
            pin_memory=True,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {
            "gpus": "ok",
            "nccl-absent-windows": "warn",
            "libuv": "warn",
            "bitsandbytes": "ok",
            "accelerate-config-missing": "ok",
        },
    ),
    # torch 2.8's Windows build has no gloo transport (pytorch#150381): the same plan, refused
    "windows-2x4090-torch28": (
        dict(
            shell="powershell",
            device="cuda",
            backend="gloo",
            num_processes=2,
            gpu_ids=[0, 1],
            mixed_precision="fp16",
            tf32=True,
            launcher="spawn",
            cpu=False,
            cpu_staged_allreduce=True,
            env={"USE_LIBUV": "0"},
            dataloader_workers=0,
            media_workers=4,
            pin_memory=True,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {
            "gpus": "ok",
            "nccl-absent-windows": "warn",
            "gloo-windows-broken": "error",
            "libuv": "warn",
            "bitsandbytes": "ok",
            "accelerate-config-missing": "ok",
        },
    ),
    "windows-cpu-torch-with-driver": (
        dict(
            shell="powershell",
            device="cpu",
            backend=None,
            num_processes=1,
            gpu_ids=None,
            mixed_precision="no",
            tf32=False,
            launcher="spawn",
            cpu=True,
            cpu_staged_allreduce=False,
            env={"USE_LIBUV": "0"},
            dataloader_workers=0,
            media_workers=1,  # 24 cores: one decodes while the rest compute
            pin_memory=False,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"cpu-torch-with-driver": "error", "accelerate-config-missing": "ok"},
    ),
    "wsl2-2x4090": (
        dict(
            shell="bash",
            device="cuda",
            backend="nccl",
            num_processes=2,
            gpu_ids=[0, 1],
            mixed_precision="fp16",
            tf32=True,
            launcher="accelerate",
            cpu=False,
            cpu_staged_allreduce=False,
            env=P2P_ENV,  # 4090s have no P2P
            dataloader_workers=4,
            media_workers=4,
            pin_memory=False,  # WSL2 limits pinned memory
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {
            "gpus": "ok",
            "p2p-missing": "warn",
            "wsl2-pinned-memory": "ok",
            "bitsandbytes": "ok",
            "accelerate-config-missing": "ok",
        },
    ),
    "linux-8xa100-nvlink": (
        dict(
            shell="bash",
            device="cuda",
            backend="nccl",
            num_processes=8,
            gpu_ids=list(range(8)),
            mixed_precision="bf16",  # datacenter, cc 8.0
            tf32=True,
            launcher="accelerate",
            cpu=False,
            cpu_staged_allreduce=False,
            env={},  # NVLink: P2P everywhere
            dataloader_workers=4,
            media_workers=4,
            pin_memory=True,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"gpus": "ok", "accelerate-config-missing": "ok"},
    ),
    "linux-2x3090": (
        dict(
            shell="bash",
            device="cuda",
            backend="nccl",
            num_processes=2,
            gpu_ids=[0, 1],
            mixed_precision="fp16",
            tf32=True,
            launcher="accelerate",
            cpu=False,
            cpu_staged_allreduce=False,
            env=P2P_ENV,  # consumer PCIe board without an NVLink bridge: no P2P
            dataloader_workers=4,
            media_workers=4,
            pin_memory=True,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"gpus": "ok", "p2p-missing": "warn", "accelerate-config-missing": "ok"},
    ),
    "linux-1xh100": (
        dict(
            shell="bash",
            device="cuda",
            backend=None,  # one process: no process group
            num_processes=1,
            gpu_ids=[0],
            mixed_precision="bf16",
            tf32=True,
            launcher="accelerate",
            cpu=False,
            cpu_staged_allreduce=False,
            env={},
            dataloader_workers=4,
            media_workers=4,
            pin_memory=True,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"gpus": "ok", "accelerate-config-missing": "ok"},
    ),
    "linux-cpu": (
        dict(
            shell="bash",
            device="cpu",
            backend=None,
            num_processes=1,
            gpu_ids=None,
            mixed_precision="no",
            tf32=False,
            launcher="accelerate",
            cpu=True,
            cpu_staged_allreduce=False,
            env={},
            dataloader_workers=0,
            media_workers=0,  # 2 cores: a worker would take one from compute
            pin_memory=False,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"cpu-only": "ok", "accelerate-config-missing": "ok"},
    ),
    "macos-arm64": (
        dict(
            shell="bash",
            device="mps",
            backend=None,
            num_processes=1,
            gpu_ids=None,
            mixed_precision="no",
            tf32=False,
            launcher="accelerate",
            cpu=False,
            cpu_staged_allreduce=False,
            env={},
            dataloader_workers=0,  # spawned workers re-import the program
            media_workers=4,
            pin_memory=False,
            main_address="127.0.0.1",
            main_port=29500,
        ),
        {"mps": "ok", "accelerate-config-missing": "ok"},
    ),
}


# the same machine at a load average of 5 (tests/test_cpu_threads.py): no core free, one compute thread
EXPECTED["linux-cpu-busy"] = (
    {**EXPECTED["linux-cpu"][0], "env": {"OMP_NUM_THREADS": "1"}},
    {**EXPECTED["linux-cpu"][1], "cpu-busy": "warn"},
)


def codes(d: Diagnosis) -> dict[str, str]:
    return {f.code: f.severity for f in d.findings}


def finding(d: Diagnosis, code: str) -> Finding:
    found = [f for f in d.findings if f.code == code]
    assert found, f"no {code!r} finding among {codes(d)}"
    return found[0]


def test_every_fixture_has_expectations():
    assert sorted(EXPECTED) == MACHINE_NAMES


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_fixture_plan(name):
    want, _ = EXPECTED[name]
    plan = make_plan(load_machine(name))
    assert {k: getattr(plan, k) for k in PLAN_FIELDS} == want
    assert plan.os_kind == load_machine(name).os_kind
    # every "auto" choice says why
    for key in ("device", "num_processes", "backend", "launcher", "mixed_precision", "tf32"):
        assert plan.reasons.get(key), key


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_fixture_findings(name):
    _, want = EXPECTED[name]
    d = diagnose(load_machine(name))
    assert codes(d) == want
    assert d.has_errors == ("error" in want.values())
    for f in d.findings:
        assert f.message and "\n" not in f.message
        assert f.severity == "ok" or f.fix, f"{f.code} needs a fix"


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_fix_text_uses_the_users_shell(name):
    d = diagnose(load_machine(name))
    for f in d.findings:
        fix = f.fix or ""
        if d.plan.shell == "powershell":
            assert not re.search(r"\bexport |\bunset |\bpython3\b|\bsudo\b", fix), fix
        else:
            assert "$env:" not in fix and "Remove-Item" not in fix, fix


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_plan_round_trips_through_json(name):
    plan = make_plan(load_machine(name))
    assert Plan.from_dict(json.loads(plan.to_json())) == plan


def test_rules_do_not_change_the_facts():
    facts = load_machine("wsl2-2x4090")
    before = facts.to_json()
    diagnose(facts, Overrides(num_processes=1, mixed_precision="bf16"))
    assert facts.to_json() == before


def test_windows_fixes_are_powershell():
    d = diagnose(load_machine("windows-2x4090"))
    assert '$env:USE_LIBUV = "0"' in finding(d, "libuv").fix
    cpu = diagnose(load_machine("windows-cpu-torch-with-driver"))
    # the interpreter that runs xtrain (a path with a space: quoted, run with &), this torch release
    assert finding(cpu, "cpu-torch-with-driver").fix == (
        "& 'C:\\Users\\sam\\Documents\\LoRA runs\\.venv\\Scripts\\python.exe' -m pip install "
        "--force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
    )


def test_bash_fixes_use_export():
    d = diagnose(load_machine("wsl2-2x4090"))
    assert finding(d, "p2p-missing").fix.startswith("export NCCL_P2P_DISABLE=1; export NCCL_IB_DISABLE=1")


def test_summary_names_processes_backend_and_precision():
    plan = make_plan(load_machine("windows-2x4090"))
    assert plan.summary().startswith("2 processes, on cuda [0, 1], gloo, fp16")
    assert "per-device x 2 x accumulation" in plan.summary()


# -- overrides ------------------------------------------------------------------------------------
def test_override_processes_uses_the_first_gpus():
    plan = make_plan(load_machine("wsl2-2x4090"), Overrides(num_processes=1))
    assert (plan.num_processes, plan.gpu_ids, plan.backend) == (1, [0], None)
    assert plan.env == {}  # one GPU: no P2P variables


def test_override_gpu_ids_selects_a_subset():
    plan = make_plan(load_machine("linux-8xa100-nvlink"), Overrides(gpu_ids=[2, 5]))
    assert (plan.num_processes, plan.gpu_ids, plan.backend) == (2, [2, 5], "nccl")


def test_override_precision():
    assert (
        make_plan(load_machine("linux-2x3090"), Overrides(mixed_precision="bf16")).mixed_precision == "bf16"
    )
    a100 = make_plan(load_machine("linux-8xa100-nvlink"), Overrides(mixed_precision="fp16"))
    assert a100.mixed_precision == "fp16" and a100.reasons["mixed_precision"] == "chosen by the user"
    assert make_plan(load_machine("linux-cpu"), Overrides(mixed_precision="no")).mixed_precision == "no"


def test_override_port():
    plan = make_plan(load_machine("linux-2x3090"), Overrides(port=29600))
    assert plan.main_port == 29600


def test_platform_forced_to_windows_takes_the_windows_path():
    plan = make_plan(load_machine("linux-cpu"), Overrides(platform="windows", num_processes=2))
    assert plan.os_kind == "windows" and plan.shell == "powershell"
    assert plan.launcher == "spawn"
    assert plan.env == {"USE_LIBUV": "0", "OMP_NUM_THREADS": "1"}  # 2 cores / 2 processes
    assert (plan.backend, plan.cpu, plan.num_processes) == ("gloo", True, 2)


def test_cpu_processes_share_the_cores():
    cpu = load_machine("linux-cpu")
    assert "OMP_NUM_THREADS" not in make_plan(cpu).env  # one process keeps torch's default
    assert make_plan(replace(cpu, cpu_count=16), Overrides(num_processes=4)).env["OMP_NUM_THREADS"] == "4"
    assert make_plan(cpu, Overrides(num_processes=3)).env["OMP_NUM_THREADS"] == "1"


def test_cpu_processes_form_one_gloo_group():
    plan = make_plan(load_machine("linux-cpu"), Overrides(num_processes=2))
    assert (plan.backend, plan.cpu, plan.world_size, plan.launcher) == ("gloo", True, 2, "accelerate")


def test_multi_machine_plan():
    plan = make_plan(
        load_machine("linux-8xa100-nvlink"),
        Overrides(num_machines=2, machine_rank=1, main_address="10.0.0.1"),
    )
    assert (plan.world_size, plan.machine_rank, plan.main_address) == (16, 1, "10.0.0.1")


def volta() -> Facts:
    return replace(
        load_machine("linux-8xa100-nvlink"),
        gpus=[GPU(i, "Tesla V100-SXM2-32GB", 32768, (7, 0)) for i in range(8)],
        smi_gpu_names=["Tesla V100-SXM2-32GB"] * 8,
    )


@pytest.mark.parametrize(
    "name, overrides, says",
    [
        ("linux-2x3090", Overrides(num_processes=0), "--processes must be at least 1"),
        ("linux-2x3090", Overrides(num_processes=3), "needs as many GPUs"),
        ("linux-2x3090", Overrides(gpu_ids=[0, 5]), "GPU 5"),
        ("linux-2x3090", Overrides(gpu_ids=[1, 1]), "twice"),
        ("linux-cpu", Overrides(gpu_ids=[0]), "no CUDA GPU"),
        ("linux-cpu", Overrides(mixed_precision="fp16"), "fp16 needs a CUDA GPU"),
        ("macos-arm64", Overrides(mixed_precision="fp16"), "fp16 needs a CUDA GPU"),
        ("macos-arm64", Overrides(num_processes=2), "MPS runs one process"),
        ("linux-2x3090", Overrides(mixed_precision="fp8"), "--precision 'fp8' is unknown"),
        ("linux-cpu", Overrides(platform="beos"), "unknown platform"),
        ("linux-2x3090", Overrides(num_machines=0), "--machines"),
        ("linux-2x3090", Overrides(num_machines=2, machine_rank=2, main_address="10.0.0.1"), "machine-rank"),
        ("linux-2x3090", Overrides(num_machines=2), "main machine's address"),
    ],
)
def test_invalid_overrides_raise_one_line(name, overrides, says):
    with pytest.raises(XtrainError) as e:
        make_plan(load_machine(name), overrides)
    assert says in e.value.message
    assert "\n" not in e.value.one_line()


def test_bf16_refused_below_compute_capability_8():
    facts = volta()
    assert make_plan(facts).mixed_precision == "fp16"  # auto: no fast bf16 on Volta
    assert make_plan(facts).tf32 is False
    with pytest.raises(XtrainError, match="compute capability >= 8.0"):
        make_plan(facts, Overrides(mixed_precision="bf16"))


# -- each finding the issue lists, from a modified snapshot -----------------------------------------
def test_cpu_torch_with_driver_picks_the_index_the_driver_runs():
    win = load_machine("windows-cpu-torch-with-driver")
    fix = finding(diagnose(win), "cpu-torch-with-driver").fix
    assert " -m pip install --force-reinstall torch==2.13.0 " in fix and fix.endswith("/whl/cu126")
    assert "`pip install torch` on Windows" in finding(diagnose(win), "cpu-torch-with-driver").message
    # A CUDA 13 driver on a Turing-or-newer card gets the CUDA 13 build.
    assert finding(diagnose(replace(win, driver_cuda="13.0")), "cpu-torch-with-driver").fix.endswith("cu130")
    # A CUDA 13 driver on a Pascal card: CUDA 13 builds need cc >= 7.5.
    pascal = replace(win, driver_cuda="13.0", smi_gpu_names=["NVIDIA GeForce GTX 1080 Ti"])
    assert finding(diagnose(pascal), "cpu-torch-with-driver").fix.endswith("cu126")
    # A CUDA 11 driver runs no torch 2.13 build: update it first.
    old = finding(diagnose(replace(win, driver_cuda="11.8")), "cpu-torch-with-driver")
    assert old.fix.startswith("# update the NVIDIA driver (it supports CUDA 11.8)")
    assert old.fix.splitlines()[1] == "nvidia-smi" and old.fix.endswith("/whl/cu126")


def test_cpu_torch_with_driver_on_linux_uses_bash():
    h100 = load_machine("linux-1xh100")
    cpu_build = replace(h100, torch_version="2.13.0+cpu", torch_cuda=None, cuda_available=False, gpus=[])
    d = diagnose(cpu_build)
    assert d.plan.device == "cpu"
    f = finding(d, "cpu-torch-with-driver")
    assert f.severity == "error" and f.fix.startswith("/home/ubuntu/xtrain/.venv/bin/python -m pip install")
    assert "cuda-visible-devices" not in codes(d)


def test_cuda_torch_that_cannot_reach_the_gpu():
    broken = replace(load_machine("linux-1xh100"), cuda_available=False, gpus=[])
    assert codes(diagnose(broken))["cuda-unavailable"] == "error"


def test_torch_missing():
    facts = replace(load_machine("linux-cpu"), torch_version=None, gloo_available=False)
    assert codes(diagnose(facts))["torch-missing"] == "error"


def test_nccl_absent_on_windows_means_gloo():
    d = diagnose(load_machine("windows-2x4090"))
    assert d.plan.backend == "gloo"
    assert finding(d, "nccl-absent-windows").severity == "warn"
    # one process needs no backend and gets no warning
    one = diagnose(load_machine("windows-2x4090"), Overrides(num_processes=1))
    assert one.plan.backend is None and "nccl-absent-windows" not in codes(one)


def test_linux_torch_without_nccl_falls_back_to_gloo():
    d = diagnose(replace(load_machine("linux-2x3090"), nccl_available=False, nccl_version=None))
    assert d.plan.backend == "gloo" and not d.plan.cpu_staged_allreduce
    assert finding(d, "nccl-missing").severity == "warn"


def test_gloo_missing_is_an_error():
    d = diagnose(replace(load_machine("windows-2x4090"), gloo_available=False))
    assert codes(d)["gloo-missing"] == "error"


def test_libuv_trap():
    # Windows: only when several processes rendezvous
    assert "libuv" not in codes(diagnose(load_machine("windows-2x4090"), Overrides(num_processes=1)))
    # Linux torch built without libuv: USE_LIBUV=0 and a warning naming torch's message
    facts = replace(load_machine("linux-2x3090"), libuv_ok=False, libuv_error="RuntimeError: no libuv")
    d = diagnose(facts)
    assert d.plan.env["USE_LIBUV"] == "0"
    f = finding(d, "libuv")
    assert f.severity == "warn" and "no libuv" in f.message and f.fix == "export USE_LIBUV=0"


def test_rtx4090_without_p2p():
    wsl = load_machine("wsl2-2x4090")
    f = finding(diagnose(wsl), "p2p-missing")
    assert "RTX 40" in f.message
    # no matrix (snapshot without torch.cuda): known from the card
    assert make_plan(replace(wsl, p2p=None)).env == P2P_ENV
    # drivers before 550.40.07 report P2P that hangs: disabled whatever the matrix says
    all_p2p = [[True, True], [True, True]]
    assert make_plan(replace(wsl, p2p=all_p2p, driver_version="537.58")).env == P2P_ENV
    # a newer driver that really offers P2P is trusted
    assert make_plan(replace(wsl, p2p=all_p2p, driver_version="576.88")).env == {}


def test_p2p_matrix_follows_the_selected_gpus():
    a100 = load_machine("linux-8xa100-nvlink")
    matrix = [[True] * 8 for _ in range(8)]
    matrix[6][7] = matrix[7][6] = False
    facts = replace(a100, p2p=matrix)
    assert make_plan(facts, Overrides(gpu_ids=[0, 1])).env == {}
    assert make_plan(facts).env == P2P_ENV
    assert "p2p-missing" in codes(diagnose(facts))


def test_wsl2_shm_and_pinned_memory():
    wsl = load_machine("wsl2-2x4090")
    d = diagnose(wsl)
    assert d.plan.pin_memory is False
    assert finding(d, "wsl2-pinned-memory").severity == "ok"
    small = diagnose(replace(wsl, shm_mib=64))
    assert small.plan.env == {**P2P_ENV, "NCCL_SHM_DISABLE": "1"}
    f = finding(small, "shm-small")
    assert f.severity == "warn" and "64 MiB" in f.message and "NCCL_SHM_DISABLE" in f.message
    assert "mount" in f.fix and "$env:" not in f.fix


def test_docker_shm_on_linux():
    d = diagnose(replace(load_machine("linux-8xa100-nvlink"), shm_mib=64))
    assert d.plan.env == {"NCCL_SHM_DISABLE": "1"}
    assert "--shm-size" in finding(d, "shm-small").fix


def test_small_shm_without_nccl_does_not_claim_the_variable():
    d = diagnose(replace(load_machine("linux-cpu"), shm_mib=64), Overrides(num_processes=2))
    f = finding(d, "shm-small")
    assert "NCCL_SHM_DISABLE" not in f.message and "NCCL_SHM_DISABLE" not in d.plan.env


def test_empty_hostname():
    d = diagnose(replace(load_machine("windows-2x4090"), hostname=""))
    f = finding(d, "hostname-empty")
    # one machine: pin gloo to loopback (no rename, no reboot)
    assert f.severity == "error" and "$env:GLOO_SOCKET_IFNAME = " in f.fix and "Rename" not in f.fix
    assert finding(diagnose(replace(load_machine("linux-cpu"), hostname=" ")), "hostname-empty").fix == (
        "export GLOO_SOCKET_IFNAME=lo"
    )
    # several machines need a real name
    multi = diagnose(
        replace(load_machine("linux-cpu"), hostname=""), Overrides(num_machines=2, main_address="10.0.0.1")
    )
    assert finding(multi, "hostname-empty").fix == "sudo hostnamectl set-hostname xtrain-pc"


def test_unresolvable_hostname():
    facts = replace(load_machine("linux-2x3090"), hostname="box", hostname_resolves=False)
    f = finding(diagnose(facts), "hostname-unresolvable")
    assert f.severity == "warn" and f.fix == "export GLOO_SOCKET_IFNAME=lo"
    multi = diagnose(facts, Overrides(num_machines=2, main_address="10.0.0.1"))
    assert finding(multi, "hostname-unresolvable").severity == "error"
    assert "/etc/hosts" in finding(multi, "hostname-unresolvable").fix
    win = replace(load_machine("windows-2x4090"), hostname_resolves=False)
    assert "GLOO_SOCKET_IFNAME" in finding(diagnose(win), "hostname-unresolvable").fix
    win_multi = diagnose(win, Overrides(num_machines=2, main_address="10.0.0.1"))
    assert "drivers\\etc\\hosts" in finding(win_multi, "hostname-unresolvable").fix


def test_port_busy():
    facts = replace(load_machine("linux-2x3090"), port_free=False)
    f = finding(diagnose(facts), "port-busy")
    assert f.severity == "warn" and "--port 29501" in f.fix
    # another port chosen: nothing to say
    assert "port-busy" not in codes(diagnose(facts, Overrides(port=29600)))
    # one process needs no rendezvous port
    assert finding(diagnose(facts, Overrides(num_processes=1)), "port-busy").severity == "ok"


def test_cuda_visible_devices_hiding_gpus():
    a100 = load_machine("linux-8xa100-nvlink")
    facts = replace(a100, cuda_visible_devices="0,1", gpus=a100.gpus[:2], p2p=None)
    d = diagnose(facts)
    f = finding(d, "cuda-visible-devices")
    assert f.severity == "warn" and "hides 6 of 8" in f.message
    assert f.fix.startswith("unset CUDA_VISIBLE_DEVICES")
    assert d.plan.num_processes == 2
    win = load_machine("windows-2x4090")
    hidden = replace(win, cuda_visible_devices="1", gpus=[win.gpus[0]])
    assert finding(diagnose(hidden), "cuda-visible-devices").fix.startswith(
        "Remove-Item Env:CUDA_VISIBLE_DEVICES"
    )
    # set but hiding nothing: silent
    assert "cuda-visible-devices" not in codes(
        diagnose(replace(a100, cuda_visible_devices="0,1,2,3,4,5,6,7"))
    )


@pytest.mark.parametrize(
    "name, config, problem",
    [
        ("linux-2x3090", {"distributed_type": "MULTI_GPU", "num_processes": 4}, "4 processes per machine"),
        ("linux-2x3090", {"distributed_type": "NO", "num_processes": 1}, "would use 1 of 2 GPUs"),
        ("linux-2x3090", {"distributed_type": "MULTI_GPU", "num_processes": 2, "use_cpu": True}, "use_cpu"),
        ("linux-2x3090", {"distributed_type": "MULTI_GPU", "num_processes": 2, "gpu_ids": "0,3"}, "gpu_ids"),
        ("linux-cpu", {"distributed_type": "MULTI_GPU", "num_processes": 2}, "no CUDA GPU"),
        ("linux-cpu", {"distributed_type": "NO", "mixed_precision": "fp16"}, "fp16 without a CUDA GPU"),
        ("linux-cpu", {"distributed_type": "NO", "num_processes": "lots"}, "'lots' is not a number"),
    ],
)
def test_accelerate_config_contradicting_the_hardware(name, config, problem):
    d = diagnose(replace(load_machine(name), accelerate_config=config))
    f = finding(d, "accelerate-config-mismatch")
    assert f.severity == "warn" and problem in f.message and "xtrain configure" in f.fix


def test_accelerate_config_bf16_on_volta():
    facts = replace(volta(), accelerate_config={"distributed_type": "MULTI_GPU", "mixed_precision": "bf16"})
    assert "bf16 on GPUs" in finding(diagnose(facts), "accelerate-config-mismatch").message


@pytest.mark.parametrize(
    "name, config",
    [
        ("linux-2x3090", {"distributed_type": "MULTI_GPU", "num_processes": 2, "mixed_precision": "fp16"}),
        # accelerate's num_processes counts every machine: 16 over 2 machines is 8 per machine
        ("linux-8xa100-nvlink", {"distributed_type": "MULTI_GPU", "num_processes": 16, "num_machines": 2}),
        ("linux-cpu", {"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True}),
    ],
)
def test_accelerate_config_that_fits(name, config):
    d = diagnose(replace(load_machine(name), accelerate_config=config))
    assert codes(d)["accelerate-config"] == "ok"


def test_accelerate_config_that_cannot_load():
    facts = replace(load_machine("linux-cpu"), accelerate_config_error="ValueError: had unknown keys (['x'])")
    f = finding(diagnose(facts), "accelerate-config-invalid")
    assert f.severity == "error" and "unknown keys" in f.message and "--force" in f.fix


def test_mismatched_gpus():
    rig = load_machine("linux-2x3090")
    mixed = replace(rig, gpus=[rig.gpus[0], GPU(1, "NVIDIA GeForce RTX 4090", 24564, (8, 9))])
    d = diagnose(mixed)
    f = finding(d, "mismatched-gpus")
    assert f.severity == "warn" and "slowest (NVIDIA GeForce RTX 3090)" in f.message
    assert f.fix.splitlines()[-1] == "xtrain configure --gpus 1 --force"
    assert d.plan.mixed_precision == "fp16" and d.plan.tf32 is True


def test_driver_older_than_the_torch_build():
    h100 = load_machine("linux-1xh100")
    minor = finding(
        diagnose(replace(h100, driver_version="550.54.15", driver_cuda="12.4")), "driver-older-than-build"
    )
    assert minor.severity == "warn"
    major = finding(diagnose(replace(h100, driver_version="520.61.05", driver_cuda="11.8")), "driver-too-old")
    assert major.severity == "error" and major.fix.startswith("# update the NVIDIA driver")
    cu130 = replace(h100, torch_version="2.13.0+cu130", torch_cuda="13.0", driver_cuda="12.8")
    f = finding(diagnose(cu130), "driver-too-old")
    assert f.fix.endswith("torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126")
    assert "/home/ubuntu/xtrain/.venv/bin/python -m pip" in f.fix


def test_packages_missing():
    facts = replace(load_machine("windows-2x4090"), packages={"accelerate": "1.15.0", "peft": None})
    f = finding(diagnose(facts), "packages-missing")
    assert (
        f.severity == "error"
        and f.fix == "C:\\Users\\alex\\xtrain\\.venv\\Scripts\\python.exe -m pip install peft"
    )


def test_probe_errors_are_reported():
    facts = replace(load_machine("linux-cpu"), probe_errors={"nvidia_smi": "TimeoutExpired: 5 s"})
    f = finding(diagnose(facts), "probe-failed")
    assert f.severity == "warn" and "nvidia_smi: TimeoutExpired" in f.message


@pytest.mark.parametrize(
    "name, geforce, rtx40",
    [
        ("NVIDIA GeForce RTX 4090", True, True),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", True, True),
        ("NVIDIA GeForce RTX 3090", True, False),
        ("NVIDIA RTX 4090", True, True),
        ("NVIDIA TITAN RTX", True, False),
        ("NVIDIA RTX 6000 Ada Generation", False, False),
        ("Quadro RTX 8000", False, False),
        ("NVIDIA RTX A6000", False, False),
        ("NVIDIA A100-SXM4-80GB", False, False),
        ("NVIDIA H100 80GB HBM3", False, False),
    ],
)
def test_gpu_classes(name, geforce, rtx40):
    gpu = GPU(0, name, 24000, (8, 9))
    assert (is_geforce(gpu), is_rtx40(gpu)) == (geforce, rtx40)


def test_workstation_ada_gets_bf16():
    facts = replace(
        load_machine("linux-1xh100"), gpus=[GPU(0, "NVIDIA RTX 6000 Ada Generation", 49140, (8, 9))]
    )
    assert make_plan(facts).mixed_precision == "bf16"


# -- the docs stay true ------------------------------------------------------------------------------
DOCS = Path(__file__).parent.parent / "docs" / "findings.md"


def test_every_finding_code_is_documented():
    import xtrain.planning.checks
    import xtrain.planning.rules

    files = [Path(xtrain.planning.rules.__file__), *Path(xtrain.planning.checks.__file__).parent.glob("*.py")]
    source = "".join(f.read_text(encoding="utf-8") for f in files)
    found = set(re.findall(r'Finding\(\s*"([a-z0-9-]+)"', source))
    assert len(found) >= 20
    doc = DOCS.read_text(encoding="utf-8")
    missing = sorted(code for code in found if f"`{code}`" not in doc)
    assert not missing, f"docs/findings.md does not explain {missing}"


def test_rules_table_has_a_row_per_fixture_machine():
    doc = DOCS.read_text(encoding="utf-8")
    table = doc[doc.index("## Rules table") :]
    for name in MACHINE_NAMES:
        assert re.search(rf"^\| `{re.escape(name)}`", table, re.M), name


def test_deepspeed_config_on_windows_is_an_error() -> None:
    facts = replace(
        load_machine("windows-2x4090"),
        accelerate_config={"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": {}},
    )
    f = finding(diagnose(facts), "deepspeed-windows")
    assert f.severity == "error" and "WSL2" in f.message and f.fix


def test_fsdp_config_on_windows_is_an_error_that_points_to_4bit() -> None:
    facts = replace(
        load_machine("windows-2x4090"),
        accelerate_config={"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {}},
    )
    f = finding(diagnose(facts), "fsdp-windows")
    assert f.severity == "error" and "model.quantization=4bit" in f.message and "WSL2" in f.message
    assert f.fix.splitlines()[-1] == "xtrain configure --force"
    wsl2 = replace(load_machine("wsl2-2x4090"), accelerate_config=facts.accelerate_config)
    assert not [x for x in diagnose(wsl2).findings if x.code == "fsdp-windows"]


# -- bf16 weights train under bf16 where the cards run it at full rate ---------------------------------
@pytest.mark.parametrize(
    ("machine", "dtype", "expected"),
    [
        ("windows-2x4090", "bfloat16", "bf16"),  # GeForce, cc 8.9: bf16 weights keep bf16
        ("windows-2x4090", "auto", "fp16"),  # GeForce default unchanged
        ("windows-2x4090", "float32", "fp16"),
        ("linux-2x3090", "bfloat16", "bf16"),  # cc 8.6
        ("linux-8xa100-nvlink", "bfloat16", "bf16"),
        ("linux-cpu", "bfloat16", "no"),  # no CUDA: fp32 whatever the weights
    ],
)
def test_bf16_weights_choose_bf16_autocast(machine: str, dtype: str, expected: str) -> None:
    plan = make_plan(load_machine(machine), Overrides(weights_dtype=dtype))
    assert plan.mixed_precision == expected
    if expected == "bf16" and machine != "linux-8xa100-nvlink":
        assert "model.dtype" in plan.reasons["mixed_precision"]


def test_bf16_weights_on_cards_without_bf16_stay_fp16() -> None:
    win = load_machine("windows-2x4090")
    facts = replace(win, gpus=[GPU(i, "NVIDIA GeForce RTX 2080 Ti", 11264, (7, 5)) for i in range(2)])
    assert make_plan(facts, Overrides(weights_dtype="bfloat16")).mixed_precision == "fp16"


def test_the_train_config_passes_its_weights_dtype_to_the_plan() -> None:
    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config

    cfg = load_config(None, ["model.dtype=bfloat16"])
    assert resolve(cfg, facts=load_machine("windows-2x4090")).plan.mixed_precision == "bf16"
    cfg = load_config(None, ["model.dtype=bfloat16", "run.mixed_precision=fp16"])
    assert resolve(cfg, facts=load_machine("windows-2x4090")).plan.mixed_precision == "fp16"  # the user's


# -- resolve: the launch context and the one place settings are decided ------------------------------
def test_resolve_takes_the_process_count_from_the_launch_context(monkeypatch) -> None:
    from xtrain.machine import probe
    from xtrain.planning.context import LaunchContext
    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config

    gpus = load_machine("linux-2x3090")
    cfg = load_config(None, ["batch.per_device=4", "batch.global_batch=16"])
    alone = LaunchContext.from_env({})
    assert resolve(cfg, facts=gpus, context=alone).plan.num_processes == 1  # python -m xtrain.run
    assert resolve(cfg, facts=gpus).plan.num_processes == 2  # a command: one process per GPU
    spawn = resolve(cfg, processes=2, facts=gpus, context=alone)
    assert spawn.plan.num_processes == 2 and spawn.settings.accumulation == 2  # 16 / (4 x 2)

    sent = spawn.plan.to_json()
    launched = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    rank = LaunchContext.from_env({**launched, "XTRAIN_PLAN": sent})
    monkeypatch.setattr(probe, "collect", lambda *a, **k: pytest.fail("a sent plan needs no probe"))
    got = resolve(cfg, context=rank)
    assert got.plan == spawn.plan and got.findings == [] and got.settings == spawn.settings
    with pytest.raises(XtrainError, match="conflicts with the launcher's 2 processes"):
        resolve(cfg, processes=3, context=rank)
    # a plan sent for another world size (here: one process) is planned again, not trusted
    assert resolve(cfg, processes=2, facts=gpus, context=LaunchContext.from_env({"XTRAIN_PLAN": sent})).plan
    with pytest.raises(XtrainError, match="--processes must be at least 1"):
        resolve(cfg, processes=0, context=alone)  # checked before anything is probed


def test_the_loop_reads_the_loader_settings_from_resolve() -> None:
    from xtrain.planning.context import LaunchContext
    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config

    plan = make_plan(load_machine("linux-2x3090"))
    ctx = LaunchContext.from_env({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    s = resolve(load_config(None), plan=plan, context=ctx).settings
    assert (s.loader_workers, s.pin_memory, s.world_size) == (plan.dataloader_workers, True, 2)
    s = resolve(load_config(None, ["data.num_workers=1"]), plan=plan, context=ctx).settings
    assert s.loader_workers == 1  # data.num_workers wins over the plan's


@pytest.mark.parametrize(
    ("task", "kind"),
    [("causal-lm", "dataloader_workers"), ("seq-cls", "dataloader_workers"),
     ("image-to-text", "media_workers"), ("speech-to-text", "media_workers"),
     ("vision-language", "media_workers"), ("image-classification", "media_workers")],
)  # fmt: skip
def test_tasks_that_decode_media_get_the_plans_media_workers(task: str, kind: str) -> None:
    from xtrain.planning.resolve import resolve
    from xtrain.tasks import get
    from xtrain.tasks.validation import load_config

    media = get(task).decodes_media
    for machine in ("windows-2x4090", "linux-2x3090", "windows-cpu-torch-with-driver"):
        plan = make_plan(load_machine(machine))
        s = resolve(load_config(None, [f"model.task={task}"]), plan=plan).settings
        assert s.workers_for(media) == (getattr(plan, kind), plan.reasons[kind])
    assert make_plan(load_machine("windows-2x4090")).media_workers > 0  # spawned, yet worth it
    s = resolve(load_config(None, [f"model.task={task}", "data.num_workers=0"]), plan=plan).settings
    assert s.workers_for(media) == (0, "data.num_workers")
