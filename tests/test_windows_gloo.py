"""Windows torch builds without gloo's transport (pytorch#150381): which releases, doctor's finding
with the install line for the driver, and `xtrain train` refusing in one line before any process
starts. Pure rules on the `windows-2x4090-torch28` snapshot, plus the CLI in-process."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import MACHINES_DIR, load_machine

from xtrain.machine.torch_wheels import windows_gloo_broken
from xtrain.planning.checks.comms import windows_gloo_refusal
from xtrain.planning.plan import Overrides
from xtrain.planning.resolve import diagnose
from xtrain.planning.rules import make_plan

BROKEN = "windows-2x4090-torch28"


@pytest.mark.parametrize(
    ("version", "broken"),
    [
        # checked in the PyPI win_amd64 wheels (torch_cpu.dll with or without makeUVDevice)
        ("2.6.0", False),
        ("2.7.0", False),
        ("2.7.1+cu128", False),
        ("2.8.0+cu128", True),
        ("2.9.0", True),
        ("2.9.1+cu130", True),
        ("2.10.0+cu126", True),
        ("2.11.0+cu128", False),
        ("2.12.0", False),
        ("2.13.0+cu126", False),
        # nightlies: inferred from the fix's merge date (2025-12-16)
        ("2.8.0.dev20250601+cu128", True),
        ("2.11.0.dev20251210+cu128", True),
        ("2.11.0.dev20251220+cu128", False),
        (None, False),
        ("unknown", False),
    ],
)
def test_which_releases_lack_the_transport(version, broken):
    assert windows_gloo_broken(version) is broken


def gloo_finding(facts, overrides=None):
    found = [f for f in diagnose(facts, overrides).findings if f.code == "gloo-windows-broken"]
    return found[0] if found else None


def test_two_processes_are_an_error_with_the_install_line_for_the_driver():
    f = gloo_finding(load_machine(BROKEN))
    assert f is not None and f.severity == "error"
    assert "2.8.0+cu128" in f.message and "pytorch#150381" in f.message
    commands = [line for line in f.fix.splitlines() if not line.startswith("#")]
    # driver CUDA 12.9: 2.13's newest build it runs is cu126
    assert commands == [
        r"C:\Users\alex\xtrain\.venv\Scripts\python.exe -m pip install torch==2.13.0 "
        "--index-url https://download.pytorch.org/whl/cu126"
    ]
    # (PowerShell syntax of every fix line: tests/test_fix_lines.py, over every fixture machine)


def test_one_process_is_a_warning_and_trains():
    f = gloo_finding(load_machine(BROKEN), Overrides(num_processes=1))
    assert f is not None and f.severity == "warn" and "one process trains" in f.message
    one = make_plan(load_machine(BROKEN), Overrides(num_processes=1))
    assert windows_gloo_refusal(load_machine(BROKEN), one) is None


def test_an_old_driver_gets_the_last_release_before_the_break():
    # a CUDA 11.8 driver runs no build of 2.13 (cu126/cu130) but 2.7.1's cu118
    facts = replace(load_machine(BROKEN), driver_cuda="11.8", driver_version="522.06")
    f = gloo_finding(facts)
    assert "torch==2.7.1 --index-url https://download.pytorch.org/whl/cu118" in f.fix
    # and a driver too old for both: update it first
    older = replace(facts, driver_cuda="10.2", driver_version="441.22")
    assert "nvidia-smi" in gloo_finding(older).fix.splitlines()


@pytest.mark.parametrize("name", ["windows-2x4090", "wsl2-2x4090", "linux-2x3090"])
def test_other_machines_and_linux_builds_are_not_flagged(name):
    facts = load_machine(name)
    assert gloo_finding(facts) is None
    # the same torch 2.8 on Linux/WSL2 has its tcp transport: nothing to say
    if facts.os_kind != "windows":
        assert gloo_finding(replace(facts, torch_version="2.8.0+cu128")) is None


def test_train_refuses_in_one_line_before_any_process_starts(tmp_path, monkeypatch, capsys):
    """The real path (no --dry-run): the probe is this snapshot, and no launcher may run."""
    from support.jobs import REPO

    import xtrain.commands.launching as train_cmd
    from xtrain.cli import main
    from xtrain.machine import probe

    monkeypatch.setattr(probe, "collect", lambda **_: load_machine(BROKEN))
    monkeypatch.setattr(train_cmd, "launch_training", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    code = main(["train", str(REPO / "examples" / "seq-cls.yaml"), "--platform", "windows"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert "torch 2.8.0+cu128 for Windows cannot start 2 processes" in err
    assert "pip install torch==2.13.0" in err and "--processes 1" in err


@pytest.mark.usefixtures("private_caches")  # the built-in model of the example, built once a session
def test_dry_run_shows_the_line(capsys):
    from support.jobs import REPO

    from xtrain.cli import main

    facts = MACHINES_DIR / f"{BROKEN}.json"
    code = main(["train", str(REPO / "examples" / "seq-cls.yaml"), "--dry-run", "--facts", str(facts)])
    out = capsys.readouterr().out
    assert code == 0
    assert "error: torch 2.8.0+cu128 for Windows cannot start 2 processes" in out
