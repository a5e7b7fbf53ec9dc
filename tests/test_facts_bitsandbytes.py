"""bitsandbytes in the facts and the doctor: its backends told from the library file names (the
rule bitsandbytes 0.50 itself loads by), the probe (no import), and the findings on the saved
snapshots, with the pip line in each shell."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import load_machine

from xtrain.machine import quant_support
from xtrain.machine.facts import Facts
from xtrain.planning.resolve import diagnose

REPO = Path(__file__).resolve().parents[1]
WHEEL = ["cpu", "cuda118", "cuda121", "cuda124", "cuda126", "cuda128", "cuda130", "cuda132"]


def _finding(facts: Facts, prefix: str = "bitsandbytes"):
    found = [f for f in diagnose(facts).findings if f.code.startswith(prefix)]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_backends_from_file_names_and_the_cuda_library_bitsandbytes_picks():
    names = ["__init__.py", "libbitsandbytes_cpu.so", "libbitsandbytes_cuda126.dll",
             "libbitsandbytes_cuda130.so", "libbitsandbytes_rocm64.so", "libbitsandbytes_xpu2025.so",
             "libbitsandbytes_cuda128.dylib", "cextension.py"]  # fmt: skip
    assert quant_support.library_backends(names) == [
        "cpu",
        "cuda126",
        "cuda128",
        "cuda130",
        "rocm64",
        "xpu2025",
    ]
    pick = quant_support.cuda_library_for
    assert pick("12.6", WHEEL) == "cuda126"  # exact
    assert pick("12.9", WHEEL) == "cuda128"  # the newest older one of the same major
    assert pick("12.0", WHEEL) == "cuda121"  # none older in 12.x: the oldest newer one
    assert pick("13.0", ["cpu", "cuda126", "cuda128"]) is None  # never another major
    assert pick("", WHEEL) is None


def test_the_minimum_is_the_one_pyproject_pins():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    pins = set(re.findall(r'"bitsandbytes>=([\d.]+)"', pyproject))
    assert pins == {quant_support.MIN_BITSANDBYTES}  # the quantization extra and dev


def test_the_probe_lists_the_installed_build_without_importing_it():
    code = (
        "import sys\nfrom xtrain.machine.facts import Facts\n"
        "from xtrain.machine.probes.system import probe_bitsandbytes, probe_packages\n"
        "f = Facts(); print(probe_packages(f)['packages']['bitsandbytes'], "
        "probe_bitsandbytes(f)['bitsandbytes_backends'], "
        "'bitsandbytes' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    version, rest = out.stdout.split(" ", 1)
    if version == "None":
        pytest.skip("bitsandbytes is not installed here")
    assert "'cpu'" in rest and rest.rstrip().endswith("False False")  # listed, nothing imported


def test_findings_on_the_4090_snapshots_and_their_pip_lines():
    windows, wsl2 = load_machine("windows-2x4090"), load_machine("wsl2-2x4090")
    ok = _finding(windows)
    assert ok.code == "bitsandbytes" and ok.severity == "ok" and "cuda126" in ok.message
    # not installed: a hint (only quantization and the 8-bit optimizers need it), the pip line per shell
    missing = _finding(replace(windows, packages={**windows.packages, "bitsandbytes": None}))
    assert missing.code == "bitsandbytes-missing" and missing.severity == "ok"
    exe = r"C:\Users\alex\xtrain\.venv\Scripts\python.exe"
    assert missing.fix == exe + " -m pip install 'bitsandbytes>=0.46.1'"
    missing = _finding(replace(wsl2, packages={**wsl2.packages, "bitsandbytes": None}))
    assert missing.fix == f"{wsl2.python_executable} -m pip install 'bitsandbytes>=0.46.1'"
    # too old
    old = _finding(replace(windows, packages={**windows.packages, "bitsandbytes": "0.45.5"}))
    assert old.code == "bitsandbytes-old" and old.severity == "warn" and "0.45.5" in old.message
    assert old.fix.endswith("-m pip install --upgrade 'bitsandbytes>=0.46.1'")
    # a CUDA 13 torch with a build whose newest library is CUDA 12.8: loading would fail
    cu13 = replace(windows, torch_cuda="13.0", torch_version="2.13.0+cu130",
                   bitsandbytes_backends=["cpu", "cuda124", "cuda126", "cuda128"])  # fmt: skip
    wrong = _finding(cu13)
    assert wrong.code == "bitsandbytes-no-backend" and wrong.severity == "warn"
    assert "CUDA 13.0" in wrong.message and "cuda128" in wrong.message and "\n" not in wrong.message
    assert wrong.fix.endswith("-m pip install --upgrade --force-reinstall --no-deps 'bitsandbytes>=0.46.1'")
    # a CPU torch needs the CPU library
    cpu = replace(wsl2, torch_cuda=None, bitsandbytes_backends=["cuda126"])
    assert _finding(cpu).code == "bitsandbytes-no-backend"
    assert _finding(replace(cpu, bitsandbytes_backends=["cpu"])).code == "bitsandbytes"


def test_snapshots_from_before_bitsandbytes_was_probed_load_and_say_nothing(machines_dir):
    saved = load_machine("linux-cpu").to_dict()
    del saved["bitsandbytes_backends"]  # a snapshot saved before the field existed
    linux = Facts.from_dict(saved)
    assert "bitsandbytes" not in linux.packages and linux.bitsandbytes_backends is None
    assert _finding(linux) is None
    # installed, backends unknown (probe failed): the version alone
    known = replace(linux, packages={**linux.packages, "bitsandbytes": "0.50.2"})
    assert _finding(known).message == "bitsandbytes 0.50.2 is installed."
    assert Facts.from_dict(load_machine("windows-2x4090").to_dict()).bitsandbytes_backends[:2] == [
        "cpu",
        "cuda118",
    ]
