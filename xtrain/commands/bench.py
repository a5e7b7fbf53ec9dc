"""`xtrain bench`: train a device-sized llama-style model for a few steps with one process, then
with every planned process, and show samples/s, tokens/s, speedup, scaling efficiency, the
all-reduce bandwidth and (on CUDA) MFU. The measuring lives in ``xtrain.bench``; this renders."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from xtrain.commands.options import parse_int, whole
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.bench.result import BenchResult

SIZE_CHOICES = ("auto", "tiny", "small", "base")


def bench(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            "-n",
            parser=whole("--processes"),
            help="Processes to compare with one (default: the plan's).",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", parser=whole("--steps"), help="Optimizer steps per run (default: 30-40)."),
    ] = None,
    model_size: Annotated[
        str,
        typer.Option(
            "--model-size", metavar="auto|tiny|small|base", help="Model size (auto: fill the device)."
        ),
    ] = "auto",
    full: Annotated[bool, typer.Option("--full", help="Full fine-tuning instead of LoRA.")] = False,
    precision: Annotated[
        str | None,
        typer.Option("--precision", metavar="no|fp16|bf16", help="Mixed precision (default: auto)."),
    ] = None,
    per_device: Annotated[
        int | None,
        typer.Option(
            "--per-device", parser=whole("--per-device"), help="Per-device batch (default: the size's)."
        ),
    ] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the all-reduce bandwidth test.")] = False,
    platform: Annotated[
        str | None, typer.Option("--platform", hidden=True, help="Plan as if on this OS.")
    ] = None,
) -> None:
    """Measure training speed here: 1 process vs all planned processes, scaling efficiency, MFU."""
    from xtrain.bench.runner import BenchOptions

    if model_size not in SIZE_CHOICES:
        raise XtrainError(f"--model-size {model_size!r} is unknown", f"use one of {', '.join(SIZE_CHOICES)}")
    options = BenchOptions(
        size=model_size,
        steps=parse_int(steps, "--steps", 2, example="e.g. --steps 20"),
        processes=parse_int(processes, "--processes", 1, example="e.g. --processes 2"),
        full=full,
        precision=precision,
        per_device=parse_int(per_device, "--per-device", 1, example="e.g. --per-device 8"),
        smoke=not no_smoke,
        platform=platform,
    )

    from xtrain.bench.runner import run_bench
    from xtrain.console import make_console
    from xtrain.planning.resolve import resolve

    err = make_console(stderr=True)
    out = make_console()
    machine = resolve(processes=options.processes, precision=options.precision, platform=platform)
    facts = machine.facts
    errors = [f for f in machine.findings if f.severity == "error"]
    if errors:
        raise XtrainError(
            f"this machine is not ready to train: {errors[0].message}", "run `xtrain doctor` for the fixes"
        )
    say = err if json_out else out
    result = run_bench(facts, options, progress=lambda m: say.print(f"[dim]bench:[/] {m}...", soft_wrap=True))
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        sys.stdout.flush()
        return
    render(out, result)


def _rate(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}{unit}" if value < 100 else f"{value:,.0f}{unit}"


def render(console: Console, result: BenchResult) -> None:
    from rich.table import Table

    m = result.model
    console.print(
        f"\n[bold]xtrain bench[/]: {result.size} llama-style model, {m['params'] / 1e6:.1f}M parameters "
        f"({result.mode}, {m['trainable'] / 1e6:.2f}M trainable), {m['layers']} layers x {m['hidden']}, "
        f"sequences of {m['seq_len']} tokens, global batch {m['global_batch']}; "
        f"{result.device}{' ' + result.gpu if result.gpu else ''}, precision {result.precision}",
        soft_wrap=True,
    )
    table = Table(title_justify="left")
    table.add_column("processes", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("accumulation", justify="right")
    table.add_column("steps timed", justify="right")
    if result.device == "cuda":
        table.add_column("MFU", justify="right")
    for run in result.runs:
        row = [
            str(run.processes),
            _rate(run.samples_per_s),
            _rate(run.tokens_per_s),
            str(run.accumulation),
            f"{run.measured_steps} of {run.steps}",
        ]
        if result.device == "cuda":
            row.append(f"{run.mfu:.1%}" if run.mfu is not None else "unknown")
        table.add_row(*row)
    console.print(table)
    if result.speedup is not None:
        n = result.runs[-1].processes
        console.print(
            f"speedup {result.speedup:.2f}x with {n} processes: scaling efficiency "
            f"[bold]{result.efficiency:.0%}[/] (speedup / processes; 100% is perfect)",
            soft_wrap=True,
        )
    else:
        console.print("one process planned: add --processes 2 (or more) to measure scaling", soft_wrap=True)
    ar = result.allreduce
    if ar:
        if ar.get("ok") and ar.get("busbw_gbps") is not None:
            staged = ", staged through CPU copies" if ar.get("cpu_staged") else ""
            console.print(
                f"all-reduce ({ar['backend']}{staged}, {ar['size_mib']:g} MiB): bus bandwidth "
                f"{ar['busbw_gbps']:.2f} GB/s",
                soft_wrap=True,
            )
        else:
            console.print(f"[red]all-reduce test failed:[/] {ar.get('error')}", soft_wrap=True)
    if result.device == "cuda":
        if result.peak_tflops:
            console.print(
                f"MFU against {result.peak_name} {result.peak_tflops:g} TFLOP/s ({result.precision}, "
                f"{result.peak_source}); FLOPs/token = {m['flops_formula']}",
                soft_wrap=True,
            )
        else:
            console.print(f"MFU unknown: {result.gpu} is not in the peak-FLOPs table", soft_wrap=True)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    console.print(
        "[dim]Rates are steady-state: the loop's own samples/s over its logging windows after the "
        "first (start-up and warm-up excluded). docs/performance.md explains the figures.[/]",
        soft_wrap=True,
    )
