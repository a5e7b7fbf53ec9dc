"""The checks that look at the plan: what the workers will train with and why (precision, data
loading, attention, loss), said by the launcher, and the memory estimate against the smallest GPU."""

from __future__ import annotations

from dataclasses import replace

from xtrain import tasks
from xtrain.errors import XtrainError
from xtrain.model import attention, memory
from xtrain.planning.run import Run
from xtrain.runtime.quiet import quiet_libraries
from xtrain.tasks.sizes import frozen_bytes, offline_sizes, other_sizes
from xtrain.train.levers import loss_words
from xtrain.train.preflight.notes import Note, Where


def _precision(run: Run, where: Where) -> list[Note]:
    """The precision the workers train in and why (the launcher's line), and a precision that
    narrows the weights' range (``checks.precision``), said by the launcher and by a worker that
    planned itself (a plan xtrain's launcher sent has no findings: its command said them)."""
    plan = run.plan
    notes = []
    if where.launcher:
        shown = plan.mixed_precision if plan.mixed_precision != "no" else "fp32"
        why = plan.reasons.get("mixed_precision", "")
        notes.append(Note("Precision", f"{shown} ({why})" if why else shown))
    for f in run.findings:
        if f.code.startswith("precision-"):
            notes.append(Note("warning", f.message + (f"; fix: {f.fix}" if f.fix else ""), "warning"))
    return notes


def _loading(run: Run, where: Where) -> list[Note]:
    """The DataLoader workers each process reads its batches with, and why; the compute threads
    of a CPU run (fewer on a busy CPU: planning/threads.py), or the ones a user set."""
    if not where.launcher:
        return []
    workers, why = run.settings.workers_for(tasks.get(run.cfg.model.task).decodes_media)
    notes = [Note("Data loading", f"{workers} worker(s) per process ({why})")]
    threads = run.plan.reasons.get("threads")
    return notes + ([Note("Threads", threads)] if threads else [])


def _attention(run: Run, where: Where) -> list[Note]:
    """The attention implementation the plan's workers will load with, and why; an explicit
    ``model.attn_implementation`` that cannot work stops here (a worker decides at load)."""
    if not where.launcher:
        return []
    chosen = attention.for_plan(run, tasks.get(run.cfg.model.task).model_class)
    return [Note("Attention", chosen.summary())]


def _sequence(run: Run, where: Where) -> list[Note]:
    """``parallel.sequence``: how each sequence is split and why (the mode from the model's
    heads), or one line for a model family outside transformers' attention registry, heads that
    Ulysses cannot split, an attention implementation it does not wrap. From the model's config
    where it already is (never a download); else said, and each worker checks its loaded model
    (``train/distributed/sequence.py``)."""
    settings, cfg = run.settings, run.cfg
    if not where.launcher or settings.sequence <= 1:
        return []
    from xtrain.model import sequence_parallel
    from xtrain.planning import sequence

    task = tasks.get(cfg.model.task)
    facts = sequence_parallel.offline_facts(cfg, task.model_class)
    if isinstance(facts, str):
        split = f"each sequence split across {settings.sequence} processes"
        return [Note("Sequence", f"{split} (the model checked when it loads: {facts})")]
    chosen = attention.for_plan(run, task.model_class).name
    sequence.check_family(facts.name, facts.registry, chosen if chosen in sequence.INNER else None)
    if task.sequence_entry is not None:  # rows the model sees whole first (vision-language)
        sequence.check_entry(facts.model_type, task.sequence_entry.families, task.name)
    mode, why = sequence.choose_mode(
        cfg.parallel.sequence_mode, settings.sequence, facts.heads, facts.kv_heads
    )
    for other in task.other_models(cfg) if task.other_models else ():  # a teacher runs on the shards too
        teacher = replace(cfg, model=replace(cfg.model, name_or_path=other.name))
        found = sequence_parallel.offline_facts(teacher, task.model_class)
        if not isinstance(found, str):
            sequence.check_family(f"{found.name} ({other.key})", found.registry, None)
    line = sequence.summary(settings.sequence, settings.world_size, mode, why)
    if run.plan.backend == "gloo" and run.plan.device == "cuda":
        line += "; exchanged through host memory (gloo with CUDA tensors)"
    return [Note("Sequence", line)]


def _loss(run: Run, where: Where) -> list[Note]:
    """Which loss the workers train with and why (``model.chunked_loss``), and whether their
    activations go to host memory (``model.activation_offload``); ``model.chunked_loss=on`` for a
    task without a vocabulary stops here. Each worker checks its model's head (``train/levers.py``:
    a config whose loss the chunked loss does not reproduce runs the plain loss under auto)."""
    if not where.launcher:
        return []
    settings = run.settings
    token_loss = tasks.get(run.cfg.model.task).token_loss
    chunked, why = settings.loss_for(token_loss)
    notes = [Note("Loss", f"{loss_words(token_loss, chunked)} ({why})")]
    if settings.activation_offload:
        moved = "saved for the backward pass in host memory (model.activation_offload)"
        notes.append(Note("Activations", moved))
    return notes


def _memory(run: Run, where: Where) -> list[Note]:
    """The plan's memory estimate against its smallest GPU, and the warning when it does not fit.
    CUDA plans only: transformers (seconds to import) loads only then. A model whose config is
    not on this machine is skipped in a dim line (nothing is downloaded). A worker checks its
    built model instead (``Recipe``)."""
    if not where.launcher or run.facts is None:
        return []
    plan, cfg = run.plan, run.cfg
    gpus = [(g.index, g.name, g.memory_mib) for g in run.facts.gpus]
    gpu = memory.smallest_gpu(gpus, plan.gpu_ids) if plan.device == "cuda" else None
    if gpu is None:
        return []
    quiet_libraries()  # building the model's skeleton: no library chatter
    others = _other_models(run, gpu)
    sizes = offline_sizes(cfg)
    if isinstance(sizes, str):
        return [Note("", f"memory estimate skipped: {sizes}", "dim")]
    task, settings, facts = tasks.get(cfg.model.task), run.settings, run.facts
    levers = memory.MemoryLevers(  # the chunked loss and offloading as the run has them, and can offer
        chunked=settings.loss_for(task.token_loss)[0],
        chunkable=task.token_loss is not None and settings.chunked_loss == "off" and not cfg.run.compile,
        offload=settings.activation_offload,
        host_gib=facts.memory_mib / 1024 if facts.memory_mib and not cfg.run.compile else None,
        processes=plan.num_processes,
        sequence=settings.sequence,  # parallel.sequence: each process's share of every sequence
    )
    check = memory.check_memory(
        sizes, cfg.batch.per_device, cfg.data.max_length, cfg.model.gradient_checkpointing, run.precision,
        gpu[1], gpu[0], images=task.image_tokens, windows=facts.os_kind == "windows", levers=levers,
    )  # fmt: skip
    notes = [Note("Memory", check.summary() + (f"; {'; '.join(others)}" if others else ""))]
    if task.sequence_parallel and (
        settings.sequence > 1 or plan.world_size > 1
    ):  # with and without splitting
        longest = memory.longest_line(
            sizes, cfg.batch.per_device, cfg.model.gradient_checkpointing, run.precision, gpu[1], levers,
            plan.world_size,
        )  # fmt: skip
        notes.append(Note("Longest sequence", longest))
    return notes + ([Note("warning", check.warning, "warning")] if check.warning else [])


def _other_models(run: Run, gpu: tuple[str, float]) -> list[str]:
    """The frozen models beside the trained one (a distillation teacher), each sized as it loads:
    one that cannot fit the card by itself refuses the run in one line; the others are said as part
    of the estimate (or, their configs not on this machine, as not counted)."""
    said = []
    for other, found in other_sizes(run.cfg):
        if isinstance(found, str):
            said.append(f"{other.key} {other.name} not counted: {found}")
            continue
        gib = 1.1 * found / memory.GIB
        how = f"in {other.quantization}" if other.quantization else "as model.dtype loads it"
        if gib > gpu[1]:
            fix = "use a smaller teacher, or a card with more memory"
            four = frozen_bytes(run.cfg, replace(other, quantization="4bit"))
            if other.quantization != "4bit" and other.quantization_key and isinstance(four, float):
                smaller = memory.size(1.1 * four / memory.GIB, 1)
                fix = f"load it in 4 bits: {other.quantization_key}=4bit (~{smaller})"
            raise XtrainError(
                f"{other.key}={other.name} alone needs ~{memory.size(gib, 1)} ({how}), more than {gpu[0]} "
                f"({memory.size(gpu[1], 0)}) a process holds beside the student",
                fix,
            )
        said.append(f"{other.key} {other.name} ~{memory.size(gib, 1)} of it ({how})")
    return said
