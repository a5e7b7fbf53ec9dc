"""`xtrain quickstart`: the embedded default job. Offline, no arguments.

A short doctor summary, then a LoRA fine-tune of a small built-in model on built-in data on
every planned device (one process on a CPU-only machine; `--processes 2` takes the distributed
path), evaluation before and after, the adapter saved, and a closing table. Without --task it runs
the job of the task whose ``Quickstart`` is the ``default`` (chat LoRA on the tiny llama); a job
with ``Quickstart.compare`` ends with its eval prompts answered by the base model and by the
trained adapter side by side, and the exact match of each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from xtrain.commands.options import parse_int, whole
from xtrain.config import examples
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.config.schema import TrainConfig
    from xtrain.planning.plan import Finding
    from xtrain.predict import FileResults
    from xtrain.tasks.contract import Quickstart

DEFAULT_DIR = Path("xtrain-quickstart")
SHOWN = 3  # eval prompts shown answered before and after
COMPARE_TOKENS = 24  # the longest answer generated for the before/after comparison


def next_line(
    quickstart: Quickstart, run_dir: Path, shell: str, chats: bool = False, exports: bool = False,
    adapter: bool = True,
) -> str:  # fmt: skip
    """The closing ``Next:`` line: predict with the run just trained (tasks with a predict on
    their built-in data), chat with it (``chats``: its task's results chat), export it as a GGUF
    file (``exports``: its task trains a causal LM), then train on your own data. ``adapter``: the
    run trained a LoRA adapter (False: the whole model, e.g. the distillation built-in's student)."""
    from xtrain.shell import quote

    own = f"`{examples.in_command(quickstart.next_command)}` for your own data (docs/configuration.md)."
    if quickstart.predict_args is None:
        return f"Next: {own}"
    args = quickstart.predict_args()
    predict = " ".join(quote(shell, a) for a in ["xtrain", "predict", str(run_dir), *args])
    chat = f", `xtrain chat {quote(shell, str(run_dir))}` talks to it" if chats else ""
    gguf = ["xtrain", "export", str(run_dir), "--to", "gguf", "-o", f"{run_dir}-gguf"]
    export = (
        f", `{' '.join(quote(shell, a) for a in gguf)}` writes it for llama.cpp, LM Studio and Ollama "
        "(docs/export.md)"
        if exports
        else ""
    )
    trained = "the adapter just trained" if adapter else "the model just trained"
    return f"Next: `{predict}` runs {trained}{chat}{export}; {own}"


def look_line(run_dir: Path, shell: str) -> str:
    """Where the run's curves are drawn, and the command that puts the whole run on one page."""
    from xtrain.shell import quote
    from xtrain.train.run_files import CURVES

    report = " ".join(quote(shell, a) for a in ["xtrain", "report", str(run_dir)])
    page = f"`{report}` writes the whole run as one HTML page (docs/report.md)"
    picture = run_dir / CURVES
    return f"Curves: {picture} (open the picture); {page}." if picture.is_file() else f"Report: {page}."


def compare_answers(base: str, run_dir: Path, file: Path) -> tuple[FileResults, FileResults]:
    """Every row of the eval ``file`` answered greedily by the ``base`` model (prompted through its
    chat template, as ``xtrain predict`` prompts a chat model) and by the result in ``run_dir``."""
    from xtrain import predict as lib
    from xtrain.runtime.quiet import quiet_libraries
    from xtrain.tasks.contract import PredictRequest

    quiet_libraries()
    request = PredictRequest([], [], max_new_tokens=COMPARE_TOKENS, batch_size=20)
    return lib.predict_file(base, file, request), lib.predict_file(run_dir, file, request)


def start_label(name_or_path: str) -> str:
    """What answers "before": the base model, or the trained result the job starts from (a chain's
    stage: ``start: NAME``), never called a base model."""
    from xtrain.model.start import start_of

    return f"start: {name_or_path}" if start_of(name_or_path).result else "base model"


def _print_answers(console: Console, before: FileResults, after: FileResults, start: str) -> None:
    """The first eval prompts answered by the model the job started from (``start``) and the
    adapter, and each one's score."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="answers to eval prompts (greedy)", title_justify="left")
    for name in ("prompt", start, "trained adapter", "reference"):
        table.add_column(name)
    for b, a in list(zip(before.rows, after.rows, strict=True))[:SHOWN]:
        cells = (a["input"], b["output"], a["output"], a.get("reference", "-"))
        table.add_row(*(Text(" ".join(str(x).split())) for x in cells))  # one line a cell
    console.print(table)
    for key, value in after.metrics.items():
        was = before.metrics.get(key, float("nan"))
        name = key.replace("_", " ")
        line = f"{name} {was:.2f} -> {value:.2f} over {after.scored} eval rows ({start} -> adapter)"
        console.print(line, soft_wrap=True, markup=False)


def save_answers(run_dir: Path, before: FileResults, after: FileResults, start: str = "base model") -> None:
    """The comparison kept in the run folder for ``xtrain report`` (``run_files.ANSWERS``);
    ``start``: what answered before (``start_label``)."""
    from xtrain import atomic
    from xtrain.train.run_files import ANSWERS

    rows = [
        {"prompt": a["input"], "base": b["output"], "trained": a["output"], "reference": a.get("reference")}
        for b, a in zip(before.rows, after.rows, strict=True)
    ]
    metrics = {k: {"base": before.metrics.get(k), "trained": v} for k, v in after.metrics.items()}
    saved = {"rows": rows, "metrics": metrics, "scored": after.scored, "start": start}
    atomic.write_text(run_dir / ANSWERS, json.dumps(saved, indent=1, ensure_ascii=False))


def _before_after(console: Console, cfg: TrainConfig, run_dir: Path, file: Path) -> None:
    """The eval ``file``'s prompts answered by the base model and the result: shown, and kept in
    the run folder for its report."""
    from xtrain.model.load import resolve_model

    answers = compare_answers(resolve_model(cfg.model.name_or_path), run_dir, file)
    start = start_label(cfg.model.name_or_path)
    _print_answers(console, *answers, start)
    save_answers(run_dir, *answers, start)


def _print_doctor(console: Console, findings: list[Finding]) -> None:
    """The doctor's count of warnings and errors, and each error."""
    worst = {s: sum(f.severity == s for f in findings) for s in ("warn", "error")}
    console.print(
        f"[bold]doctor:[/] {worst['error']} error(s), {worst['warn']} warning(s) "
        "(`xtrain doctor` explains them)",
        soft_wrap=True,
    )
    for f in findings:
        if f.severity == "error":
            console.print(f"  [red]error[/] {f.code}: {f.message}", soft_wrap=True)


def new_run_dir(root: Path, job: str) -> Path:
    """A fresh folder per run under ``root``, named for its built-in ``job`` and the time: a
    quickstart never overwrites an earlier one, and several are told apart."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = root / f"{job}-{stamp}"
    k = 1
    while run.exists():
        k += 1
        run = root / f"{job}-{stamp}-{k}"
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
    split = (result.get("run_info") or {}).get("sequence_parallel") or 1  # processes sharing a row
    per_device = global_batch // max(1, world // split * accumulation)
    readers = f"{world} process(es)" if split == 1 else f"{world // split} group(s) of {split} processes"
    rows = [
        ("optimizer steps", str(result.get("final_step", "-"))),
        (
            "global batch",
            f"{global_batch} = {per_device} per-device x {readers} x {accumulation} accumulation",
        ),
        ("samples/s", f"{result.get('samples_per_s', 0):.1f}"),
        ("wall time", f"{seconds:.1f} s (start-up included)"),
    ]
    rows += [(name, str(path)) for name, path in sorted((result.get("outputs") or {}).items())]
    return rows


def _print_result(
    console: Console,
    cfg: TrainConfig,
    job: Quickstart,
    result: dict[str, Any],
    seconds: float,
) -> None:
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
    found = {k: (b, a) for k, b, a in metric_rows(result)}
    if job.headline is not None and job.headline[0] in found:
        key, name, meaning = job.headline
        console.print(f"{name} {found[key][0]} -> {found[key][1]} ({meaning})")
    if samples := result.get("predictions") or []:
        if job.samples_metric is not None and job.samples_metric[0] in found:
            key, name = job.samples_metric
            console.print(f"{name} {found[key][0]} -> {found[key][1]}", soft_wrap=True, markup=False)
        console.print(f"{job.samples[0]} | {job.samples[1]}:", soft_wrap=True, markup=False)
    for sample in samples:
        console.print(f"  {sample['reference']!r} | {sample['prediction']!r}", soft_wrap=True, markup=False)
    runs = Table(show_header=False, box=None, padding=(0, 2))
    for what, value in run_rows(result, seconds):
        runs.add_row(what, value)
    console.print(runs)


def quickstart(
    task: str = typer.Option(
        None,
        "--task",
        help="The built-in job of a task (a task's name, e.g. seq-cls: text classification; default: "
        "the chat LoRA job); `xtrain quickstart --task list` lists them.",
    ),
    processes: int = typer.Option(
        None,
        "--processes",
        "-n",
        parser=whole("--processes"),
        help="Processes (default: one per GPU; one on CPU).",
    ),
    output_dir: Path = typer.Option(DEFAULT_DIR, "--output-dir", help="Runs go to a new folder in here."),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Offline LoRA fine-tune of a built-in model on built-in data, end to end (about a minute):
    by default chat LoRA on a tiny llama, its answers shown before and after."""

    from xtrain import tasks
    from xtrain.commands.launching import built_in_start, launch_training
    from xtrain.console import make_console
    from xtrain.planning.resolve import resolve
    from xtrain.shell import shell_for
    from xtrain.tasks.validation import load_config

    console = make_console()
    jobs = tasks.quickstarts()
    if task is None:
        task = tasks.default_quickstart()
    if task not in jobs:
        listed = "; ".join(
            f"--task {name} ({q.about}{', the default' if q.default else ''})" for name, q in jobs.items()
        )
        if task == "list":
            console.print(f"built-in jobs: {listed}", soft_wrap=True, markup=False)
            return
        raise XtrainError(f"unknown quickstart task '{task}'", f"use one of: {listed}")
    job = tasks.job_file(jobs[task])
    n = parse_int(processes, "--processes", 1, example="e.g. --processes 2")
    diagnosis = resolve(processes=n, platform=platform, full_probe=True)
    _print_doctor(console, diagnosis.findings)

    run_dir = new_run_dir(output_dir, task)
    overrides = [f"run.output_dir={run_dir.as_posix()}", "run.eval_at_start=true"]
    cfg = load_config(job, overrides)
    built_in_start(cfg, console)  # its start, when a trained built-in: trained once, first
    world = diagnosis.plan.world_size
    fixed = cfg.batch.global_batch or cfg.batch.per_device
    if fixed % (cfg.batch.per_device * world) and fixed % world == 0:
        # e.g. 4 or 8 GPUs: smaller micro-batches keep the same global batch (and result)
        overrides.append(f"batch.per_device={fixed // world}")
        cfg = load_config(job, overrides)
    resolved = resolve(cfg, processes=n, platform=platform, facts=diagnosis.facts)
    plan = resolved.plan
    started = time.perf_counter()
    run_argv = ["--config", str(job), *overrides]
    code = launch_training(plan, run_argv, console, batch=resolved.settings and resolved.settings.batch_line)
    if code != 0:
        raise typer.Exit(code)
    seconds = time.perf_counter() - started

    _print_result(console, cfg, jobs[task], read_result(run_dir), seconds)
    if (compare := jobs[task].compare) is not None:
        _before_after(console, cfg, run_dir, compare())
    shell = shell_for(diagnosis.plan.os_kind)
    console.print(look_line(run_dir, shell), soft_wrap=True, markup=False)
    owner = tasks.quickstart_task(task)
    chats = owner.predicts is not None and owner.predicts.chat is not None
    exports = owner.model_class == "AutoModelForCausalLM"  # what GGUF export writes
    line = next_line(jobs[task], run_dir, shell, chats, exports, adapter=cfg.lora.enabled)
    console.print(line, soft_wrap=True, markup=False)
