"""`xtrain eval RESULT... --tasks T1,T2`: trained results (and the base they came from) scored on
benchmarks through lm-evaluation-harness, one table of tasks x models with standard errors and the
change against the base.

Everything is read and checked before a model loads (the extra installed, each result a causal
language model, each task known or its YAML parsed and its data read); then xtrain's launcher
starts ``xtrain.evaluate.worker`` on the planned processes (lm-eval's data-parallel mode: both
GPUs score, on Windows too), each model in turn. lm-eval's JSON of each result is kept in its run's
folder (``benchmarks/``), where ``xtrain report`` finds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from xtrain.commands.options import number, parse_gpus, whole
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.evaluate.benchmarks import Benchmarks
    from xtrain.evaluate.harness import Options
    from xtrain.evaluate.models import Scored
    from xtrain.evaluate.scores import Score
    from xtrain.model.start import Start

DTYPES = ("auto", "float32", "bfloat16", "float16")
CAUSAL = "AutoModelForCausalLM"


# longer: most of its lines are typer's option declarations, one per flag
def eval_command(
    results: list[str] = typer.Argument(
        ...,
        metavar="RESULT...",
        help="Runs' output_dir (or their adapter/, a merged folder), model folders, hub ids, built-ins "
        "or .gguf files: each a column of the table.",
    ),
    tasks: str = typer.Option(
        None,
        "--tasks",
        "-t",
        help="lm-eval task names (arc_easy,gsm8k,mmlu,...) or task YAML files and folders (your own, "
        "offline), comma-separated.",
    ),
    limit: float = typer.Option(
        None, "--limit", parser=number("--limit"), help="Rows per task (below 1: that share of each)."
    ),
    num_fewshot: int = typer.Option(
        None, "--num-fewshot", parser=whole("--num-fewshot"), help="Few-shot examples (default: each task's)."
    ),
    batch_size: str = typer.Option("8", "--batch-size", "-b", help="Rows per forward pass, or auto."),
    processes: int = typer.Option(
        None, "--processes", "-n", parser=whole("--processes"), help="Processes (default: one per GPU)."
    ),
    gpus: str = typer.Option(None, "--gpus", help='GPU ids, e.g. "0,1" (default: all).'),
    dtype: str = typer.Option(
        "auto", "--dtype", help="Weights: auto (the checkpoint's), float32, bfloat16, float16."
    ),
    base: bool = typer.Option(
        True,
        "--base/--no-base",
        help="Score the base the results were trained from first (the changes are against it).",
    ),
    stages: bool = typer.Option(False, "--stages", help="Score every stage of a chained result, in order."),
    chat_template: bool = typer.Option(
        None,
        "--chat-template/--no-chat-template",
        help="Render prompts through the chat template (default: as each result trained).",
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="Also write every model's lm-eval results to this JSON file."
    ),
    samples: Path = typer.Option(
        None,
        "--samples",
        help="Also write what each model answered, row by row, to this folder (<model>.jsonl: input, "
        "output, reference, metrics).",
    ),
    save: bool = typer.Option(
        True, "--save/--no-save", help="Keep lm-eval's JSON in each run's folder (benchmarks/)."
    ),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Score results on benchmarks through lm-evaluation-harness: the base first, then each result,
    one table of tasks x models with standard errors and the change against the base."""
    from xtrain.console import make_console
    from xtrain.evaluate import benchmarks, harness
    from xtrain.evaluate import samples as sampled

    harness.require()
    console = make_console()
    options = _options(limit, num_fewshot, batch_size, dtype, samples is not None)
    if output is not None and output.is_dir():
        raise XtrainError(f"--output {output} is a folder", "give a file name, e.g. --output scores.json")
    if samples is not None and samples.exists() and not samples.is_dir():
        raise XtrainError(f"--samples {samples} is a file", "give a folder, e.g. --samples answers/")
    bench = benchmarks.resolve(benchmarks.split(tasks))
    models = _models(results, base, stages, chat_template)
    harness.quiet()
    _checked(bench, models, console)
    plan = _plan(processes, gpus, platform)
    found, world = _launch(models, bench, options, plan, console)
    answers = [sampled.take(f) for f in found]  # kept out of the table, run folders and --output
    _show(models, found, console)
    if save:
        _save(models, found, bench, {**options.to_dict(), "processes": world}, console)
    if output is not None:
        _write_output(output, models, found, world)
    if samples is not None:
        for m, answered in zip(models, answers, strict=True):
            path = sampled.write(samples, m.label, sampled.rows(answered))
            console.print(f"[dim]{m.label}: its answers -> {path}[/]", soft_wrap=True)


def _options(limit: float | None, fewshot: int | None, batch: str, dtype: str, samples: bool) -> Options:
    from xtrain.evaluate.harness import Options

    if limit is not None and limit <= 0:
        raise XtrainError(
            f"--limit must be above 0, got {limit:g}", "e.g. --limit 100 (rows) or --limit 0.1 (a share)"
        )
    if limit is not None and limit >= 1 and limit != int(limit):
        raise XtrainError(f"--limit {limit:g} is neither a row count nor a share below 1", "e.g. --limit 100")
    if fewshot is not None and fewshot < 0:
        raise XtrainError(f"--num-fewshot must be 0 or more, got {fewshot}", "e.g. --num-fewshot 5")
    text = batch.strip().lower()
    if text.startswith("auto"):
        size: int | str = text
    elif text.isdigit() and int(text) > 0:
        size = int(text)
    else:
        raise XtrainError(
            f"--batch-size {batch!r} is not a positive whole number or auto", "e.g. --batch-size 16"
        )
    if dtype not in DTYPES:
        raise XtrainError(f"--dtype {dtype} is not known", f"use one of: {', '.join(DTYPES)}")
    return Options(limit, fewshot, size, dtype, samples)


def _checked(bench: Benchmarks, models: list[Scored], console: Console) -> None:
    """Every task checked in lm-eval's task index (its own tasks too when a name needs them; the
    index is kept for a worker in this process); a GGUF file's tasks generation tasks."""
    from xtrain.evaluate import benchmarks, gguf
    from xtrain.evaluate.models import GGUF
    from xtrain.evaluate.scoring import manager_for

    if bench.defaults:
        console.print("[dim]reading lm-eval's task index...[/]", soft_wrap=True)
    manager = manager_for(bench)
    benchmarks.check(bench, manager)
    if any(m.kind == GGUF for m in models):
        gguf.check_tasks(bench, manager)


def _plan(processes: int | None, gpus: str | None, platform: str | None) -> Any:
    from xtrain.planning.resolve import resolve

    return resolve(processes=processes, gpu_ids=parse_gpus(gpus), platform=platform).plan


# -- the results as lm-eval loads them ------------------------------------------------------------


def _models(items: list[str], base: bool, stages: bool, chat: bool | None) -> list[Scored]:
    """The columns in order: the base (once), each result's earlier stages (``stages``), each result;
    a model given twice is scored once. A GGUF file is prompted as the first other result is (its
    chat template or not), unless ``chat`` says."""
    from xtrain.evaluate import gguf
    from xtrain.evaluate.models import base_of, of_start
    from xtrain.model.start import start_of

    files = {i for i, item in enumerate(items) if Path(item).expanduser().is_file()}
    read = {i: _result(item, chat) for i, item in enumerate(items) if i not in files}
    first = next(iter(read.values()), None)
    follow = chat if chat is not None or first is None else first[0].chat
    for i in files:
        read[i] = (gguf.scored(Path(items[i]).expanduser(), follow), None)
    columns: list[Scored] = []
    origin = base_of(first[1]) if first is not None and base else None
    if first is not None and origin is not None:
        short = Path(origin).name if Path(origin).is_dir() else origin.removeprefix("builtin:")
        columns.append(of_start(start_of(origin), f"base: {short}", chat=False).like(first[0]))
    for i in range(len(items)):
        scored, start = read[i]
        if stages and start is not None:
            for entry in start.lineage[:-1]:
                source = entry.get("source")
                if isinstance(source, str):
                    columns.append(_result(source, chat)[0])
        columns.append(scored)
    unique: dict[tuple[str, str | None, str], Scored] = {}
    for c in columns:
        unique.setdefault((c.pretrained, c.peft, c.kind), c)
    return list(unique.values())


def _result(item: str, chat: bool | None) -> tuple[Scored, Start]:
    """One RESULT argument (not a file) as lm-eval loads it, and its start."""
    from xtrain import builtin
    from xtrain.evaluate.models import of_start, run_folder
    from xtrain.model.load import looks_like_hub_id
    from xtrain.model.start import start_of
    from xtrain.trained import has_chat_template, model_folder, run_data, run_task

    path = Path(item).expanduser()
    if not path.exists():
        if builtin.is_builtin(item) or looks_like_hub_id(item):  # a model by name: itself
            start = start_of(item)
            if not start.result:
                return of_start(start, item.removeprefix("builtin:"), chat=bool(chat)), start
            folder = model_folder(builtin.stage_result(item))
        else:
            raise XtrainError(
                f"{item} not found", "pass a run's output_dir, a model folder, a hub id or a .gguf file"
            )
    else:
        folder = model_folder(path)  # one line when it holds no model
    found = run_task(folder)
    _causal(folder, found.task)
    start = start_of(str(folder))
    on = found.chat if chat is None else chat
    tokenizer = Path(start.tokenizer or (folder if not start.adapters else start.base))
    if on and tokenizer.is_dir() and not has_chat_template(tokenizer):
        raise XtrainError(f"--chat-template: {tokenizer} has no chat template", "leave out --chat-template")
    kwargs = run_data(folder, found).get("chat_template_kwargs")
    run = run_folder(folder)
    inside_cache = run.resolve().is_relative_to(builtin.cache_root().resolve())  # a trained built-in
    saved_in = str(run) if start.result and not inside_cache else None
    label = run.name if folder.name in ("adapter", "model") or folder == run else f"{run.name}/{folder.name}"
    scored = of_start(
        start, label, chat=on, chat_kwargs=kwargs if isinstance(kwargs, dict) else None, saved_in=saved_in
    )
    if not start.adapters:  # a whole model's tokenizer: its own folder (the base of it is prompted alike)
        from dataclasses import replace

        scored = replace(scored, tokenizer=scored.pretrained)
    return scored, start


def _causal(folder: Path, task: str | None) -> None:
    """A result lm-eval can score: a causal language model (one line for a classifier, a speech or
    vision model)."""
    from xtrain import tasks
    from xtrain.model.start import read_json_object

    if task is not None:
        known = tasks.all_tasks().get(task)
        if known is not None and known.model_class == CAUSAL:
            return
        raise XtrainError(
            f"{folder} is a {task} result: lm-evaluation-harness scores causal language models",
            "score causal-lm, preference or GRPO results (xtrain predict --data runs this one on a file)",
        )
    config = read_json_object(folder / "config.json")
    adapter = read_json_object(folder / "adapter_config.json")
    names = config.get("architectures") or []
    if adapter.get("task_type") == "CAUSAL_LM" or any(str(n).endswith("ForCausalLM") for n in names):
        return
    raise XtrainError(
        f"{folder} is not a causal language model (its config names "
        f"{', '.join(map(str, names)) or 'no architecture'})",
        "lm-evaluation-harness scores causal language models",
    )


# -- launching and what comes back ----------------------------------------------------------------


def _launch(
    models: list[Scored], bench: Benchmarks, options: Options, plan: Any, console: Console
) -> tuple[list[dict[str, Any]], int]:
    """Every model scored on the plan's processes (xtrain's launcher; one process runs here):
    lm-eval's results of each, in order, and how many processes scored them."""
    import json

    from xtrain import atomic
    from xtrain.evaluate import worker
    from xtrain.evaluate.scoring import META, Job, result_file
    from xtrain.launch import launcher

    shown = ", ".join(m.label for m in models)
    where = f"{plan.num_processes} process{'es' * (plan.num_processes != 1)} on {plan.device}"
    if plan.world_size > 1:
        where += f" ({plan.launcher} launcher, {plan.backend}: lm-eval's data-parallel mode)"
    console.print(
        f"[bold]xtrain eval:[/] {len(models)} model(s) ({shown}) on {bench.shown}, {where}", soft_wrap=True
    )
    with atomic.temporary_folder("xtrain-eval-") as tmp:
        folder = Path(tmp)
        Job(tuple(models), bench, options).write(folder)
        try:
            launcher.launch(worker.MODULE, [str(folder)], plan)
        except launcher.WorkerFailed as e:
            if (said := e.said) is not None:
                raise typer.Exit(int(said.exit_code or e.worker_exit_code or 1)) from None
            raise XtrainError(f"xtrain eval failed: {e.one_line()}") from None
        found = [json.loads(result_file(folder, i).read_text(encoding="utf-8")) for i in range(len(models))]
        return found, int(json.loads((folder / META).read_text(encoding="utf-8"))["processes"])


def _show(models: list[Scored], found: list[dict[str, Any]], console: Console) -> None:
    from xtrain.evaluate.scores import scores

    show_table([m.label for m in models], [scores(f) for f in found], console)


def show_table(labels: list[str], columns: list[list[Score]], console: Console) -> None:
    """The table: a row per task and metric, a column per model (value ± stderr), and each later
    model's change against the first."""
    from rich.table import Table

    from xtrain.evaluate.scores import change, shown, shown_change, table

    grid = Table(show_header=True, header_style="bold")
    grid.add_column("task")
    grid.add_column("metric")
    for i, label in enumerate(labels):
        grid.add_column(label, justify="right")
        if i:
            grid.add_column("change", justify="right")
    for (task, _, _), row in table(columns):
        name = next(s for s in row if s is not None).name
        cells = [task, name]
        for i, s in enumerate(row):
            cells.append(shown(s))
            if i:
                cells.append(shown_change(change(s, row[0])))
        grid.add_row(*cells)
    console.print(grid)
    against = f"; change: against {labels[0]}" if len(labels) > 1 else ""
    console.print(f"[dim]± the standard error lm-eval reports{against}[/]", soft_wrap=True)


def _save(
    models: list[Scored],
    found: list[dict[str, Any]],
    bench: Benchmarks,
    options: dict[str, Any],
    console: Console,
) -> None:
    """lm-eval's JSON of each result in its run's folder (``benchmarks/``), with the first column's
    scores as its reference; a folder it cannot write is a warning line."""
    from xtrain.evaluate import saved
    from xtrain.evaluate.scores import scores

    reference = (models[0].label, scores(found[0])) if len(models) > 1 else None
    for i, (m, results) in enumerate(zip(models, found, strict=True)):
        if m.saved_in is None:
            continue
        ref = reference if i else None
        kept = saved.entry(m.label, m.what, list(bench.specs), options, results, scores(results), ref)
        try:
            path = saved.write(Path(m.saved_in), kept)
        except OSError as e:
            console.print(
                f"[yellow]warning:[/] cannot keep {m.label}'s scores in {m.saved_in}: {e.strerror or e}",
                soft_wrap=True,
            )
            continue
        console.print(f"[dim]{m.label}: lm-eval's results -> {path}[/]", soft_wrap=True)


def _write_output(path: Path, models: list[Scored], found: list[dict[str, Any]], processes: int) -> None:
    import json

    from xtrain import atomic

    data = {
        "processes": processes,
        "models": [
            {"label": m.label, "what": m.what, "results": f} for m, f in zip(models, found, strict=True)
        ],
    }
    try:
        atomic.write_text(path, json.dumps(data, indent=1, ensure_ascii=False))
    except OSError as e:
        raise XtrainError(f"cannot write {path}: {e.strerror or e}", "choose a writable --output") from None
