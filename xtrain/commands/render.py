"""Rich rendering for `xtrain doctor`: facts, findings with fixes, the plan, the smoke test.

Everything prints to a ``Console`` passed in (the CLI decides stdout, width, colour). Fixes are
printed on their own lines with ``soft_wrap=True``: rich never inserts a line break inside a
command, so a fix copied from the terminal pastes as one working line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from xtrain.machine.facts import Facts
from xtrain.planning.plan import Diagnosis, Finding, Plan

if TYPE_CHECKING:
    from xtrain.launch.smoke import SmokeResult

SEVERITY_STYLE = {"ok": "green", "warn": "yellow", "error": "bold red"}
SEVERITY_MARK = {"ok": "ok", "warn": "warn", "error": "ERROR"}


def _yes_no(value: bool | None, yes: str = "yes", no: str = "no") -> str:
    return "unknown" if value is None else (yes if value else no)


def _gib(mib: int | None) -> str:
    return "unknown" if mib is None else f"{mib / 1024:.1f} GiB"


def p2p_summary(facts: Facts) -> str:
    """One phrase for the P2P matrix: 'all pairs', 'none', or which pairs lack it."""
    if len(facts.gpus) < 2:
        return "n/a (fewer than 2 GPUs)"
    if not facts.p2p:
        return "unknown"
    n = len(facts.p2p)
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    missing = [(a, b) for a, b in pairs if not facts.p2p[a][b]]
    if not missing:
        return "all pairs"
    if len(missing) == len(pairs):
        return "none (no pair of GPUs can access each other)"
    return "missing for " + ", ".join(f"{a}->{b}" for a, b in missing)


def facts_rows(facts: Facts) -> list[tuple[str, str]]:
    """(label, value) rows of the facts table, in reading order."""
    return _system_rows(facts) + _gpu_rows(facts) + _comms_rows(facts) + _software_rows(facts)


def _system_rows(facts: Facts) -> list[tuple[str, str]]:
    """OS, hostname, Python and CPU."""
    rows: list[tuple[str, str]] = []
    os_line = f"{facts.os_kind} {facts.os_release}".strip()
    if facts.arch:
        os_line += f" ({facts.arch})"
    rows.append(("OS", os_line))
    host = facts.hostname or "(empty)"
    if facts.hostname_resolves is not None:
        host += f", resolves: {_yes_no(facts.hostname_resolves)}"
    rows.append(("Hostname", host))
    cpu = f"{facts.cpu_count} cores"
    if facts.load_average is not None:
        cpu += f" (load average {facts.load_average:.1f})"
    if facts.memory_mib is not None:
        cpu += f", {_gib(facts.memory_mib)} RAM"
    rows.append(("Python / CPU", f"{facts.python or 'unknown'}; {cpu}"))
    if facts.python_executable:
        rows.append(("Interpreter", facts.python_executable))
    return rows


def _gpu_rows(facts: Facts) -> list[tuple[str, str]]:
    """torch, the NVIDIA driver, the GPUs and the variables that select them."""
    rows: list[tuple[str, str]] = []
    if facts.torch_version is None:
        torch_line = "not installed"
    else:
        build = f"CUDA {facts.torch_cuda}" if facts.torch_cuda else "CPU build"
        torch_line = f"{facts.torch_version} ({build}); CUDA usable: {_yes_no(facts.cuda_available)}"
        if facts.mps_available:
            torch_line += "; MPS usable"
    rows.append(("torch", torch_line))
    if facts.nvidia_smi:
        drv = f"{facts.driver_version or 'unknown'} (supports CUDA {facts.driver_cuda or 'unknown'})"
        if facts.smi_gpu_count is not None:
            drv += f"; nvidia-smi lists {facts.smi_gpu_count} GPU(s)"
    else:
        drv = "no nvidia-smi"
    rows.append(("NVIDIA driver", drv))
    if facts.gpus:
        gpus = "\n".join(
            f"{g.index}: {g.name}, {_gib(g.memory_mib)}"
            + (f", cc {g.capability[0]}.{g.capability[1]}" if g.capability else "")
            for g in facts.gpus
        )
    else:
        gpus = "none visible to torch"
    rows.append(("GPUs", gpus))
    if facts.cuda_visible_devices is not None:
        rows.append(("CUDA_VISIBLE_DEVICES", repr(facts.cuda_visible_devices)))
    if facts.launch_env:
        rows.append(
            ("Set in environment", ", ".join(f"{k}={v}" for k, v in sorted(facts.launch_env.items())))
        )
    return rows


def _comms_rows(facts: Facts) -> list[tuple[str, str]]:
    """Backends, libuv, P2P, shared memory."""
    rows: list[tuple[str, str]] = []
    backends = ", ".join(
        f"{name} {_yes_no(ok)}"
        + (f" {facts.nccl_version}" if name == "nccl" and ok and facts.nccl_version else "")
        for name, ok in (
            ("nccl", facts.nccl_available),
            ("gloo", facts.gloo_available),
            ("mpi", facts.mpi_available),
        )
    )
    rows.append(("Backends", backends))
    libuv = _yes_no(facts.libuv_ok, "TCPStore works with libuv", "TCPStore fails with libuv")
    libuv_error = getattr(facts, "libuv_error", None)
    if libuv_error:
        libuv += f" ({libuv_error})"
    rows.append(("libuv", libuv))
    rows.append(("P2P", p2p_summary(facts)))
    if facts.shm_mib is not None:
        rows.append(("/dev/shm", _gib(facts.shm_mib)))
    return rows


def _software_rows(facts: Facts) -> list[tuple[str, str]]:
    """Packages, accelerate's config, the port, failed probes."""
    rows: list[tuple[str, str]] = []
    if facts.packages:
        rows.append(
            ("Packages", ", ".join(f"{k} {v or 'MISSING'}" for k, v in sorted(facts.packages.items())))
        )
    if facts.accelerate_config_error:
        cfg = f"{facts.accelerate_config_path}: cannot load ({facts.accelerate_config_error})"
    elif facts.accelerate_config:
        c = facts.accelerate_config
        cfg = (
            f"{facts.accelerate_config_path}: {c.get('distributed_type', '?')}, "
            f"{c.get('num_processes', '?')} process(es), mixed_precision {c.get('mixed_precision', '?')}"
        )
    else:
        cfg = f"none ({facts.accelerate_config_path})" if facts.accelerate_config_path else "none"
    rows.append(("accelerate config", cfg))
    rows.append(("Rendezvous port", f"{facts.port} ({_yes_no(facts.port_free, 'free', 'in use')})"))
    for name, why in sorted(facts.probe_errors.items()):
        rows.append((f"probe failed: {name}", why))
    return rows


def render_facts(console: Console, facts: Facts) -> None:
    table = Table(title="This machine", show_header=False, title_justify="left", title_style="bold")
    table.add_column("what", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    for label, value in facts_rows(facts):
        table.add_row(label, escape(value))
    console.print(table)


def render_findings(console: Console, findings: list[Finding]) -> None:
    """A table of findings, then each fix on its own unwrapped line (copyable)."""
    table = Table(title="Findings", title_justify="left", title_style="bold")
    table.add_column("", no_wrap=True)
    table.add_column("check", style="cyan", no_wrap=True)
    table.add_column("finding", overflow="fold")
    for f in findings:
        table.add_row(
            Text(SEVERITY_MARK[f.severity], style=SEVERITY_STYLE[f.severity]), f.code, escape(f.message)
        )
    if findings:
        console.print(table)
    else:
        console.print("[bold]Findings:[/] none")
    fixes = [f for f in findings if f.fix]
    if fixes:
        console.print()
        console.print("[bold]Fixes[/] (each on one line, copy as is):")
        for f in fixes:
            style = SEVERITY_STYLE[f.severity]
            console.print(f"  [{style}]{f.code}[/]:", highlight=False)
            # each line a command or a "#" comment; no markup, no hard wrapping: safe to copy
            for line in f.fix.splitlines():
                console.print(Text("    " + line), soft_wrap=True, highlight=False)


def render_plan(console: Console, plan: Plan) -> None:
    console.print()
    console.print(Text.assemble(("Plan: ", "bold"), plan.summary()), soft_wrap=True, highlight=False)
    table = Table(show_header=True, box=None, padding=(0, 2, 0, 2))
    table.add_column("choice", style="cyan", no_wrap=True)
    table.add_column("value", no_wrap=True)
    table.add_column("why", overflow="fold")
    values = {
        "device": plan.device,
        "num_processes": str(plan.num_processes),
        "backend": plan.backend or "none",
        "launcher": plan.launcher,
        "mixed_precision": plan.mixed_precision,
        "tf32": _yes_no(plan.tf32, "on", "off"),
        "cpu_staged_allreduce": _yes_no(plan.cpu_staged_allreduce, "on", "off"),
        "dataloader_workers": str(plan.dataloader_workers),
        "media_workers": str(plan.media_workers),
        "pin_memory": _yes_no(plan.pin_memory, "on", "off"),
        "threads": str(plan.cpu_threads) if plan.cpu_threads is not None else "default",
    }
    for key, why in plan.reasons.items():
        table.add_row(key, values.get(key, ""), escape(why))
    console.print(table)
    if plan.env:
        console.print("  environment xtrain sets for its workers:", highlight=False)
        for k, v in sorted(plan.env.items()):
            console.print(Text(f"    {k}={v}"), soft_wrap=True, highlight=False)
    if plan.launcher == "spawn" and plan.num_machines == 1:  # xtrain.launch.rendezvous: a FileStore
        console.print("  rendezvous: a file in a private temporary folder (no socket)", highlight=False)
    else:
        console.print(f"  rendezvous: {plan.main_address}:{plan.main_port}", highlight=False)


def render_diagnosis(console: Console, facts: Facts, diagnosis: Diagnosis) -> None:
    render_facts(console, facts)
    console.print()
    render_findings(console, diagnosis.findings)
    render_plan(console, diagnosis.plan)
    worst = diagnosis.worst
    console.print()
    verdict = {
        "ok": "[green]Ready:[/] no problems found.",
        "warn": "[yellow]Ready, with warnings[/] (see the fixes above).",
        "error": "[bold red]Not ready:[/] fix the errors above, then run `xtrain doctor` again.",
    }[worst]
    console.print(verdict, highlight=False)


def smoke_line(result: SmokeResult) -> str:
    """The one-line verdict of a smoke test (plain text)."""
    if not result.ok:
        return f"smoke test FAILED: {result.error or 'see the ranks above'}"
    if result.world_size == 1:
        return f"smoke test passed on {result.device}: {result.note}"
    staged = ", staged through CPU" if result.cpu_staged else ""
    ms = (result.seconds_per_iter or 0) * 1e3
    bw = (
        f"busbw {result.busbw_gbps:.2f} GB/s (algbw {result.algbw_gbps:.2f} GB/s)"
        if result.busbw_gbps
        else ""
    )
    return (
        f"smoke test passed: {result.world_size} processes, {result.backend} on {result.device}{staged} "
        f"via {result.launcher}; all-reduce of {result.size_mib:g} MiB: {ms:.1f} ms, {bw}; "
        f"{result.elapsed_s:.1f} s in all"
    )


def render_smoke(console: Console, result: SmokeResult) -> None:
    console.print()
    if result.ranks:
        table = Table(title="Smoke test", title_justify="left", title_style="bold")
        table.add_column("rank", justify="right")
        table.add_column("device")
        table.add_column("all-reduce")
        table.add_column("time", justify="right")
        for r in result.ranks:
            if r.error:
                check = Text(f"failed: {r.error}", style="red")
            elif r.expected is None:
                check = Text("not needed (one process)", style="green")
            else:
                check = Text(f"{r.value:g} (expected {r.expected:g})", style="green" if r.ok else "red")
            secs = f"{r.seconds * 1e3 / result.iters:.1f} ms/iter" if r.seconds else ""
            table.add_row(str(r.rank), r.device, check, secs)
        console.print(table)
    style = "green" if result.ok else "bold red"
    console.print(Text(smoke_line(result), style=style), soft_wrap=True, highlight=False)
