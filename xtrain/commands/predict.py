"""`xtrain predict`: run a trained adapter or model on images, audio, images + a question
(vision-language) or text prompts, or on every row of a data file (``--data``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from xtrain.commands.options import (
    max_new_tokens_option,
    num_beams_option,
    parse_float,
    parse_int,
    seed_option,
    temperature_option,
    top_p_option,
    whole,
)
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from xtrain.tasks.contract import PredictRequest

STDOUT = Path("-")  # --output -: the results lines on stdout
FORMATS = ("tsv", "jsonl")  # --format: how the results lines on stdout are written
# a tab-separated value keeps its line: backslash, tab and line breaks escaped as Python writes them
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_line(values: list[str]) -> str:
    """One results line: the values tab-separated, each escaped (``\\``, ``\\t``, ``\\n``,
    ``\\r``) so a multi-line answer stays on its input's line."""
    return "\t".join(str(v).translate(_TSV_ESCAPES) for v in values)


def results_line(row: dict[str, Any], fmt: str) -> str:
    return json.dumps(row, ensure_ascii=False) if fmt == "jsonl" else tsv_line(list(row.values()))


def template_note(model: Path) -> str | None:
    """The line that says a base model is prompted through its own chat template (no xtrain run
    says how it was trained), or None."""
    from xtrain.trained import model_folder, run_task

    folder = model_folder(model)
    if not run_task(folder).templated:
        return None
    return (
        f"note: {folder} is not an xtrain run; its tokenizer has a chat template, so each prompt is "
        "a user turn rendered through it (--system adds a system turn)"
    )


def metrics_line(metrics: dict[str, float], scored: int, total: int) -> str:
    """``exact match 0.62 over 50 rows``: the metrics and how many rows they are over."""
    figures = ", ".join(f"{k.replace('_', ' ')} {v:.4g}" for k, v in metrics.items())
    rows = f"over {scored} row{'s' if scored != 1 else ''}"
    if scored < total:
        rows += f" with a reference (of {total})"
    return f"{figures} {rows}"


def check_output(output: Path, force: bool = False) -> None:
    """``--output`` names a new file, or ``force`` replaces it: nothing of the user's is
    overwritten unasked."""
    if output.is_dir():
        raise XtrainError(f"--output {output} is a folder", "give a file name, e.g. --output results.jsonl")
    if output.exists() and not force:
        raise XtrainError(
            f"--output {output} already exists and would be overwritten",
            "give another file name, delete that file first, or pass --force to replace it",
        )


def write_results(output: Path, rows: list[dict[str, Any]]) -> None:
    """JSON lines, written atomically: the file holds every row or is not there (never half)."""
    from xtrain import atomic

    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(output, text)
    except OSError as e:
        raise XtrainError(f"cannot write {output}: {e.strerror or e}", "choose a writable --output") from None


def _request(
    inputs: list[str] | None, prompt: list[str] | None, system: str | None, options: dict[str, float | None]
) -> PredictRequest:
    """The request, every option checked in one line before anything loads."""
    from xtrain.tasks.contract import PredictRequest

    new_tokens = parse_int(
        options["max_new_tokens"], "--max-new-tokens", 1, example="e.g. --max-new-tokens 64"
    )
    beams = parse_int(options["num_beams"], "--num-beams", 1, example="e.g. --num-beams 4")
    batch = parse_int(options["batch_size"], "--batch-size", 1, example="e.g. --batch-size 16")
    seed = parse_int(options["seed"], "--seed", 0, example="e.g. --seed 1")
    temperature = parse_float(options["temperature"], "--temperature", 0.0, example="e.g. --temperature 0.7")
    top_p = parse_float(options["top_p"], "--top-p", 0.0, 1.0, example="e.g. --top-p 0.9")
    if top_p == 0.0:
        raise XtrainError("--top-p must be above 0", "e.g. --top-p 0.9 (1 keeps every token)")
    assert new_tokens is not None and beams is not None and batch is not None
    return PredictRequest(
        list(inputs or []), list(prompt or []), system, new_tokens, beams, temperature, top_p, seed, batch
    )


# longer: most of its lines are typer's option declarations, one per flag
def predict(
    model: Path = typer.Argument(..., help="A run's output_dir, its adapter/ or best/, or a model folder."),
    inputs: list[str] = typer.Argument(
        None,
        help="Image or audio files, or folders of them (the tasks that read images or audio).",
    ),
    prompt: list[str] = typer.Option(
        None,
        "--prompt",
        "-p",
        "--question",
        "-q",
        help="A text prompt (causal-lm), or a question about every image (vision-language); repeatable.",
    ),
    answer: list[str] = typer.Option(
        None,
        "--answer",
        "-a",
        help="An answer to score after each --prompt (a reward model's result, docs/reward-models.md); "
        "repeatable.",
    ),
    system: str = typer.Option(
        None,
        "--system",
        help="A system turn before the question (vision-language, or a causal-lm chat run; as in training).",
    ),
    tools: str = typer.Option(
        None,
        "--tools",
        help="A JSON file of tool schemas the prompt may call (a causal-lm chat run; docs/agents.md): "
        "a call the model makes is shown parsed. Or Python functions (tools.py:f,g or "
        "package.module:f): the calls run, their results go back to the model, and its calls and "
        "final answer are shown (docs/grpo.md).",
    ),
    data: Path = typer.Option(
        None,
        "--data",
        "-d",
        help="A data file in the run's format: every row is predicted and written as JSON lines "
        "(default: predictions-<file name>.jsonl in the run's output_dir).",
    ),
    batch_size: int = typer.Option(
        8, "--batch-size", "-b", parser=whole("--batch-size"), help="Inputs per generate/forward call."
    ),
    max_new_tokens: int = max_new_tokens_option(),
    num_beams: int = num_beams_option(),
    temperature: float = temperature_option("causal-lm, vision-language"),
    top_p: float = top_p_option(),
    seed: int = seed_option(),
    output: Path = typer.Option(
        None, "--output", "-o", help="Write the results as JSON lines here ('-': stdout, with --data)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output file."),
    fmt: str = typer.Option(
        "tsv",
        "--format",
        help="Results on stdout: tsv (one tab-separated line per input, tabs and line breaks in a "
        "value escaped as \\t and \\n) or jsonl (one JSON object per input).",
    ),
) -> None:
    """Run a trained result: images or audio -> text, images + a question -> the answer,
    prompts -> continuations, images -> a label and its probability; or every row of a data
    file (--data) -> JSON lines with the reference and the metric where a row has one."""
    from xtrain.runtime.quiet import quiet_libraries

    options = {
        "max_new_tokens": max_new_tokens, "num_beams": num_beams, "batch_size": batch_size,
        "seed": seed, "temperature": temperature, "top_p": top_p,
    }  # fmt: skip
    request = _request(inputs, prompt, system, options)
    request.answers = list(answer or [])
    if tools is not None:
        _read_tools(request, tools)
    if fmt not in FORMATS:
        raise XtrainError(f"--format {fmt} is not known", f"use one of: {', '.join(FORMATS)}")
    if data is not None:
        _predict_file(model, data, request, output, force)
        return
    from xtrain import predict as lib

    if not inputs and not prompt:
        raise XtrainError(
            "nothing to predict",
            "pass image or audio files/folders, --prompt TEXT, images with --question TEXT, or --data FILE",
        )
    for item in inputs or []:  # before the (slow) model load
        if not Path(item).expanduser().exists():
            raise XtrainError(f"input {item} not found", "pass files or folders of images or audio")
    if output is not None:
        check_output(output, force)
    note = template_note(model)
    if note is not None:
        typer.echo(note, err=True)
    quiet_libraries()
    rows = lib.predict(model, request)
    for row in rows:  # plain lines (rich would expand the tab): input, (question,) text (, probability)
        typer.echo(results_line(row, fmt))
    if output is not None:
        write_results(output, rows)


def _read_tools(request: PredictRequest, given: str) -> None:
    """``--tools``: a JSON file of schemas, or functions (``file.py:f,g``, ``module:f``; the part
    before the colon carries over to the names after a comma), found and described as
    ``grpo.tools`` finds them."""
    from xtrain.data.rows import tools as agent_rows

    if not (":" in given and not given.lower().endswith(".json")):
        request.tools = agent_rows.read_tools_file(given, "--tools")
        return
    from xtrain.tasks.grpo import tools as tools_

    specs, where = [], ""
    for part in (p.strip() for p in given.split(",") if p.strip()):
        if ":" in part:
            where = part.rpartition(":")[0]
        specs.append(part if ":" in part else f"{where}:{part}")
    request.functions = tools_.resolve(specs, None, "--tools")
    request.tools = [t.schema for t in request.functions]


def _predict_file(model: Path, data: Path, request: PredictRequest, output: Path | None, force: bool) -> None:
    """``--data FILE``: every row, batched, with a progress bar on stderr; the results file is
    checked before anything loads and written whole at the end."""
    from xtrain import predict as lib
    from xtrain.console import make_console
    from xtrain.runtime.quiet import quiet_libraries

    if request.inputs or request.prompts or request.system is not None or request.tools or request.answers:
        raise XtrainError(
            "--data predicts every row of a file: its rows are the inputs",
            "leave out the image/audio inputs, --prompt/--question, --answer, --system and --tools (agent "
            "rows carry their own tools, a GRPO run its grpo.tools), or leave out --data",
        )
    if not data.expanduser().exists():
        raise XtrainError(f"--data {data} not found", "pass a data file in the format the run trained on")
    target = output if output is not None else lib.default_output(model, data)
    if target != STDOUT:
        check_output(target, force)
    quiet_libraries()
    err = make_console(stderr=True)
    note = template_note(model)
    if note is not None:
        err.print(note, soft_wrap=True, markup=False)
    with _progress(err) as advance:  # every row is read and checked before the model loads
        results = lib.predict_file(model, data, request, progress=advance)
    if target == STDOUT:
        for row in results.rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
    else:
        write_results(target, results.rows)
        make_console().print(f"{len(results.rows)} rows -> {target}", soft_wrap=True)
    if results.metrics:
        err.print(metrics_line(results.metrics, results.scored, len(results.rows)), soft_wrap=True)
    if results.means:
        err.print(metrics_line(results.means, len(results.rows), len(results.rows)), soft_wrap=True)


class _progress:
    """A rich progress bar on the error console while rows are predicted (nothing when it is
    not a terminal: logs get the summary line only)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("predicting"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=console, transient=True, disable=not console.is_terminal,
        )  # fmt: skip
        self.task = self.bar.add_task("rows", total=None)  # the row count comes with the first batch

    def __enter__(self) -> Callable[[int, int], None]:
        self.bar.start()
        return lambda done, total: self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()
