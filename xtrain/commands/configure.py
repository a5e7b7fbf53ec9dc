"""`xtrain configure`: write the accelerate config that matches this machine's plan.

facts (probe, or --facts FILE) -> planning.resolve.diagnose -> accelerate_config.config_for -> write
(or print with --dry-run) -> load it back with accelerate's ClusterConfig -> next commands.
With --slurm it writes an sbatch script too (and plans for the cluster's nodes, not this one).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import typer

from xtrain.commands.options import parse_gpus
from xtrain.errors import XtrainError

PRECISION_HELP = "no | fp16 | bf16 (default: what the rules pick for the GPUs)"


def _check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise XtrainError(f"--port {port} is not a TCP port", "use 1024..65535, e.g. --port 29500")


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
    port: int | None, main_address: str | None, gpus: str | None, fsdp: bool, deepspeed: str | None
) -> list[int] | None:
    """The options checked before anything is probed; returns the ``--gpus`` ids."""
    from xtrain.launch.accelerate_config import DEEPSPEED_STAGES

    _check_port(port)
    check_main_address(main_address)
    gpu_ids = parse_gpus(gpus)
    if deepspeed is not None and deepspeed not in DEEPSPEED_STAGES:
        raise XtrainError(
            f"--deepspeed {deepspeed!r} is unknown", "use --deepspeed zero2 or --deepspeed zero3"
        )
    if fsdp and deepspeed:
        raise XtrainError("--fsdp and --deepspeed exclude each other", "pick one of them")
    return gpu_ids


def _slurm_facts(
    facts_file: Path | None,
    processes: int | None,
    port: int | None,
    precision: str | None,
    notes: list[str],
    **job: Any,
) -> tuple[Any, int]:
    """``--slurm`` (``--nodes`` given): the facts to plan the cluster's nodes from (``--facts``,
    else a generic GPU node) and the GPUs per node. ``job``: nodes, gpus_per_node, time,
    partition, job_name."""
    from xtrain.launch import slurm as sl
    from xtrain.machine.facts import Facts

    facts = Facts.load(facts_file) if facts_file else None
    gpus_per_node = job["gpus_per_node"]
    if gpus_per_node is None:
        if facts is None or not facts.gpus:
            raise XtrainError("--slurm needs --gpus-per-node", "e.g. --gpus-per-node 8")
        gpus_per_node = processes or facts.gpu_count
    if processes is not None and processes != gpus_per_node:
        raise XtrainError("--processes and --gpus-per-node disagree", "give only --gpus-per-node")
    sl.SlurmJob(**{**job, "gpus_per_node": gpus_per_node}, config_path="x").check()
    if facts is None:
        facts = sl.cluster_facts(gpus_per_node, port=port or 29500)
        if precision is None:
            notes.append(
                "GPU model unknown: fp16 (runs on every CUDA GPU); use --precision bf16 on "
                "A100/H100 nodes, or --facts FILE saved on a node with `xtrain doctor --save FILE`"
            )
    return facts, gpus_per_node


def _write_or_show(console: Any, files: list[tuple[Path, str, str]], dry_run: bool, force: bool) -> None:
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


def _print_findings(console: Any, findings: list[Any]) -> None:
    """The doctor findings that still matter once the config is rewritten, with their fixes."""
    from rich.markup import escape

    for f in findings:
        # Findings about the old accelerate config are moot: this command replaces it.
        if f.severity != "ok" and not f.code.startswith("accelerate-config"):
            colour = "red" if f.severity == "error" else "yellow"
            console.print(f"[{colour}]{f.severity}[/] {escape(f.message)}", soft_wrap=True)
            for line in (f.fix or "").splitlines():  # each fix line whole, as printed by doctor
                console.print(f"    {line}", markup=False, highlight=False, soft_wrap=True)


# Over 80 lines: about 30 are its typer options; the rest is the command's one sequence (options,
# facts, plan, files, findings, next commands), with each part's detail in the helpers above.
def configure(
    output: Path = typer.Option(
        None, "--output", "-o", help="Write here instead of accelerate's default config file."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the config; write nothing."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file (a backup is kept)."),
    processes: int = typer.Option(
        None, "--processes", help="Processes on this machine (default: 1 per GPU)."
    ),
    gpus: str = typer.Option(None, "--gpus", help='GPU ids to use, e.g. "0,1" (default: all).'),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    port: int = typer.Option(None, "--port", help="Rendezvous port (default 29500)."),
    machines: int = typer.Option(1, "--machines", help="Number of machines (multi-node)."),
    machine_rank: int = typer.Option(0, "--machine-rank", help="This machine's rank; 0 is the main one."),
    main_address: str = typer.Option(None, "--main-address", help="IP of the rank-0 machine (multi-node)."),
    facts_file: Path = typer.Option(None, "--facts", help="Plan from a snapshot (xtrain doctor --save)."),
    fsdp: bool = typer.Option(False, "--fsdp", help="Shard the model with FSDP2 (CUDA GPUs)."),
    deepspeed: str = typer.Option(None, "--deepspeed", help="DeepSpeed ZeRO stage: zero2 | zero3."),
    slurm: Path = typer.Option(None, "--slurm", help="Also write an sbatch script for a SLURM cluster here."),
    nodes: int = typer.Option(None, "--nodes", help="SLURM: number of nodes."),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node", help="SLURM: GPUs (= processes) per node."),
    time: str = typer.Option(None, "--time", help="SLURM: time limit, e.g. 04:00:00."),
    partition: str = typer.Option(None, "--partition", help="SLURM: partition."),
    job_name: str = typer.Option("xtrain", "--job-name", help="SLURM: job name."),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Write the accelerate config for this machine (and print what to run next)."""
    from xtrain.console import make_console
    from xtrain.launch import accelerate_config as ac
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Overrides
    from xtrain.planning.resolve import diagnose

    console = make_console()
    gpu_ids = _check_options(port, main_address, gpus, fsdp, deepspeed)
    job = None
    notes: list[str] = []
    if slurm is not None:
        from xtrain.launch import slurm as sl

        if nodes is None:
            raise XtrainError(
                "--slurm needs --nodes", "e.g. --slurm train.sbatch --nodes 2 --gpus-per-node 8"
            )
        if machines != 1 or machine_rank != 0 or main_address:
            raise XtrainError(
                "--slurm sets machines, ranks and the main address itself",
                "leave out --machines/--machine-rank/--main-address",
            )
        facts, gpus_per_node = _slurm_facts(facts_file, processes, port, precision, notes, nodes=nodes,
                                            gpus_per_node=gpus_per_node, time=time, partition=partition,
                                            job_name=job_name)  # fmt: skip
        # planned for the nodes; the script resolves the main address on the first node
        layout = (gpus_per_node, platform or "linux", nodes, 0, "$" + sl.MAIN_ADDR_VAR)
    else:
        if any(v is not None for v in (nodes, gpus_per_node, time, partition)):
            raise XtrainError("--nodes/--gpus-per-node/--time/--partition need --slurm", "add --slurm FILE")
        if facts_file is not None:
            facts = Facts.load(facts_file)
        else:
            from xtrain.machine.probe import collect

            facts = collect(quick=True, port=port or 29500)
        layout = (processes, platform, machines, machine_rank, main_address)
    num_processes, plan_platform, num_machines, rank, address = layout
    overrides = Overrides(
        num_processes=num_processes,
        gpu_ids=gpu_ids,
        mixed_precision=precision,
        port=port,
        platform=plan_platform,
        num_machines=num_machines,
        machine_rank=rank,
        main_address=address,
    )

    diagnosis = diagnose(facts, overrides)
    plan = diagnosis.plan
    cfg = ac.config_for(plan, fsdp=fsdp, deepspeed=deepspeed)
    cfg["gpu_ids"] = ac.physical_gpu_ids(cfg["gpu_ids"], facts.cuda_visible_devices)
    if slurm is not None:
        cfg.pop("main_process_ip", None)  # the script passes the first node's address
    if deepspeed and plan.os_kind == "windows":
        notes.append("DeepSpeed does not train on native Windows: run it in WSL2 or on Linux")

    # Where the files go.
    if slurm is not None:
        slurm_path = slurm.expanduser()
        target = output.expanduser() if output else slurm_path.with_suffix(".accelerate.yaml")
        job = sl.SlurmJob(nodes=nodes, gpus_per_node=gpus_per_node, config_path=str(target.resolve()),
                          port=plan.main_port, time=time, partition=partition, job_name=job_name,
                          env=dict(plan.env))  # fmt: skip
        script = sl.sbatch_script(job)
        if slurm_path.resolve() == target.resolve():
            raise XtrainError("--slurm and --output name the same file", "give them different names")
    else:
        slurm_path = None
        target = output.expanduser() if output else ac.default_config_path()

    if not dry_run:
        # Check every target before writing any, so a refusal leaves nothing half-done.
        for p in [target] + ([slurm_path] if slurm_path else []):
            if p.exists() and not force:
                raise XtrainError(f"{p} exists; use --force (a backup is kept)")
    header = ac.header_for(plan)
    if slurm_path is not None:
        header += f"\nFor the sbatch script {slurm_path.name}: it adds each node's rank and the main address."
    text = ac.to_yaml(cfg, header)
    console.print(f"[bold]Plan:[/] {plan.summary()}", soft_wrap=True)
    files = [(target, text, "loads with accelerate's ClusterConfig")]
    if job is not None:
        files.append((slurm_path, script, "sbatch script"))
    if dry_run:
        ac.validate_dict(cfg)
    _write_or_show(console, files, dry_run, force)

    _print_findings(console, diagnosis.findings)
    for note in notes:
        console.print(f"[yellow]note[/] {note}", soft_wrap=True)

    console.print("[bold]Next:[/]")
    if job is not None:
        commands = [f"sbatch {slurm_path}", f"sbatch {slurm_path} --config YOUR.yaml   # your own job"]
    else:
        commands = ac.next_commands(plan, target, sharded=fsdp or deepspeed is not None)
    for line in commands:
        console.print(f"  {line}", markup=False, soft_wrap=True)
