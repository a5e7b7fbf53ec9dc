"""`xtrain configure`: write the accelerate config that matches this machine's plan.

options -> planning.resolve (facts probed or --facts FILE, plan, findings) ->
accelerate_config.config_for -> write (or print with --dry-run) -> load it back with accelerate's
ClusterConfig -> next commands.
With --slurm it writes an sbatch script too (and plans for the cluster's nodes, not this one).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from xtrain.commands.options import parse_gpus, whole
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.launch.slurm import SlurmJob
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Finding, Plan
    from xtrain.planning.resolve import Resolved

PRECISION_HELP = "no | fp16 | bf16 (default: what the rules pick for the GPUs)"


@dataclass
class ConfigureOptions:
    """`xtrain configure`'s options, as typer parsed them (see ``configure`` for their help)."""

    output: Path | None = None
    dry_run: bool = False
    force: bool = False
    processes: int | None = None
    gpus: str | None = None
    precision: str | None = None
    port: int | None = None
    machines: int = 1
    machine_rank: int = 0
    main_address: str | None = None
    facts_file: Path | None = None
    fsdp: bool = False
    deepspeed: str | None = None
    slurm: Path | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    job_name: str = "xtrain"
    mem: str | None = None
    platform: str | None = None

    def slurm_job(self, processes_per_node: int, **fields: Any) -> SlurmJob:
        from xtrain.launch import slurm as sl

        if self.mem is not None:
            fields["mem"] = self.mem
        return sl.SlurmJob(nodes=self.nodes, processes_per_node=processes_per_node, time=self.time,
                           partition=self.partition, job_name=self.job_name, **fields)  # fmt: skip


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")


def check_main_address(address: str | None) -> None:
    """--main-address goes into the accelerate config and into printed commands: only an IP
    address or a DNS hostname is accepted, so a pasted command can never run something else."""
    if address is None:
        return
    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    if not _HOSTNAME.match(address):
        raise XtrainError(
            f"--main-address {address!r} is neither an IP address nor a hostname",
            "give the rank-0 machine's IP, e.g. --main-address 10.0.0.1",
        )


def _check_options(
    main_address: str | None, gpus: str | None, fsdp: bool, deepspeed: str | None
) -> list[int] | None:
    """The options checked before anything is probed (the settings themselves: by
    ``xtrain.planning.resolve``); returns the ``--gpus`` ids."""
    from xtrain.launch.accelerate_config import DEEPSPEED_STAGES

    check_main_address(main_address)
    gpu_ids = parse_gpus(gpus)
    if deepspeed is not None and deepspeed not in DEEPSPEED_STAGES:
        raise XtrainError(
            f"--deepspeed {deepspeed!r} is unknown", "use --deepspeed zero2 or --deepspeed zero3"
        )
    if fsdp and deepspeed:
        raise XtrainError("--fsdp and --deepspeed exclude each other", "pick one of them")
    return gpu_ids


def _slurm_facts(opts: ConfigureOptions, notes: list[str]) -> tuple[Facts, int]:
    """``--slurm`` (``--nodes`` given): the facts to plan the cluster's nodes from (``--facts``,
    else a generic GPU node) and the processes per node (its GPUs; ``--processes`` or 1 on a
    snapshot of a node without GPUs: a CPU job)."""
    from xtrain.launch import slurm as sl
    from xtrain.machine.facts import Facts

    facts = Facts.load(opts.facts_file) if opts.facts_file else None
    gpus_per_node, processes = opts.gpus_per_node, opts.processes
    if facts is not None and not facts.gpus:
        if gpus_per_node is not None:
            raise XtrainError(
                f"--gpus-per-node {gpus_per_node} but the node in {opts.facts_file} has no GPU",
                "leave out --gpus-per-node for a CPU job (--processes N for several processes a node)",
            )
        gpus_per_node = processes or 1
    if gpus_per_node is None:
        if facts is None:
            raise XtrainError(
                "--slurm needs --gpus-per-node",
                "e.g. --gpus-per-node 8; for CPU-only nodes plan from a node's snapshot: --facts node.json",
            )
        gpus_per_node = processes or facts.gpu_count
    if processes is not None and processes != gpus_per_node:
        raise XtrainError("--processes and --gpus-per-node disagree", "give only --gpus-per-node")
    opts.slurm_job(gpus_per_node, config_path="x").check()
    if facts is None:
        facts = sl.cluster_facts(gpus_per_node, port=opts.port or 29500)
        if opts.precision is None:
            notes.append(
                "GPU model unknown: fp16 (runs on every CUDA GPU); use --precision bf16 on "
                "A100/H100 nodes, or --facts FILE saved on a node with `xtrain doctor --save FILE`"
            )
    return facts, gpus_per_node


def _write_or_show(console: Console, files: list[tuple[Path, str, str]], dry_run: bool, force: bool) -> None:
    """Each (path, text, what it is): printed with ``--dry-run``, else written (the old file kept
    as a backup) and, for the accelerate config (the first), loaded back with accelerate's loader."""
    from xtrain.launch import accelerate_config as ac

    for i, (path, text, what) in enumerate(files):
        if dry_run:
            console.print(f"[dim]# {path} (dry run: nothing written)[/]", soft_wrap=True)
            console.print(text.rstrip("\n"), markup=False, soft_wrap=True)
            continue
        result = ac.write_text_safely(text, path, force=force)
        if i == 0:
            ac.validate(result.path)
        else:
            result.path.chmod(0o755)
        console.print(f"[green]Wrote[/] {result.path} [dim]({what})[/]", soft_wrap=True)
        if result.backup_path:
            console.print(f"[dim]The old file is kept as {result.backup_path}[/]", soft_wrap=True)


def _print_findings(console: Console, findings: list[Finding]) -> None:
    """The doctor findings that still matter once the config is rewritten, with their fixes."""
    from rich.markup import escape

    for f in findings:
        # Findings about the old accelerate config are moot: this command replaces it.
        if f.severity != "ok" and not f.code.startswith("accelerate-config"):
            colour = "red" if f.severity == "error" else "yellow"
            console.print(f"[{colour}]{f.severity}[/] {escape(f.message)}", soft_wrap=True)
            for line in (f.fix or "").splitlines():  # each fix line whole, as printed by doctor
                console.print(f"    {line}", markup=False, highlight=False, soft_wrap=True)


def configure(
    output: Path = typer.Option(
        None, "--output", "-o", help="Write here instead of accelerate's default config file."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the config; write nothing."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file (a backup is kept)."),
    processes: int = typer.Option(
        None,
        "--processes",
        parser=whole("--processes"),
        help="Processes on this machine (default: 1 per GPU).",
    ),
    gpus: str = typer.Option(None, "--gpus", help='GPU ids to use, e.g. "0,1" (default: all).'),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    port: int = typer.Option(None, "--port", parser=whole("--port"), help="Rendezvous port (default 29500)."),
    machines: int = typer.Option(
        1, "--machines", parser=whole("--machines"), help="Number of machines (multi-node)."
    ),
    machine_rank: int = typer.Option(
        0, "--machine-rank", parser=whole("--machine-rank"), help="This machine's rank; 0 is the main one."
    ),
    main_address: str = typer.Option(None, "--main-address", help="IP of the rank-0 machine (multi-node)."),
    facts_file: Path = typer.Option(None, "--facts", help="Plan from a snapshot (xtrain doctor --save)."),
    fsdp: bool = typer.Option(False, "--fsdp", help="Shard the model with FSDP2 (CUDA GPUs)."),
    deepspeed: str = typer.Option(None, "--deepspeed", help="DeepSpeed ZeRO stage: zero2 | zero3."),
    slurm: Path = typer.Option(None, "--slurm", help="Also write an sbatch script for a SLURM cluster here."),
    nodes: int = typer.Option(None, "--nodes", parser=whole("--nodes"), help="SLURM: number of nodes."),
    gpus_per_node: int = typer.Option(
        None, "--gpus-per-node", parser=whole("--gpus-per-node"), help="SLURM: GPUs (= processes) per node."
    ),
    time: str = typer.Option(None, "--time", help="SLURM: time limit, e.g. 04:00:00."),
    partition: str = typer.Option(None, "--partition", help="SLURM: partition."),
    job_name: str = typer.Option("xtrain", "--job-name", help="SLURM: job name."),
    mem: str = typer.Option(
        None, "--mem", help="SLURM: memory per node, e.g. 64G (default: 32G per GPU process, 8G per CPU one)."
    ),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Write the accelerate config for this machine (and print what to run next)."""
    from xtrain.console import make_console

    opts = ConfigureOptions(
        output=output, dry_run=dry_run, force=force, processes=processes, gpus=gpus, precision=precision,
        port=port, machines=machines, machine_rank=machine_rank, main_address=main_address,
        facts_file=facts_file, fsdp=fsdp, deepspeed=deepspeed, slurm=slurm, nodes=nodes,
        gpus_per_node=gpus_per_node, time=time, partition=partition, job_name=job_name, mem=mem,
        platform=platform,
    )  # fmt: skip
    console = make_console()
    notes: list[str] = []
    resolved, gpus_per_node = _resolve(opts, notes)
    plan = resolved.plan
    files, config = _files(opts, resolved, gpus_per_node, notes)
    console.print(f"[bold]Plan:[/] {plan.summary()}", soft_wrap=True)
    if opts.dry_run:
        from xtrain.launch import accelerate_config as ac

        ac.validate_dict(config)
    _write_or_show(console, files, opts.dry_run, opts.force)

    _print_findings(console, resolved.findings)
    for note in notes:
        console.print(f"[yellow]note[/] {note}", soft_wrap=True)
    _print_next(console, opts, plan, files)


def _resolve(opts: ConfigureOptions, notes: list[str]) -> tuple[Resolved, int | None]:
    """The options checked, then the plan for this machine (or ``--facts``), or with ``--slurm``
    for the cluster's nodes (``--facts``, else a generic GPU node). Returns the resolved plan and
    the GPUs per node (``--slurm``)."""
    from xtrain.machine.facts import Facts
    from xtrain.planning.resolve import resolve

    gpu_ids = _check_options(opts.main_address, opts.gpus, opts.fsdp, opts.deepspeed)
    if opts.slurm is None:
        if any(v is not None for v in (opts.nodes, opts.gpus_per_node, opts.time, opts.partition, opts.mem)):
            raise XtrainError(
                "--nodes/--gpus-per-node/--time/--partition/--mem need --slurm", "add --slurm FILE"
            )
        facts = Facts.load(opts.facts_file) if opts.facts_file is not None else None  # else: probed
        layout = (opts.processes, opts.platform, opts.machines, opts.machine_rank, opts.main_address)
        gpus_per_node = None
    else:
        from xtrain.launch import slurm as sl

        if opts.nodes is None:
            raise XtrainError(
                "--slurm needs --nodes", "e.g. --slurm train.sbatch --nodes 2 --gpus-per-node 8"
            )
        if opts.machines != 1 or opts.machine_rank != 0 or opts.main_address:
            raise XtrainError(
                "--slurm sets machines, ranks and the main address itself",
                "leave out --machines/--machine-rank/--main-address",
            )
        facts, gpus_per_node = _slurm_facts(opts, notes)
        # planned for the nodes; the script resolves the main address on the first node
        layout = (gpus_per_node, opts.platform or "linux", opts.nodes, 0, "$" + sl.MAIN_ADDR_VAR)
    processes, platform, machines, rank, address = layout
    resolved = resolve(
        processes=processes, gpu_ids=gpu_ids, precision=opts.precision, port=opts.port, platform=platform,
        machines=machines, machine_rank=rank, main_address=address, facts=facts,
    )  # fmt: skip
    if opts.deepspeed and resolved.plan.os_kind == "windows":
        notes.append("DeepSpeed does not train on native Windows: run it in WSL2 or on Linux")
    return resolved, gpus_per_node


def _files(
    opts: ConfigureOptions, resolved: Resolved, gpus_per_node: int | None, notes: list[str]
) -> tuple[list[tuple[Path, str, str]], dict[str, Any]]:
    """The files to write, (path, text, what it is), the accelerate config first, and that config
    as a dict. Every target is checked before any is written, so a refusal leaves nothing
    half-done."""
    from xtrain.launch import accelerate_config as ac

    plan = resolved.plan
    config = ac.config_for(plan, fsdp=opts.fsdp, deepspeed=opts.deepspeed)
    config["gpu_ids"] = ac.physical_gpu_ids(config["gpu_ids"], resolved.facts.cuda_visible_devices)
    header = ac.header_for(plan)
    if opts.slurm is None:
        target = opts.output.expanduser() if opts.output else ac.default_config_path()
        scripts: list[tuple[Path, str, str]] = []
    else:
        from xtrain.launch import slurm as sl

        config.pop("main_process_ip", None)  # the script passes the first node's address
        slurm_path = opts.slurm.expanduser()
        target = opts.output.expanduser() if opts.output else slurm_path.with_suffix(".accelerate.yaml")
        if slurm_path.resolve() == target.resolve():
            raise XtrainError("--slurm and --output name the same file", "give them different names")
        facts = resolved.facts
        job = opts.slurm_job(
            gpus_per_node, config_path=str(target.resolve()), port=opts.port, env=dict(plan.env),
            gpus_per_node=gpus_per_node if plan.device == "cuda" else 0,
            cpus_per_task=sl.cpus_per_task(plan, facts.cpu_count),
            mem=sl.mem_per_node(plan, facts.memory_mib),  # (--mem: slurm_job replaces it)
        )  # fmt: skip
        scripts = [(slurm_path, sl.sbatch_script(job), "sbatch script")]
        header += f"\nFor the sbatch script {slurm_path.name}: it adds each node's rank and the main address."
    files = [(target, ac.to_yaml(config, header), "loads with accelerate's ClusterConfig"), *scripts]
    if not opts.dry_run:
        for path, _, _ in files:
            if path.exists() and not opts.force:
                raise XtrainError(f"{path} exists; use --force (a backup is kept)")
    return files, config


def _print_next(
    console: Console, opts: ConfigureOptions, plan: Plan, files: list[tuple[Path, str, str]]
) -> None:
    """The commands to run next: sbatch for ``--slurm``, else accelerate launch / xtrain train."""
    from xtrain.launch import accelerate_config as ac

    console.print("[bold]Next:[/]")
    if opts.slurm is not None:
        script = files[1][0]
        commands = [f"sbatch {script}", f"sbatch {script} --config YOUR.yaml   # your own job"]
    else:
        commands = ac.next_commands(plan, files[0][0], sharded=opts.fsdp or opts.deepspeed is not None)
    for line in commands:
        console.print(f"  {line}", markup=False, soft_wrap=True)
