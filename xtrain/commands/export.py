"""`xtrain export`: a trained run as a model people run: merged safetensors, a GGUF file, or a
GGUF + Ollama Modelfile (``xtrain/export``), or several of them from one merge. Progress on
stderr while it merges and writes; the checks, the files with their sizes and the next command at
the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from xtrain.commands.options import whole

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.export.pipeline import ExportResult

SHOWN = 3  # eval prompts shown answered by xtrain and by each file


def export(
    model: Path = typer.Argument(..., help="A run's output_dir, its adapter/, or a model folder."),
    to: list[str] = typer.Option(
        ...,
        "--to",
        metavar="TARGET",
        help="merged (safetensors), gguf, or ollama (GGUF + Modelfile); several (--to merged --to ollama, "
        "or merged,ollama) share one merge.",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="A new folder to write the export into."),
    base: str = typer.Option(
        None, "--base", help="The base model of an adapter folder (default: the base its adapter names)."
    ),
    gguf_type: list[str] = typer.Option(
        ["q8_0"],
        "--type",
        help="GGUF weights: f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m or q4_0 (gguf, ollama); several "
        "(--type q8_0 --type q4_k_m, or q8_0,q4_k_m) write a file of each from one merge (gguf).",
    ),
    eval_prompts: int = typer.Option(
        8,
        "--eval-prompts",
        parser=whole("--eval-prompts"),
        help="The run's eval prompts answered by the merged model and by each GGUF file (llama.cpp "
        "when xllamacpp is installed); 0: none.",
    ),
    name: str = typer.Option(None, "--name", help="The Ollama model name (default: the run folder name)."),
    system: str = typer.Option(None, "--system", help="A system prompt for the Modelfile (ollama)."),
) -> None:
    """Merge the adapter into its base and write it as safetensors, GGUF or an Ollama model, each
    checked against the trained model before it is handed over."""
    from rich.markup import escape

    from xtrain.console import make_console
    from xtrain.export.pipeline import ExportRequest
    from xtrain.export.pipeline import export as run_export
    from xtrain.runtime.quiet import quiet_libraries

    request = ExportRequest(str(model), to, output.expanduser(), base, gguf_type, name, system, eval_prompts)
    quiet_libraries()
    err = make_console(stderr=True)
    with _Progress(err) as progress:
        result = run_export(request, progress)
    out = make_console()
    for check in result.checks:
        out.print(f"[green]ok[/] {check.name}: {escape(check.detail)}", soft_wrap=True, markup=True)
    for cost in result.costs:
        out.print(f"cost {cost.line()}", soft_wrap=True, markup=False)
    for warning in result.warnings:
        out.print(f"[yellow]warning[/] {escape(warning)}", soft_wrap=True, markup=True)
    for note in result.notes:
        out.print(note, soft_wrap=True, markup=False)
    if result.prompts is not None and result.prompts.files:
        _print_answers(out, result)
    for file, size in result.files.items():
        out.print(f"{_size(size):>10}  {result.output / file}", soft_wrap=True, markup=False)
    if result.ollama:
        shell = "powershell" if sys.platform == "win32" else "bash"
        out.print("next:", soft_wrap=True)
        out.print(f"  {result.ollama[shell]}", soft_wrap=True, markup=False)


def _print_answers(console: Console, result: ExportResult) -> None:
    """The first eval prompts answered by xtrain (the merged model) and by each file, side by side
    (as the quickstart's closing table); the cost lines above say how many of all agree."""
    from rich.table import Table
    from rich.text import Text

    from xtrain.export.answers import table

    prompts = result.prompts
    assert prompts is not None
    runtime = result.costs[0].runtime.split(" ")[0] if result.costs else "gguf"
    table_ = Table(title="answers to eval prompts (greedy)", title_justify="left")
    for name in ("prompt", "xtrain (merged)", *(f"{runtime} {k}" for k in prompts.files), "reference"):
        table_.add_column(name)
    for row in table(prompts, SHOWN):
        table_.add_row(*(Text(c) for c in row))
    console.print(table_)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class _Progress:
    """The stages as a rich spinner line, and a bar while tensors are written (nothing when the
    error console is not a terminal: logs get the end lines only)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            console=console, transient=True, disable=not console.is_terminal,
        )  # fmt: skip
        self.task = self.bar.add_task("export", total=None)

    def __enter__(self) -> _Progress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def stage(self, text: str) -> None:
        self.bar.update(self.task, description=text, completed=0, total=None)

    def advance(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)
