"""The benchmarks cannot rot: ``benchmarks/run_all.py --smoke`` runs every section once with the
smallest settings (and resolves every import in benchmarks/*.py), renders the page, and writes
nothing into docs/. The default suite runs its one-process sections (``DEFAULT``), ``-m soak``
all. Each task benchmark's lines name its own task and job (issue 24: the
speech-to-text section used to print the image job's lines)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEADER = re.compile(r"^\[\d\d:\d\d:\d\d\] == (\w+)$")

# section -> the label its log lines start with (after the time stamp)
LABELS = {
    "imports": "imports:",
    "loops": "loops:",
    "scaling": "scaling:",
    "ddp_parts": "ddp-parts:",
    "startup": "startup:",
    "resume": "resume:",
    "packing": "packing:",
    "fingerprint": "fingerprint ",
    "image_to_text": "image-to-text:",
    "speech_to_text": "speech-to-text:",
    "vision_language": "vision-language:",
    "image_classification": "image-classification:",
    "seq_cls": "seq-cls:",
    "quantization": "quantization:",
    "memory_estimate": "memory-estimate:",
    "export": "export:",
    "preference": "preference:",
    "reward": "reward:",
}
TASKS = {
    "image_to_text": ("image-to-text", "quickstart-image-to-text.yaml", "images/s"),
    "speech_to_text": ("speech-to-text", "quickstart-speech-to-text.yaml", "clips/s"),
    "vision_language": ("vision-language", "quickstart-vision-language.yaml", "samples/s"),
    "image_classification": ("image-classification", "quickstart-image-classification.yaml", "images/s"),
    "seq_cls": ("seq-cls", "quickstart.yaml", "sentences/s"),
}


def _sections(log: str) -> dict[str, list[str]]:
    """The log's lines under each ``== name`` header (the smoke run's own summary left out)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log.splitlines():
        match = HEADER.match(line)
        if match:
            current = blocks.setdefault(match.group(1), [])
        elif current is not None and "] smoke:" not in line:
            current.append(line)
    return blocks


def _docs_state() -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (REPO / "docs").rglob("*") if p.is_file()}


# The sections the default suite runs (one process, about 110 s of one core on CI's machine); the
# others (loops, scaling, ddp_parts, startup, resume, packing, vision_language, export: several
# processes each, 20-50 s apiece) run in the soak test, with these, as ``run_all.py --smoke`` does.
# Their code paths are the suite's own elsewhere (test_launch_modes, test_resume, test_export ...);
# what the soak test adds is that the benchmarks' own glue still runs.
DEFAULT = ("imports", "fingerprint", "image_to_text", "speech_to_text", "image_classification", "seq_cls",
           "memory_estimate", "chunked_loss", "quantization", "preference", "grpo", "reward")  # fmt: skip


def _smoke(tmp_path: Path, *args: str) -> tuple[str, dict, str]:
    """``run_all.py --smoke ARGS``: (its log, its JSON result, its page); nothing written into docs/."""
    env = dict(os.environ)
    env.update(
        TMPDIR=str(tmp_path),  # the page, the JSON and the benchmarks' scratch folders
        XTRAIN_CACHE=str(tmp_path / "xtrain-cache"),
        HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    docs_before = _docs_state()
    cmd = [sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--smoke", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    log = proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert _docs_state() == docs_before  # nothing written into docs/
    results = json.loads(next(tmp_path.glob("xtrain-performance-smoke-*.json")).read_text())
    assert results["smoke"] is True
    page = next(tmp_path.glob("xtrain-performance-smoke-*.md")).read_text()
    assert page.startswith("# Performance\n\n**Smoke run")
    return log, results, page


def _check_sections(log: str, results: dict, names: set[str]) -> None:
    """Each of ``names`` printed its own lines; each task section measured its own job."""
    blocks = _sections(log)
    assert names <= set(blocks), sorted(blocks)
    for name, label in LABELS.items():
        if name not in names:
            continue
        own = [line for line in blocks[name] if f"] {label}" in line]
        assert own, f"section {name} printed no '{label}' line:\n" + "\n".join(blocks[name][-20:])
    for name, (task, job, unit) in TASKS.items():
        if name not in names:
            continue
        lines = [line for line in blocks[name] if re.search(r"\] [a-z-]+: ", line)]
        labelled = [line for line in lines if any(f"] {t}:" in line for t, _, _ in TASKS.values())]
        assert labelled and all(f"] {task}:" in line for line in labelled), (name, labelled)
        assert all(unit in line and job in line for line in labelled), (name, labelled)
        assert f"smoke: {name} ran ({task}: {job})" in log
        assert (results[name]["task"], results[name]["job"]) == (task, job)
    for name in {"image_to_text", "speech_to_text", "image_classification"} & names:  # a loader worker too
        assert set(results[name]["data_share"]) == {"plain", "xtrain", "xtrain_worker"}


@pytest.mark.slow
def test_smoke_runs_the_one_process_sections_and_each_task_section_measures_its_own_job(tmp_path):
    log, results, page = _smoke(tmp_path, "--only", ",".join(DEFAULT))
    _check_sections(log, results, set(DEFAULT) & set(LABELS))
    assert "audio_s_per_s" in results["speech_to_text"] and "images_per_s" in results["image_to_text"]
    headings = ("## Image to text", "## Image classification", "## Speech to text", "## Text classification",
                "## The memory estimate against what autograd keeps")  # fmt: skip
    for heading in headings:
        assert heading in page


@pytest.mark.soak
def test_smoke_runs_every_benchmark_and_each_task_section_measures_its_own_job(tmp_path):
    log, results, page = _smoke(tmp_path)
    _check_sections(log, results, set(LABELS))
    assert "smoke: overhead ran from the loops run" in log
    assert set(results["vision_language"]["data_wait_share"]) == {"plain", "xtrain"}
    assert results["scaling"]["ceiling_speedup"] > 0
    for heading in ("## Vision-language", "## Resume cost"):
        assert heading in page


@pytest.mark.slow
def test_smoke_refuses_to_write_into_docs():
    cmd = [sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--smoke", "--out", "docs/perf.md"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2 and "--smoke writes nothing into docs/" in proc.stderr
    assert not (REPO / "docs" / "perf.md").exists()


def test_merge_into_replaces_only_the_named_sections_and_the_page_says_so():
    """``run_all.py --only S --merge-into RESULT``: the sections measured again replace theirs in
    the saved result, the rest stays, and the page's machine row names what was measured when."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import run_all

    saved = {"machine": {"commit": "old"}, "loops": {"x": 1}, "startup": {"x": 2, "measured": "T0"}}
    fresh = {"machine": {"commit": "new"}, "startup": {"x": 3, "measured": "T1"}}
    merged = run_all.merge(saved, fresh, ["startup"])
    assert merged["loops"] == {"x": 1} and merged["startup"] == {"x": 3, "measured": "T1"}
    assert merged["machine"] == {"commit": "old"}  # the page's machine is the first run's
    assert run_all._remeasured(merged) == "; measured again with `--only`: startup at T1 (`new`)"
    assert run_all._remeasured(saved) == ""
