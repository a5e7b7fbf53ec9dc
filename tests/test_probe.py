"""Probing: parsers on real tool output, each probe failing safely, and this machine for real."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import MACHINE_NAMES, MACHINES_DIR

import xtrain.machine.probe as probe
from xtrain.errors import XtrainError
from xtrain.machine.facts import Facts
from xtrain.machine.probes import accelerate_config, nvidia, torch_stack
from xtrain.machine.probes import system as system_probes
from xtrain.planning.resolve import diagnose

SMI_LINUX = """\
Tue Oct  1 12:00:00 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 560.35.03              Driver Version: 560.35.03      CUDA Version: 12.6     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA A100-SXM4-80GB          On  |   00000000:07:00.0 Off |                    0 |
"""
SMI_WINDOWS = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 566.36                 Driver Version: 566.36         CUDA Version: 12.7     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                  Driver-Model | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA GeForce RTX 4090      WDDM  |   00000000:01:00.0  On |                  Off |
"""


# -- pure parsers ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, want",
    [
        (SMI_LINUX, ("560.35.03", "12.6")),
        (SMI_WINDOWS, ("566.36", "12.7")),
        ("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |", ("580.65.06", "13.0")),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", (None, None)),
    ],
)
def test_parse_smi_header(text, want):
    assert nvidia.parse_smi_header(text) == want


def test_parse_smi_query():
    text = "NVIDIA GeForce RTX 4090, 24564, 566.36\nNVIDIA GeForce RTX 3090, [N/A], 566.36\n\n"
    assert nvidia.parse_smi_query(text) == [
        ("NVIDIA GeForce RTX 4090", 24564, "566.36"),
        ("NVIDIA GeForce RTX 3090", None, "566.36"),
    ]
    assert nvidia.parse_smi_query("No devices were found\n") == []


@pytest.mark.parametrize(
    "system, release, kind",
    [
        ("Windows", "11", "windows"),
        ("Linux", "5.15.167.4-microsoft-standard-WSL2", "wsl2"),
        ("Linux", "6.6.87.2-microsoft-standard-WSL2", "wsl2"),
        ("Linux", "6.8.0-45-generic", "linux"),
        ("Darwin", "24.5.0", "macos"),
    ],
)
def test_classify_os(system, release, kind):
    assert system_probes.classify_os(system, release) == kind


def test_accelerate_config_path_follows_accelerate():
    home = Path("~").expanduser()
    assert (
        accelerate_config.accelerate_config_path({})
        == home / ".cache/huggingface/accelerate/default_config.yaml"
    )
    assert accelerate_config.accelerate_config_path({"XDG_CACHE_HOME": "/x"}) == Path(
        "/x/huggingface/accelerate/default_config.yaml"
    )
    assert accelerate_config.accelerate_config_path({"HF_HOME": "/hf", "XDG_CACHE_HOME": "/x"}) == Path(
        "/hf/accelerate/default_config.yaml"
    )


@pytest.mark.slow  # imports accelerate (and torch) in a fresh process
def test_accelerate_config_path_matches_accelerates_own(tmp_path):
    """The same path accelerate computes. A subprocess: accelerate reads the environment at import."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "XDG_CACHE_HOME")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = "from accelerate.commands.config.config_args import default_config_file as f; print(f)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(accelerate_config.accelerate_config_path(env))


# -- each probe fails safely -----------------------------------------------------------------------------
def test_a_failing_probe_is_recorded_not_raised():
    facts = Facts()

    def broken(_facts):
        raise OSError("no such device\nsecond line")

    probe.run_probe(facts, "thing", broken)
    assert facts.probe_errors == {"thing": "OSError: no such device second line"}


def fake_smi(tmp_path: Path, script: str) -> str:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\nimport sys, time\n" + textwrap.dedent(script))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


needs_posix = pytest.mark.skipif(sys.platform == "win32", reason="fake nvidia-smi is a script")


@needs_posix
def test_nvidia_smi_parsed_through_a_real_subprocess(monkeypatch, tmp_path):
    exe = fake_smi(
        tmp_path,
        f"""
        if len(sys.argv) == 1:
            print({SMI_WINDOWS!r})
        else:
            print("NVIDIA GeForce RTX 4090, 24564, 566.36")
        """,
    )
    monkeypatch.setattr(nvidia, "find_nvidia_smi", lambda: exe)
    facts = Facts()
    probe.run_probe(facts, "nvidia_smi", nvidia.probe_nvidia_smi)
    assert facts.probe_errors == {}
    assert (facts.nvidia_smi, facts.driver_version, facts.driver_cuda) == (True, "566.36", "12.7")
    assert (facts.smi_gpu_count, facts.smi_gpu_names) == (1, ["NVIDIA GeForce RTX 4090"])


@needs_posix
def test_nvidia_smi_that_fails_is_present_but_recorded(monkeypatch, tmp_path):
    exe = fake_smi(
        tmp_path,
        """
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        sys.exit(9)
        """,
    )
    monkeypatch.setattr(nvidia, "find_nvidia_smi", lambda: exe)
    facts = Facts()
    probe.run_probe(facts, "nvidia_smi", nvidia.probe_nvidia_smi)
    assert facts.nvidia_smi is True and facts.driver_version is None
    assert facts.probe_errors["nvidia_smi"].startswith(
        "RuntimeError: nvidia-smi exited 9: NVIDIA-SMI has failed"
    )


@needs_posix
def test_nvidia_smi_that_hangs_times_out(monkeypatch, tmp_path):
    exe = fake_smi(tmp_path, "time.sleep(30)\n")
    monkeypatch.setattr(nvidia, "find_nvidia_smi", lambda: exe)
    monkeypatch.setattr(nvidia, "SMI_TIMEOUT_S", 0.5)
    facts = Facts()
    probe.run_probe(facts, "nvidia_smi", nvidia.probe_nvidia_smi)
    assert facts.probe_errors["nvidia_smi"].startswith("TimeoutExpired")


def test_missing_nvidia_smi_is_a_fact(monkeypatch):
    monkeypatch.setattr(nvidia, "find_nvidia_smi", lambda: None)
    facts = Facts()
    probe.run_probe(facts, "nvidia_smi", nvidia.probe_nvidia_smi)
    assert facts.nvidia_smi is False and facts.probe_errors == {}


def test_torch_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    facts = probe.collect(quick=True)
    assert facts.torch_version is None and facts.torch_cuda is None
    assert (facts.cuda_available, facts.nccl_available, facts.gloo_available, facts.gpus) == (
        False,
        False,
        False,
        [],
    )
    assert "import of torch halted" in facts.probe_errors["torch"]
    assert set(facts.probe_errors) == {"torch"}
    assert "torch-missing" in {f.code for f in diagnose(facts).findings}


def test_libuv_failure_is_a_fact(monkeypatch):
    import torch.distributed as dist

    def no_libuv(*args, **kwargs):
        raise RuntimeError("use_libuv was requested but PyTorch was built without libuv support")

    monkeypatch.setattr(dist, "TCPStore", no_libuv)
    facts = Facts()
    probe.run_probe(facts, "libuv", torch_stack.probe_libuv)
    assert facts.libuv_ok is False and "without libuv support" in facts.libuv_error
    assert facts.probe_errors == {}


def test_port_busy_and_free():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        facts = Facts(port=busy)
        probe.run_probe(facts, "port", system_probes.probe_port)
        assert facts.port_free is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    facts = Facts(port=free)
    probe.run_probe(facts, "port", system_probes.probe_port)
    assert facts.port_free is True


@pytest.fixture
def hf_home(monkeypatch, tmp_path) -> Path:
    # accelerate computes its default path at import: import it under the real environment first,
    # so this test does not leave a temporary path in it for the tests that follow.
    import accelerate.commands.config.config_args  # noqa: F401

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    (tmp_path / "accelerate").mkdir()
    return tmp_path / "accelerate" / "default_config.yaml"


def read_accelerate_config(full: bool = False) -> Facts:
    facts = Facts()
    probe.run_probe(facts, "packages", system_probes.probe_packages)
    probe.run_probe(facts, "accelerate_config", accelerate_config.probe_accelerate_config)
    if full:
        probe.run_probe(facts, "accelerate_loads", accelerate_config.probe_accelerate_loads)
    return facts


def test_accelerate_config_absent(hf_home):
    facts = read_accelerate_config(full=True)
    assert facts.accelerate_config_path == str(hf_home)
    assert (facts.accelerate_config, facts.accelerate_config_error) == (None, None)


def test_accelerate_config_parsed(hf_home):
    hf_home.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n")
    facts = read_accelerate_config(full=True)
    assert facts.accelerate_config == {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_processes": 2,
    }
    assert facts.accelerate_config_error is None and facts.probe_errors == {}


@pytest.mark.parametrize(
    "text, error",
    [
        ("distributed_type: [unclosed\n", "is not valid YAML at line 2, column 1: expected ',' or ']'"),
        ("- just\n- a list\n", "expected a mapping of settings, found list"),
        # the one YAML reader (xtrain/structured.py): a finding, never a RecursionError or a silent pick
        ("num_processes: 1\nnum_processes: 2\n", "has the key 'num_processes' twice (lines 1 and 2)"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper than 64 levels at line 1"),
    ],
)
def test_accelerate_config_unreadable(hf_home, text, error):
    hf_home.write_text(text)
    facts = read_accelerate_config()
    assert facts.accelerate_config is None and error in facts.accelerate_config_error
    assert facts.probe_errors == {}
    assert "accelerate-config-invalid" in {f.code for f in diagnose(facts).findings}


def test_accelerate_config_accelerate_refuses(hf_home):
    """Valid YAML that accelerate's strict loader refuses (unknown keys): caught in full mode only."""
    hf_home.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nxtrain_backend: gloo\n")
    assert read_accelerate_config().accelerate_config_error is None
    facts = read_accelerate_config(full=True)
    assert "unknown keys" in facts.accelerate_config_error
    assert "accelerate-config-invalid" in {f.code for f in diagnose(facts).findings}


# -- this machine, for real -------------------------------------------------------------------------------
def test_collect_this_machine_quick_spawns_nothing(monkeypatch):
    import torch

    def no_subprocess(*args, **kwargs):
        raise AssertionError("quick probing must not start processes")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    facts = probe.collect(quick=True)
    assert facts.probe_errors == {}
    assert facts.torch_version == torch.__version__ and facts.torch_cuda == torch.version.cuda
    assert facts.gloo_available is True
    assert facts.python and facts.cpu_count >= 1 and facts.memory_mib and facts.hostname
    # the slow probes were skipped
    assert (facts.hostname_resolves, facts.libuv_ok, facts.port_free, facts.p2p) == (None, None, None, None)
    assert Facts.from_dict(json.loads(facts.to_json())) == facts


def test_collect_this_machine_full():
    import importlib.metadata

    import torch

    facts = probe.collect(port=29500)
    assert facts.os_kind in ("linux", "wsl2", "windows", "macos")
    assert facts.torch_version == torch.__version__
    assert facts.cuda_available == torch.cuda.is_available()
    assert len(facts.gpus) == (torch.cuda.device_count() if facts.cuda_available else 0)
    assert facts.packages["accelerate"] == importlib.metadata.version("accelerate")
    assert facts.hostname_resolves is not None and facts.port_free is not None
    assert facts.libuv_ok is not None
    if facts.os_kind in ("linux", "wsl2"):
        assert facts.shm_mib and facts.shm_mib > 0
    # Every probe either succeeded or says why; either way the snapshot round-trips.
    again = Facts.from_dict(json.loads(facts.to_json()))
    assert again == facts
    diagnose(again)  # the rules accept a real snapshot


def test_collect_saves_and_loads(tmp_path):
    facts = probe.collect(quick=True)
    path = tmp_path / "facts.json"
    path.write_text(facts.to_json(), encoding="utf-8")
    assert Facts.load(path) == facts


# -- snapshots: fixtures load, garbage is refused with one line ----------------------------------------------
@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_fixture_round_trips(name):
    facts = Facts.load(MACHINES_DIR / f"{name}.json")
    assert Facts.from_dict(json.loads(facts.to_json())) == facts
    assert json.loads((MACHINES_DIR / f"{name}.json").read_text()) == facts.to_dict()


def test_fixtures_cover_every_machine_kind():
    kinds = {Facts.load(MACHINES_DIR / f"{n}.json").os_kind for n in MACHINE_NAMES}
    assert kinds == {"windows", "wsl2", "linux", "macos"}


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "cannot read facts file"),
        ("{not json", "is not valid JSON"),
        ('{"os_kind": "linux", "gpu_cnt": 3}', "unknown keys: gpu_cnt"),
        ('{"os_kind": "beos"}', "os_kind='beos'"),
        ("[1, 2]", "must be a JSON object"),
        ('{"cpu_count": "lots"}', "cpu_count should be int"),
        ('{"gpus": [{"name": "NVIDIA GeForce RTX 4090"}]}', "missing key 'index'"),
        ('{"gpus": "two"}', "gpus should be a list"),
        ('{"hostname_resolves": "yes"}', "hostname_resolves should be"),
    ],
)
def test_garbage_snapshot_raises_one_line(tmp_path, content, says):
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(XtrainError) as e:
        Facts.load(path)
    line = e.value.one_line()
    assert says in line and "\n" not in line
    assert str(path) in line and e.value.hint


# -- `xtrain train` plans from the same facts as doctor (quick mode) ------------------------------
def _rtx4090_rig(driver: str | None = None) -> Facts:
    from xtrain.machine.facts import GPU

    gpus = [GPU(i, "NVIDIA GeForce RTX 4090", 24564, (8, 9)) for i in range(2)]
    return Facts(
        os_kind="linux",
        torch_version="2.13.0+cu126",
        torch_cuda="12.6",
        cuda_available=True,
        nccl_available=True,
        gloo_available=True,
        gpus=gpus,
        cpu_count=16,
        nvidia_smi=True,
        driver_version=driver,
    )


class _FakeCuda:
    def __init__(self, peer: bool) -> None:
        self.peer = peer

    def can_device_access_peer(self, a: int, b: int) -> bool:
        return self.peer


def _quick_plan_facts(monkeypatch, tmp_path, peer: bool, driver: str) -> Facts:
    """Run the quick probes that matter for the plan on a simulated 2x RTX 4090 machine."""
    from types import SimpleNamespace

    exe = fake_smi(
        tmp_path,
        f'print("NVIDIA GeForce RTX 4090, 24564, {driver}\\n" * 2)\n',
    )
    monkeypatch.setattr(nvidia, "find_nvidia_smi", lambda: exe)
    monkeypatch.setattr(torch_stack, "loaded_torch", lambda: SimpleNamespace(cuda=_FakeCuda(peer)))
    facts = _rtx4090_rig()
    quick = dict(probe.QUICK_PROBES)
    for name in ("p2p", "driver", "env"):
        probe.run_probe(facts, name, quick[name])
    assert facts.probe_errors == {}
    return facts


@needs_posix
@pytest.mark.parametrize(
    "peer,driver,disabled",
    [
        (False, "566.36", True),  # a new driver reports the truth: no P2P between 4090s
        (True, "535.104.05", True),  # before 550.40.07 the report is wrong: P2P off anyway
        (True, "566.36", False),  # a matrix that says yes on a new driver is believed
    ],
)
def test_quick_probes_give_the_p2p_plan_doctor_gives(monkeypatch, tmp_path, peer, driver, disabled):
    from dataclasses import replace

    from xtrain.planning.rules import make_plan

    quick = _quick_plan_facts(monkeypatch, tmp_path, peer, driver)
    assert quick.driver_version == driver and quick.p2p == [[True, peer], [peer, True]]
    full = replace(_rtx4090_rig(driver), p2p=[[True, peer], [peer, True]], driver_cuda="12.7")
    assert make_plan(quick).env == make_plan(full).env
    assert ("NCCL_P2P_DISABLE" in make_plan(quick).env) is disabled


def test_quick_mode_asks_nvidia_smi_only_when_the_plan_needs_the_driver(monkeypatch):
    from dataclasses import replace

    from xtrain.machine.facts import GPU

    def no_subprocess(*args, **kwargs):
        raise AssertionError("no nvidia-smi call expected")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    a100s = replace(_rtx4090_rig(), gpus=[GPU(i, "NVIDIA A100-SXM4-80GB", 81920, (8, 0)) for i in range(2)])
    assert nvidia.probe_driver_for_plan(a100s) == {}
    one = replace(_rtx4090_rig(), gpus=_rtx4090_rig().gpus[:1])
    assert nvidia.probe_driver_for_plan(one) == {}
    assert nvidia.needs_driver_version(_rtx4090_rig())


def test_launch_variables_are_collected_in_both_modes(monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (a launch variable too: planning/threads.py)
    for quick in (True, False):
        names = [name for name, _ in (probe.QUICK_PROBES if quick else probe.FULL_PROBES)]
        assert {"env", "p2p"} <= set(names)
    facts = Facts()
    probe.run_probe(facts, "env", system_probes.probe_env)
    assert facts.launch_env == {"NCCL_P2P_DISABLE": "1", "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_what_quick_mode_skips_does_not_change_the_plan(name):
    """Blank every fact quick mode does not collect: each fixture's plan stays the same."""
    from dataclasses import replace

    from xtrain.planning.rules import make_plan

    full = Facts.load(MACHINES_DIR / f"{name}.json")
    quick = replace(full, hostname_resolves=None, libuv_error=None, port_free=None, driver_cuda=None)
    if quick.libuv_ok is not False or quick.os_kind == "windows":  # Windows plans without libuv anyway
        quick = replace(quick, libuv_ok=None)
    if not nvidia.needs_driver_version(full):
        quick = replace(quick, driver_version=None, smi_gpu_count=None, smi_gpu_names=[])
    assert make_plan(quick) == make_plan(full)
