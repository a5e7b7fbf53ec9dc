"""`xtrain quickstart`: the embedded default job. Offline, no arguments.

A short doctor summary, then a LoRA fine-tune of a small built-in model on built-in data on
every planned device (one process on a CPU-only machine; `--processes 2` takes the distributed
path), evaluation before and after, the adapter saved, and a closing table.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from xtrain.commands.options import parse_int
from xtrain.errors import XtrainError

DEFAULT_DIR = Path("xtrain-quickstart")
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# --task -> (the packaged job, None: xtrain/data/quickstart.yaml; the command to try next)
JOBS: dict[str, tuple[Path | None, str]] = {
    "seq-cls": (None, "xtrain train examples/seq-cls.yaml"),
    "image-to-text": (
        DATA_DIR / "quickstart-image-to-text.yaml",
        "xtrain train examples/image-to-text-ocr.yaml",
    ),
    "speech-to-text": (
        DATA_DIR / "quickstart-speech-to-text.yaml",
        "xtrain train examples/speech-to-text-words.yaml",
    ),
    "vision-language": (
        DATA_DIR / "quickstart-vision-language.yaml",
        "xtrain train examples/vision-language-qwen2-vl.yaml",
    ),
}


# --task -> the built-in data its job trains on, for a `xtrain predict` line on one of its eval inputs
PREDICT_DATA = {
    "image-to-text": "ocr-lines",
    "speech-to-text": "spoken-words",
    "vision-language": "shapes-vqa",
}


def predict_args(task: str) -> list[str] | None:
    """The inputs of a `xtrain predict` on a run of the ``task`` job: the first eval row of its
    built-in data (the image, the clip, or the image and its question); None: not a generative task."""
    from xtrain import builtin

    if task not in PREDICT_DATA:
        return None
    folder = builtin.ensure_builtin_data(PREDICT_DATA[task])  # already built by the run
    row = json.loads((folder / "eval.jsonl").read_text(encoding="utf-8").splitlines()[0])
    if task != "vision-language":
        return [str(folder / row["image" if task == "image-to-text" else "audio"])]
    parts = row["messages"][0]["content"]
    image = next(p["image"] for p in parts if p["type"] == "image")
    return [str(folder / image), "--question", next(p["text"] for p in parts if p["type"] == "text")]


def next_line(task: str, run_dir: Path, next_command: str, shell: str) -> str:
    """The closing ``Next:`` line: predict with the run just trained (generative tasks), then train
    on your own data."""
    from xtrain.shell import quote

    own = f"`{next_command}` for your own data (docs/configuration.md)."
    args = predict_args(task)
    if args is None:
        return f"Next: {own}"
    predict = " ".join(quote(shell, a) for a in ["xtrain", "predict", str(run_dir), *args])
    return f"Next: `{predict}` runs the adapter just trained; {own}"


def new_run_dir(root: Path) -> Path:
    """A fresh folder per run under ``root``: a quickstart never overwrites an earlier one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = root / f"run-{stamp}"
    k = 1
    while run.exists():
        k += 1
        run = root / f"run-{stamp}-{k}"
    return run


def read_result(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "train_result.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise XtrainError(f"the run left no readable {path}: {e}", "see the messages above") from None


def metric_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, before, after) rows: the evaluation at step 0 against the final one."""
    history = result.get("eval_history") or []
    before = next((h for h in history if h.get("step") == 0), {})
    after = result.get("eval_metrics") or (history[-1] if history else {})

    def fmt(d: dict[str, Any], key: str) -> str:
        return f"{d[key]:.4f}" if isinstance(d.get(key), (int, float)) else "-"

    keys = ["eval_loss"] + sorted(k for k in after if k not in ("eval_loss", "step"))
    return [(k, fmt(before, k), fmt(after, k)) for k in keys if k in after]


def run_rows(result: dict[str, Any], seconds: float) -> list[tuple[str, str]]:
    """(what, value) rows: how the run went and where its files are."""
    world, accumulation = result.get("world_size", 1), result.get("accumulation", 1)
    global_batch = result.get("global_batch", 0)
    per_device = global_batch // max(1, world * accumulation)
    rows = [
        ("optimizer steps", str(result.get("final_step", "-"))),
        (
            "global batch",
            f"{global_batch} = {per_device} per-device x {world} process(es) x {accumulation} accumulation",
        ),
        ("samples/s", f"{result.get('samples_per_s', 0):.1f}"),
        ("wall time", f"{seconds:.1f} s (start-up included)"),
    ]
    rows += [(name, str(path)) for name, path in sorted((result.get("outputs") or {}).items())]
    return rows


# The headline metric of each generative task: (metric, its name, what it means).
HEADLINES = {
    "image-to-text": ("cer", "CER", "share of characters wrong; 0 is perfect"),  # OCR: lower is better
    "speech-to-text": ("wer", "WER", "share of words wrong; 0 is perfect"),  # ASR
    "vision-language": ("exact_match", "exact match", "share of answers right; 1 is perfect"),  # VQA
}


def _print_result(console: Any, cfg: Any, result: dict[str, Any], seconds: float) -> None:
    """The before/after metrics, the headline, sample predictions and where the run went."""
    from rich.table import Table

    how = "LoRA" if cfg.lora.enabled else "full fine-tune"
    console.print(
        f"\n[bold]quickstart:[/] {cfg.model.task} {how} on {cfg.model.name_or_path}", soft_wrap=True
    )
    table = Table()
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for row in metric_rows(result):
        table.add_row(*row)
    console.print(table)
    if cfg.model.task in HEADLINES:
        key, name, meaning = HEADLINES[cfg.model.task]
        found = next(((b, a) for k, b, a in metric_rows(result) if k == key), None)
        if found is not None:
            console.print(f"{name} {found[0]} -> {found[1]} ({meaning})")
    for sample in result.get("predictions") or []:
        console.print(f"  {sample['reference']!r} -> {sample['prediction']!r}", soft_wrap=True, markup=False)
    runs = Table(show_header=False, box=None, padding=(0, 2))
    for what, value in run_rows(result, seconds):
        runs.add_row(what, value)
    console.print(runs)


def quickstart(
    task: str = typer.Option(
        "seq-cls",
        "--task",
        help="The built-in job: seq-cls (text classification), image-to-text (OCR), speech-to-text (ASR) "
        "or vision-language (questions about images).",
    ),
    processes: str = typer.Option(
        None, "--processes", "-n", help="Processes (default: one per GPU; one on CPU)."
    ),
    output_dir: Path = typer.Option(DEFAULT_DIR, "--output-dir", help="Runs go to a new folder in here."),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Offline LoRA fine-tune of a built-in model on built-in data, end to end (about a minute)."""

    from xtrain.commands.train import launch_training
    from xtrain.console import make_console
    from xtrain.planning.resolve import resolve
    from xtrain.shell import shell_for
    from xtrain.train.config.loading import load_config

    console = make_console()
    if task not in JOBS:
        raise XtrainError(f"unknown quickstart task '{task}'", f"use --task {' or --task '.join(JOBS)}")
    job, next_command = JOBS[task]
    n = parse_int(processes, "--processes", 1, example="e.g. --processes 2")
    diagnosis = resolve(processes=n, platform=platform, full_probe=True)
    worst = {s: sum(f.severity == s for f in diagnosis.findings) for s in ("warn", "error")}
    console.print(
        f"[bold]doctor:[/] {worst['error']} error(s), {worst['warn']} warning(s) "
        "(`xtrain doctor` explains them)",
        soft_wrap=True,
    )
    for f in diagnosis.findings:
        if f.severity == "error":
            console.print(f"  [red]error[/] {f.code}: {f.message}", soft_wrap=True)

    run_dir = new_run_dir(output_dir)
    overrides = [f"run.output_dir={run_dir.as_posix()}", "run.eval_at_start=true"]
    cfg = load_config(job, overrides)
    world = diagnosis.plan.world_size
    fixed = cfg.batch.global_batch or cfg.batch.per_device
    if fixed % (cfg.batch.per_device * world) and fixed % world == 0:
        # e.g. 4 or 8 GPUs: smaller micro-batches keep the same global batch (and result)
        overrides.append(f"batch.per_device={fixed // world}")
        cfg = load_config(job, overrides)
    plan = resolve(cfg, processes=n, platform=platform, facts=diagnosis.facts).plan
    started = time.perf_counter()
    run_argv = ["--config", str(job), *overrides] if job is not None else overrides
    code = launch_training(plan, run_argv, console)
    if code != 0:
        raise typer.Exit(code)
    seconds = time.perf_counter() - started

    _print_result(console, cfg, read_result(run_dir), seconds)
    shell = shell_for(diagnosis.plan.os_kind)
    console.print(next_line(task, run_dir, next_command, shell), soft_wrap=True, markup=False)
