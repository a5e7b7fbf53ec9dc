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


def closing_rows(result: dict[str, Any], seconds: float) -> list[tuple[str, str, str]]:
    """(what, before, after) rows of the closing table."""
    history = result.get("eval_history") or []
    before = next((h for h in history if h.get("step") == 0), {})
    after = result.get("eval_metrics") or (history[-1] if history else {})
    rows: list[tuple[str, str, str]] = []

    def fmt(d: dict[str, Any], key: str) -> str:
        return f"{d[key]:.4f}" if isinstance(d.get(key), (int, float)) else "-"

    rows.append(("eval loss", fmt(before, "eval_loss"), fmt(after, "eval_loss")))
    for key in sorted(k for k in after if k not in ("eval_loss", "step")):
        rows.append((key, fmt(before, key), fmt(after, key)))
    rows.append(("optimizer steps", "", str(result.get("final_step", "-"))))
    rows.append(
        (
            "global batch",
            "",
            f"{result.get('global_batch')} = per-device x {result.get('world_size')} process(es) "
            f"x {result.get('accumulation')} accumulation",
        )
    )
    rows.append(("samples/s", "", f"{result.get('samples_per_s', 0):.1f}"))
    rows.append(("wall time", "", f"{seconds:.1f} s"))
    for name, path in sorted((result.get("outputs") or {}).items()):
        rows.append((name, "", str(path)))
    return rows


def quickstart(
    processes: str = typer.Option(
        None, "--processes", "-n", help="Processes (default: one per GPU; one on CPU)."
    ),
    output_dir: Path = typer.Option(DEFAULT_DIR, "--output-dir", help="Runs go to a new folder in here."),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Offline LoRA fine-tune of a built-in model on built-in data, end to end (about a minute)."""
    from rich.console import Console
    from rich.table import Table

    from xtrain import probe
    from xtrain.commands.train import launch_training, plan_for_training
    from xtrain.plan import Overrides
    from xtrain.rules import diagnose
    from xtrain.train.config import load_config

    console = Console(highlight=False)
    n = parse_int(processes, "--processes", 1, example="e.g. --processes 2")
    diagnosis = diagnose(probe.collect(), Overrides(num_processes=n, platform=platform))
    worst = {s: sum(f.severity == s for f in diagnosis.findings) for s in ("warn", "error")}
    console.print(
        f"[bold]doctor:[/] {diagnosis.plan.summary()} "
        f"({worst['error']} error(s), {worst['warn']} warning(s); `xtrain doctor` shows them)",
        soft_wrap=True,
    )
    for f in diagnosis.findings:
        if f.severity == "error":
            console.print(f"  [red]error[/] {f.code}: {f.message}", soft_wrap=True)

    run_dir = new_run_dir(output_dir)
    overrides = [f"run.output_dir={run_dir.as_posix()}", "run.eval_at_start=true"]
    cfg = load_config(None, overrides)
    plan = plan_for_training(cfg, n, None, platform)
    started = time.perf_counter()
    code = launch_training(plan, overrides, console)
    if code != 0:
        raise typer.Exit(code)
    seconds = time.perf_counter() - started

    result = read_result(run_dir)
    table = Table(
        title=f"quickstart: {cfg.model.task} LoRA on {cfg.model.name_or_path}", title_justify="left"
    )
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for what, before, after in closing_rows(result, seconds):
        table.add_row(what, before, after)
    console.print(table)
    console.print(
        "Next: `xtrain train examples/seq-cls.yaml` for your own data (docs/configuration.md).",
        soft_wrap=True,
    )
