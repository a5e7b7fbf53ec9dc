"""`xtrain doctor` end to end, as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import warm

from xtrain.machine.facts import GPU, Facts


def xtrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, "-m", "xtrain", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**__import__("os").environ, "COLUMNS": "100"},
    )


def windows_4090s() -> Facts:
    """Windows 11, two RTX 4090s, CUDA torch: warnings (gloo, libuv) but no errors."""
    return Facts(
        os_kind="windows",
        os_release="10.0.26100",
        hostname="DESKTOP-1",
        hostname_resolves=True,
        python="3.12.10",
        cpu_count=32,
        torch_version="2.13.0+cu126",
        torch_cuda="12.6",
        cuda_available=True,
        gloo_available=True,
        libuv_ok=False,
        nvidia_smi=True,
        driver_version="576.88",
        driver_cuda="12.9",
        smi_gpu_count=2,
        smi_gpu_names=["NVIDIA GeForce RTX 4090"] * 2,
        gpus=[GPU(i, "NVIDIA GeForce RTX 4090", 24564, (8, 9)) for i in range(2)],
        p2p=[[True, False], [False, True]],
        port_free=True,
    )


def cpu_torch_with_driver() -> Facts:
    """The classic Windows trap: a driver, but `pip install torch` gave the CPU build -> error."""
    f = windows_4090s()
    f.torch_version, f.torch_cuda, f.cuda_available, f.gpus, f.p2p = "2.13.0+cpu", None, False, [], None
    return f


def write(tmp_path: Path, name: str, facts: Facts) -> Path:
    path = tmp_path / name
    path.write_text(facts.to_json(), encoding="utf-8")
    return path


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode not in (0, 1), (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:")
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# -- this machine ---------------------------------------------------------------------------------
def test_doctor_on_this_machine():
    r = xtrain("doctor")
    assert r.returncode == 0, r.stderr
    for text in ("This machine", "torch", "Findings", "Plan:", "1 process, on cpu"):
        assert text in r.stdout


def test_doctor_json_is_the_only_stdout():
    r = xtrain("doctor", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"facts", "plan", "findings"}
    assert doc["plan"]["device"] == "cpu"
    assert Facts.from_dict(doc["facts"]).torch_version
    assert all({"code", "severity", "message", "fix"} <= set(f) for f in doc["findings"])


def test_import_cli_does_not_import_heavy_libraries():
    code = (
        "import sys, xtrain.cli; "
        "print([m for m in ('torch', 'transformers', 'peft', 'datasets', 'accelerate') if m in sys.modules])"
    )
    r = warm.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


@pytest.mark.slow
def test_smoke_two_gloo_processes():
    r = xtrain("doctor", "--smoke", "--processes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "smoke test passed: 2 processes, gloo on cpu" in r.stdout
    assert "busbw" in r.stdout and "GB/s" in r.stdout


@pytest.mark.slow
def test_smoke_json_windows_path():
    # The forced Windows plan runs the spawn launcher with USE_LIBUV=0; JSON stays clean.
    r = xtrain("doctor", "--smoke", "--processes", "2", "--platform", "windows", "--json")
    assert r.returncode == 0, r.stderr
    smoke = json.loads(r.stdout)["smoke"]
    assert smoke["ok"] and smoke["allreduce_ok"] and smoke["launcher"] == "spawn"
    assert smoke["world_size"] == 2 and smoke["backend"] == "gloo"
    assert [rk["value"] for rk in smoke["ranks"]] == [3.0, 3.0]
    assert smoke["busbw_gbps"] > 0


def test_smoke_single_process_needs_no_group():
    r = xtrain("doctor", "--smoke", "--json")
    assert r.returncode == 0, r.stderr
    smoke = json.loads(r.stdout)["smoke"]
    assert smoke["ok"] and smoke["world_size"] == 1 and smoke["allreduce_ok"] is None
    assert "no process group needed" in smoke["note"]


# -- snapshots ------------------------------------------------------------------------------------
def test_facts_file_windows_4090s(tmp_path):
    path = write(tmp_path, "win.json", windows_4090s())
    r = xtrain("doctor", "--facts", str(path))
    assert r.returncode == 0, r.stderr  # warnings only
    out = r.stdout
    assert "nccl-absent-windows" in out and "libuv" in out
    assert "2 processes, on cuda [0, 1], gloo, fp16" in out
    # fixes are whole lines, in PowerShell syntax, even in a 100-column terminal
    assert any(line.strip().startswith('$env:USE_LIBUV = "0"') for line in out.splitlines())
    assert "USE_LIBUV=0" in out  # the environment the plan sets for workers


def test_facts_file_with_an_error_exits_1(tmp_path):
    path = write(tmp_path, "cpu-torch.json", cpu_torch_with_driver())
    r = xtrain("doctor", "--facts", str(path))
    assert r.returncode == 1
    assert "cpu-torch-with-driver" in r.stdout and "Not ready" in r.stdout
    fix = next(line.strip() for line in r.stdout.splitlines() if "--index-url" in line)
    assert fix.startswith("python -m pip install") and fix.endswith("/cu126")  # driver 12.9 -> cu126

    doc = json.loads(xtrain("doctor", "--facts", str(path), "--json").stdout)
    assert any(f["severity"] == "error" for f in doc["findings"])


def test_save_then_facts_round_trip(tmp_path):
    snap = tmp_path / "machine.json"
    r = xtrain("doctor", "--save", str(snap), "--json")
    assert r.returncode == 0, r.stderr
    saved = Facts.load(snap)
    assert saved.to_dict() == json.loads(r.stdout)["facts"]
    again = xtrain("doctor", "--facts", str(snap), "--json")
    assert json.loads(again.stdout)["plan"] == json.loads(r.stdout)["plan"]

    before = snap.read_text()
    refused = xtrain("doctor", "--save", str(snap))
    assert_one_line_error(refused, "already exists", "--force")
    assert snap.read_text() == before  # never silently overwritten
    assert xtrain("doctor", "--save", str(snap), "--force", "--json").returncode == 0


def test_overrides_reach_the_plan(tmp_path):
    path = write(tmp_path, "win.json", windows_4090s())
    doc = json.loads(
        xtrain(
            "doctor", "--facts", str(path), "--json", "--gpus", "1", "--precision", "bf16", "--port", "29600"
        ).stdout
    )
    plan = doc["plan"]
    assert plan["gpu_ids"] == [1] and plan["num_processes"] == 1 and plan["backend"] is None
    assert plan["mixed_precision"] == "bf16" and plan["main_port"] == 29600


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--processes", "two"], "--processes needs a whole number"),
        (["--gpus", "0;1"], "not a list of GPU ids"),
        (["--precision", "fp8"], "--precision"),
        (["--port", "99999"], "--port"),
        (["--facts", "does-not-exist.json"], "cannot read facts file"),
        (["--save", "no-such-folder/machine.json"], "does not exist"),
    ],
)
def test_bad_input_is_one_line(args, needle, tmp_path):
    assert_one_line_error(xtrain("doctor", *args, cwd=tmp_path), needle)


def test_bad_facts_files_are_one_line(tmp_path):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json", encoding="utf-8")
    assert_one_line_error(xtrain("doctor", "--facts", str(garbage)), "not valid JSON")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"os_kind": "linux", "colour": "blue"}), encoding="utf-8")
    assert_one_line_error(xtrain("doctor", "--facts", str(wrong)), "unknown keys")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(xtrain("doctor", "--save", str(blocker / "machine.json")), "not a folder")
    # a valid snapshot, but the override does not fit it
    path = write(tmp_path, "win.json", windows_4090s())
    assert_one_line_error(xtrain("doctor", "--facts", str(path), "--gpus", "0,5"), "GPU 5")
    assert_one_line_error(xtrain("doctor", "--facts", str(path), "--smoke"), "--smoke")


# -- rendering every saved machine (in-process: fast) -------------------------------------------------
MACHINES = sorted((Path(__file__).parent / "fixtures" / "machines").glob("*.json"))


@pytest.mark.parametrize("path", MACHINES, ids=[p.stem for p in MACHINES])
def test_render_every_fixture_machine(path):
    from rich.console import Console

    from xtrain.commands.render import render_diagnosis
    from xtrain.planning.resolve import diagnose

    facts = Facts.load(path)
    diagnosis = diagnose(facts)
    console = Console(record=True, width=80, color_system=None)
    render_diagnosis(console, facts, diagnosis)
    text = console.export_text()
    assert diagnosis.plan.summary() in text.replace("\n", "")  # soft-wrapped: one logical line
    lines = [line.strip() for line in text.splitlines()]
    for f in diagnosis.findings:
        assert f.code in text
        for fix_line in (f.fix or "").splitlines():  # each line of a fix printed whole
            assert fix_line in lines, f"fix of {f.code} was wrapped: {fix_line!r}"
