"""Every fix doctor prints runs as printed in the user's shell: snapshot tests per finding.

For each finding code with a fix, on every fixture machine where it fires (and on variants of the
fixtures made to fire the rest, in both shells), each fix line is a ``#`` comment or a command:
bash lines pass ``bash -n`` and start with a known program; PowerShell lines pass the small
syntax check in ``tests/support/ps_syntax.py``. No line carries trailing prose. Interpreter paths with spaces,
backslashes, quotes and non-ASCII names reach the program unchanged.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MACHINE_NAMES, load_machine
from support.ps_syntax import PsSyntaxError, check_line

from xtrain.machine.facts import GPU, Facts
from xtrain.planning.plan import Finding, Overrides
from xtrain.planning.resolve import diagnose

BASH_COMMANDS = {"export", "unset", "sudo", "echo", "nvidia-smi", "xtrain", "wsl"}
PS_COMMANDS = {"Remove-Item", "Rename-Computer", "Add-Content", "nvidia-smi", "xtrain", "wsl"}
PYTHON = re.compile(r"(^|/)python3?$")

# Interpreter paths that must survive quoting (sys.executable as Windows and Linux report it).
WINDOWS_EXES = [
    r"C:\Users\alex\xtrain\.venv\Scripts\python.exe",
    r"C:\Users\Jörg\LoRA runs\.venv\Scripts\python.exe",
    r"C:\Users\O'Brien\My Projects\.venv\Scripts\python.exe",
    "C:\\Users\\O\u2019Brien\\x\\.venv\\Scripts\\python.exe",
    r"D:\$work\a,b\python.exe",
]
POSIX_EXES = [
    "/home/alex/xtrain/.venv/bin/python",
    "/home/jörg/LoRA runs/.venv/bin/python",
    "/home/o'brien/x/.venv/bin/python3",
]


def _variants(base: Facts) -> list[tuple[str, Facts, Overrides]]:
    """The fixture plus one change per finding that has a fix, so every fix is printed."""
    cpu_torch = replace(
        base, torch_cuda=None, nvidia_smi=True, driver_cuda="12.9", cuda_available=False, gpus=[]
    )
    gpus = [
        GPU(0, "NVIDIA GeForce RTX 4090", 24564, (8, 9)),
        GPU(1, "NVIDIA GeForce RTX 4090", 24564, (8, 9)),
    ]
    two = replace(base, torch_cuda="12.6", cuda_available=True, nvidia_smi=True, gpus=gpus, smi_gpu_count=2)
    return [
        ("as saved", base, Overrides()),
        ("torch missing", replace(base, torch_version=None, torch_cuda=None), Overrides()),
        ("torch missing, driver", replace(base, torch_version=None, torch_cuda=None, nvidia_smi=True),
         Overrides()),
        ("cpu torch", cpu_torch, Overrides()),
        ("cpu torch, old driver", replace(cpu_torch, driver_cuda="11.4"), Overrides()),
        ("cpu torch, cuda 13", replace(cpu_torch, driver_cuda="13.0"), Overrides()),
        ("cuda unusable", replace(two, cuda_available=False, gpus=[]), Overrides()),
        ("driver major too old", replace(two, torch_cuda="13.0", driver_cuda="12.9"), Overrides()),
        ("driver major too old, none fits", replace(two, torch_cuda="12.6", driver_cuda="11.8"), Overrides()),
        ("driver minor older", replace(two, torch_cuda="12.8", driver_cuda="12.4"), Overrides()),
        ("no nccl", replace(two, nccl_available=False), Overrides()),
        ("no gloo", replace(two, gloo_available=False, nccl_available=False), Overrides()),
        ("libuv", replace(two, libuv_ok=False, libuv_error="RuntimeError: no libuv"), Overrides()),
        ("p2p", replace(two, nccl_available=True, driver_version="535.1", p2p=[[True, False], [False, True]]),
         Overrides()),
        ("shm", replace(two, nccl_available=True, shm_mib=64), Overrides()),
        ("hostname empty", replace(two, hostname=""), Overrides()),
        ("hostname empty, 2 machines", replace(two, hostname=""),
         Overrides(num_machines=2, main_address="192.168.1.10")),
        ("hostname unresolvable", replace(two, hostname_resolves=False), Overrides()),
        ("hostname unresolvable, 2 machines", replace(two, hostname_resolves=False),
         Overrides(num_machines=2, main_address="192.168.1.10")),
        ("port busy", replace(two, port_free=False), Overrides()),
        ("cuda visible devices", replace(two, cuda_visible_devices="0", smi_gpu_count=3), Overrides()),
        ("mismatched", replace(two, gpus=[gpus[0], GPU(1, "NVIDIA GeForce RTX 3090", 24576, (8, 6))]),
         Overrides()),
        ("packages", replace(two, packages={"accelerate": None, "peft": None}), Overrides()),
        ("config invalid", replace(two, accelerate_config_error="had unknown keys"), Overrides()),
        ("config mismatch", replace(two, accelerate_config={"distributed_type": "NO", "num_processes": 1}),
         Overrides()),
        ("deepspeed", replace(two, accelerate_config={"distributed_type": "DEEPSPEED", "num_processes": 2}),
         Overrides(platform="windows")),
        ("fsdp", replace(two, accelerate_config={"distributed_type": "FSDP", "num_processes": 2}),
         Overrides(platform="windows")),
        ("probe failed", replace(two, probe_errors={"nvidia_smi": "TimeoutExpired"}), Overrides()),
        ("fp16 over bf16 weights", two, Overrides(mixed_precision="fp16", weights_dtype="bfloat16")),
        ("fp16 over bf16 weights, no fast bf16",
         replace(two, gpus=[replace(g, capability=(7, 5)) for g in gpus]),
         Overrides(mixed_precision="fp16", weights_dtype="bfloat16")),
        ("bitsandbytes missing", replace(two, packages={"bitsandbytes": None}), Overrides()),
        ("bitsandbytes old", replace(two, packages={"bitsandbytes": "0.45.5"}), Overrides()),
        ("bitsandbytes without cuda", replace(two, packages={"bitsandbytes": "0.50.2"},
                                              bitsandbytes_backends=["cpu"]), Overrides()),
    ]  # fmt: skip


def _cases() -> list[tuple[str, Facts, Overrides]]:
    cases = []
    for name in MACHINE_NAMES:
        for label, facts, ov in _variants(load_machine(name)):
            cases.append((f"{name}: {label}", facts, ov))
            if facts.os_kind != "windows":  # the same machine as seen from PowerShell
                cases.append((f"{name}: {label} (windows)", facts, replace(ov, platform="windows")))
    return cases


CASES = _cases()


def _fixes(facts: Facts, ov: Overrides) -> tuple[str, list[Finding]]:
    d = diagnose(facts, ov)
    return d.plan.shell, [f for f in d.findings if f.fix]


def check_bash_lines(lines: list[str], tmp: Path) -> None:
    script = tmp / "fix.sh"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, f"bash -n: {done.stderr}\n" + "\n".join(lines)
    for line in lines:
        assert line == line.strip() and line, repr(line)
        if line.startswith("#"):
            continue
        for part in re.split(r"\s*(?:;|\|)\s*(?=(?:[^'\"]|'[^']*'|\"[^\"]*\")*$)", line):
            first = shlex.split(part)[0]
            assert first in BASH_COMMANDS or PYTHON.search(first), f"{first!r} is not a command: {line}"


def check_powershell_lines(lines: list[str]) -> None:
    for line in lines:
        check_line(line, PS_COMMANDS)


def test_cases_cover_every_finding_with_a_fix() -> None:
    import xtrain.planning.checks
    import xtrain.planning.rules

    files = [Path(xtrain.planning.rules.__file__), *Path(xtrain.planning.checks.__file__).parent.glob("*.py")]
    source = "".join(f.read_text(encoding="utf-8") for f in files)
    codes = set(re.findall(r'Finding\(\s*"([a-z0-9-]+)"', source))
    seen_fix = {f.code for _, facts, ov in CASES for f in _fixes(facts, ov)[1]}
    info_only = {
        "gpus",
        "cpu-only",
        "mps",
        "accelerate-config",
        "accelerate-config-missing",
        "wsl2-pinned-memory",
        "bitsandbytes",
    }
    assert codes - info_only <= seen_fix, sorted(codes - info_only - seen_fix)
    assert info_only & seen_fix == set(), "an info finding got a fix: add it to the checked codes"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("label,facts,ov", CASES, ids=[c[0] for c in CASES])
def test_fix_lines_are_runnable(label: str, facts: Facts, ov: Overrides, tmp_path: Path) -> None:
    shell, fixes = _fixes(facts, ov)
    for f in fixes:
        lines = f.fix.splitlines()
        assert lines, f.code
        try:
            if shell == "bash":
                check_bash_lines(lines, tmp_path)
            else:
                check_powershell_lines(lines)
        except (AssertionError, PsSyntaxError) as e:
            raise AssertionError(f"{label}: {f.code}: {e}") from None


@pytest.mark.parametrize("exe", WINDOWS_EXES)
def test_windows_pip_line_quotes_the_interpreter(exe: str) -> None:
    facts = replace(load_machine("windows-cpu-torch-with-driver"), python_executable=exe)
    fix = next(f.fix for f in diagnose(facts).findings if f.code == "cpu-torch-with-driver")
    (line,) = fix.splitlines()
    (words,) = check_line(line, PS_COMMANDS)
    assert words[0][1] == exe  # the program PowerShell starts is exactly sys.executable
    assert [w[1] for w in words[1:]] == [
        "-m",
        "pip",
        "install",
        "--force-reinstall",
        "torch==2.13.0",
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
    ]
    if " " in exe or "'" in exe:
        assert line.startswith("& '")


@pytest.mark.parametrize("exe", POSIX_EXES)
def test_bash_pip_line_quotes_the_interpreter(exe: str, tmp_path: Path) -> None:
    facts = replace(
        load_machine("wsl2-2x4090"), torch_cuda=None, cuda_available=False, gpus=[], python_executable=exe
    )
    fix = next(f.fix for f in diagnose(facts).findings if f.code == "cpu-torch-with-driver")
    check_bash_lines(fix.splitlines(), tmp_path)
    argv = shlex.split(fix)
    assert argv[0] == exe and argv[1:4] == ["-m", "pip", "install"]
    # and bash itself agrees: print the words it would pass
    done = subprocess.run(["bash", "-c", "printf '%s\\n' " + fix], capture_output=True, text=True)
    assert done.stdout.splitlines()[0] == exe


def test_the_powershell_check_rejects_what_used_to_be_printed() -> None:
    bad = [
        "Rename-Computer -NewName xtrain-pc (as Administrator, then reboot)",
        'Add-Content C:\\Windows\\System32\\drivers\\etc\\hosts "127.0.0.1 HOST" (as Administrator)',
        "update the NVIDIA driver when convenient",
        "Remove-Item Env:CUDA_VISIBLE_DEVICES   (or choose GPUs with --gpus)",
        "xtrain configure --gpus 0,1",
        "& C:\\x\\python.exe -m pip",
        "$env:USE_LIBUV=0",
        '$env:X = "a$b"',
        "xtrain doctor && xtrain configure",
        "& 'C:\\Users\\O'Brien\\python.exe' -m pip",
    ]
    for line in bad:
        with pytest.raises(PsSyntaxError):
            check_line(line, PS_COMMANDS)
    good = [
        '$env:USE_LIBUV = "0"',
        '$env:NCCL_P2P_DISABLE = "1"; $env:NCCL_IB_DISABLE = "1"',
        "$env:GLOO_SOCKET_IFNAME = (Get-NetIPAddress -IPAddress 127.0.0.1).InterfaceAlias",
        "& 'C:\\Users\\O''Brien\\python.exe' -m pip install torch==2.13.0",
        "xtrain configure --gpus '0,1' --force",
        "# a comment (with prose)",
    ]
    for line in good:
        check_line(line, PS_COMMANDS)


def test_the_bash_check_rejects_prose(tmp_path: Path) -> None:
    for line in (
        "xtrain configure --port 29501   (or stop the other job)",
        "update the NVIDIA driver when convenient",
        "sudo mount -o remount,size=8G /dev/shm (or set NCCL_SHM_DISABLE=1)",
    ):
        with pytest.raises(AssertionError):
            check_bash_lines([line], tmp_path)


def test_gloo_hostname_fix_pins_loopback_not_a_rename() -> None:
    base = replace(load_machine("windows-2x4090"), hostname_resolves=False)
    win = next(f for f in diagnose(base).findings if f.code == "hostname-unresolvable")
    assert win.severity == "warn"
    assert (
        win.fix.splitlines()[-1]
        == "$env:GLOO_SOCKET_IFNAME = (Get-NetIPAddress -IPAddress 127.0.0.1).InterfaceAlias"
    )
    assert "Rename-Computer" not in win.fix
    linux = replace(load_machine("linux-2x3090"), hostname="")
    f = next(f for f in diagnose(linux).findings if f.code == "hostname-empty")
    assert f.fix == "export GLOO_SOCKET_IFNAME=lo"
    mac = replace(load_machine("macos-arm64"), hostname_resolves=False)
    assert next(f for f in diagnose(mac).findings if f.code == "hostname-unresolvable").fix == (
        "export GLOO_SOCKET_IFNAME=lo0"
    )
    # already pinned: nothing to fix on one machine
    pinned = replace(linux, launch_env={"GLOO_SOCKET_IFNAME": "lo"})
    assert "hostname-empty" not in {f.code for f in diagnose(pinned).findings}
    # several machines: loopback would be wrong; the name must resolve to the LAN address
    two = diagnose(replace(linux, hostname="x", hostname_resolves=False),
                   Overrides(num_machines=2, main_address="10.0.0.1"))  # fmt: skip
    f = next(f for f in two.findings if f.code == "hostname-unresolvable")
    assert f.severity == "error" and "/etc/hosts" in f.fix and "GLOO_SOCKET_IFNAME=lo" not in f.fix


@pytest.mark.parametrize(
    "torch_version,driver_cuda,driver_version,cc,tag",
    [
        ("2.13.0+cpu", "12.9", None, 8.9, "cu126"),
        ("2.13.0+cpu", "13.0", None, 8.9, "cu130"),
        ("2.13.0+cpu", "13.0", None, 6.1, "cu126"),  # CUDA 13 builds need cc >= 7.5
        ("2.13.0+cpu", "12.2", None, 8.9, "cu126"),  # minor-version compatibility
        ("2.13.0+cpu", "11.8", None, 8.9, None),  # update the driver
        ("2.11.0+cpu", "12.9", None, 8.9, "cu128"),
        ("2.12.1+cpu", "13.2", None, 8.9, "cu132"),
        ("2.13.0+cpu", None, "581.15", 8.9, "cu130"),  # no CUDA line: from the driver branch
        ("2.13.0+cpu", None, "560.94", 8.9, "cu126"),
        ("2.13.0+cpu", None, None, None, "cu126"),  # unknown driver: the broadest CUDA 12 build
        ("2.99.0", "13.0", None, 8.9, "cu130"),  # newer than the table: its newest row
    ],
)
def test_wheel_tag_table(torch_version, driver_cuda, driver_version, cc, tag) -> None:
    from xtrain.machine.torch_wheels import pick_tag

    assert pick_tag(torch_version, driver_cuda, driver_version, cc) == tag


def test_pip_line_pins_the_installed_torch_release() -> None:
    facts = replace(
        load_machine("windows-cpu-torch-with-driver"), torch_version="2.11.0+cpu", driver_cuda="12.9"
    )
    fix = next(f.fix for f in diagnose(facts).findings if f.code == "cpu-torch-with-driver")
    assert "torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128" in fix
