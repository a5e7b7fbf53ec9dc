"""Settings resolved once: (a train config or none, the machine's facts, the launch context, the
user's choices) -> the plan, its findings and the run settings.

Every "auto" a user can leave is decided here, in numbered steps (the spirit of Lightning
Fabric's connector), and nowhere else. ``resolve`` is the one entry: doctor, configure,
quickstart, bench, ``xtrain train``, every launch mode of ``python -m xtrain.run`` and the
training loop call it.

1. The choices: the user's (``--processes``, ``--gpus``, ``--precision``, ...) with what the
   launch context adds (``xtrain.planning.context``: a launcher's process count, which
   ``--processes`` must agree with; one worker per GPU that accelerate's one-process launch left
   visible; one process for ``python -m xtrain.run`` alone), the config's precision
   (``choose_precision``), the one ``accelerate launch`` exported (``exported_precision``: the
   rules count it as a choice only where it differs from the machine's default), the weights'
   dtype (``model.dtype``) and the checkpoint's (``checkpoint_dtype``: read by the caller, machine
   I/O kept out of here), made into the one ``Overrides`` and checked (``Overrides.check``) before
   anything is probed.
2. The plan: the one this process already holds (the loop) or that xtrain's launcher sent
   (``XTRAIN_PLAN``), else the rules' answer (``rules.make_plan``) with the checks' findings
   (``diagnose``) for the facts given (a ``--facts`` snapshot) or probed here: the only probe of
   a command (quick, or ``full_probe`` for doctor and quickstart).
3. ``run_settings``: the plan + the config + the world size -> ``RunSettings``: accumulation,
   global batch, learning rate (scaled for the global batch), precision, DataLoader workers,
   experiment trackers, torch.compile (refused where the plan's ``compile_blocker`` says why).
   Frozen; a global batch that does not divide stops here, before any process starts, and each
   rank's loop reads only its fields.
4. ``choose_attention``: ``model.attn_implementation`` from ``AttentionFacts`` (flash-attn
   installed, the device and its compute capability, the precision, what the model class
   supports). The facts need the model's class, so the train layer gathers them
   (``xtrain.model.attention``): for the plan before launching and in each worker before loading.

Pure functions except the probe (``facts=None``) and the environment ``exported_precision`` reads
(``xtrain.planning.context``, the one reader of the launch variables),
so every platform's answer is testable from a saved facts snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.machine import probe
from xtrain.machine.facts import DEFAULT_PORT, Facts
from xtrain.planning.batch import batch_line, gradient_accumulation, scaled_lr
from xtrain.planning.checks import CHECKS
from xtrain.planning.context import LaunchContext, exported_precision
from xtrain.planning.plan import Diagnosis, Overrides, Plan
from xtrain.planning.rules import make_plan
from xtrain.planning.sequence import SequencePlan, check_length, sequence_plan

AUTO = (None, "", "auto")


@dataclass(frozen=True)
class RunSettings:
    """How this run trains, for this world size: what the loop, the banner and the checkpoint
    state read (never re-derived from the config)."""

    world_size: int
    per_device: int
    accumulation: int  # micro-batches per optimizer step on each rank
    global_batch: int  # per_device x world_size x accumulation: samples per optimizer step
    lr: float  # optim.lr scaled for the global batch (optim.lr_scaling)
    precision: str  # no | fp16 | bf16
    # DataLoader workers per process and why: data.num_workers, else the plan's for tokenised rows
    # (``loader_*``) and for rows that decode images or audio (``media_*``); see ``workers_for``
    loader_workers: int = 0
    loader_why: str = ""
    media_workers: int = 0
    media_why: str = ""
    pin_memory: bool = False  # the plan's
    trackers: tuple[str, ...] = ()  # run.report_to (auto: tensorboard unless run.tensorboard is false)
    compile: bool = False  # run.compile: torch.compile through accelerate (checked against the plan)
    # model.chunked_loss as far as the plan decides it (auto | on | off; ``loss_for`` with the
    # task and the model decides the rest) and why, and model.activation_offload (checked)
    chunked_loss: str = "off"
    loss_why: str = ""
    activation_offload: bool = False
    # parallel.sequence: processes a sequence is split across (1: off); the batch arithmetic above
    # (accumulation, global batch) is that of world_size / sequence data-parallel groups
    sequence: int = 1

    @property
    def sequence_plan(self) -> SequencePlan:
        """Which ranks share a sequence and which train data-parallel (``planning.sequence``)."""
        return SequencePlan(self.sequence, self.world_size)

    @property
    def data_parallel(self) -> int:
        """Processes that read different rows: the world, or its sequence-parallel groups."""
        return self.world_size // self.sequence

    @property
    def batch_line(self) -> str:
        """``global batch 16 = 8 per-device x 1 process x 2 accumulation``: the plan's line of a run."""
        return batch_line(
            self.global_batch, self.per_device, self.world_size, self.accumulation, self.sequence
        )

    def loss_for(self, token_loss: str | None, refusal: str | None = None) -> tuple[bool, str]:
        """(whether the chunked loss runs, why) for a task whose loss is ``token_loss``
        (``Task.token_loss``; None: not a cross-entropy over a vocabulary) on a model for which
        ``refusal`` says why the chunked loss would not be its own loss (None: it would be).
        ``on`` where it cannot run raises one line."""
        asked = self.chunked_loss
        if asked == "off":
            return False, self.loss_why or "model.chunked_loss=off"
        if token_loss is None:
            if asked == "on":
                raise XtrainError(
                    "model.chunked_loss=on: this task's loss is not a cross-entropy over a vocabulary",
                    "leave model.chunked_loss at auto (or off)",
                )
            return False, "the task's loss is not a cross-entropy over a vocabulary"
        if refusal is not None:
            if asked == "on":
                raise XtrainError(f"model.chunked_loss=on: {refusal}", "set model.chunked_loss=auto or off")
            return False, f"model.chunked_loss=auto: {refusal}"
        if asked == "on":
            return True, "model.chunked_loss=on"
        if token_loss in ("sequence", "logps"):  # preference tuning, GRPO: log-probs of tokens
            return True, "model.chunked_loss=auto: the task's loss reads log-probs over the vocabulary"
        return True, "model.chunked_loss=auto: the task's loss is a cross-entropy over the vocabulary"

    def workers_for(self, decodes_media: bool) -> tuple[int, str]:
        """(DataLoader workers, why) for a task whose rows decode images or audio, or not
        (``Task.decodes_media``: the task knows, planning does not import it)."""
        if decodes_media:
            return self.media_workers, self.media_why
        return self.loader_workers, self.loader_why


@dataclass
class Resolved(Diagnosis):
    """``resolve``'s answer: the plan and its findings (none for a plan already made), the facts
    it came from (None then too) and, with a train config, the run settings."""

    facts: Facts | None = None
    settings: RunSettings | None = None


def resolve(
    cfg: TrainConfig | None = None,
    *,
    processes: int | None = None,
    gpu_ids: list[int] | None = None,
    precision: str | None = None,
    port: int | None = None,
    platform: str | None = None,
    machines: int = 1,
    machine_rank: int = 0,
    main_address: str | None = None,
    facts: Facts | None = None,
    full_probe: bool = False,
    context: LaunchContext | None = None,
    plan: Plan | None = None,
    checkpoint_dtype: str | None = None,
) -> Resolved:
    """Decide the plan, its findings and (with ``cfg``) the run settings; see the module's steps.

    ``context``: the launch context of this process (None: a command that starts the processes
    itself, one per GPU unless ``processes`` says otherwise). ``precision`` stands in for a
    config's (bench, doctor, configure). ``plan``: a plan this process already runs (the loop);
    its settings are then for the context's world size. ``facts=None`` probes this machine.
    ``checkpoint_dtype``: the model's own dtype from its config.json where the caller found it
    (``xtrain.model.configs.checkpoint_dtype``; None: unknown), for ``model.dtype: auto``."""
    processes = _processes(processes, context)
    if context is not None and context.launched:
        machines, main_address = context.num_machines, context.main_address
        main_address = main_address if machines > 1 else None  # MASTER_ADDR of one machine: loopback
    overrides = Overrides(
        num_processes=processes,
        gpu_ids=gpu_ids,
        mixed_precision=choose_precision(cfg) if cfg is not None and precision is None else precision,
        launcher_precision=_launcher_precision(context) if cfg is not None and precision is None else None,
        port=port,
        platform=platform,
        num_machines=machines,
        machine_rank=machine_rank,
        main_address=main_address,
        weights_dtype=cfg.model.dtype if cfg is not None else None,
        checkpoint_dtype=checkpoint_dtype if cfg is not None else None,
        cpu_threads=cfg.run.cpu_threads if cfg is not None else None,
    )
    overrides.check()  # before the probe: a mistake costs no torch import
    held = plan or _sent_plan(context, processes)
    if held is not None:
        world = context.world_size if context is not None else held.world_size
        settings = run_settings(cfg, held, world) if cfg is not None else None
        return Resolved(plan=held, findings=[], settings=settings)
    if facts is None:
        facts = probe.collect(quick=not full_probe, port=port if port is not None else DEFAULT_PORT)
    diagnosis = diagnose(facts, overrides)
    world = context.world_size if context is not None and context.launched else diagnosis.plan.world_size
    settings = run_settings(cfg, diagnosis.plan, world) if cfg is not None else None
    return Resolved(plan=diagnosis.plan, findings=diagnosis.findings, facts=facts, settings=settings)


def _processes(asked: int | None, context: LaunchContext | None) -> int | None:
    """Processes on this machine before the facts are known (None: one per GPU, the rules')."""
    if context is None:
        return asked  # a command: it starts the processes itself
    if context.launched:
        if asked is not None and asked != context.world_size:
            raise XtrainError(
                f"--processes {asked} conflicts with the launcher's {context.world_size} processes",
                "leave out --processes when starting through accelerate launch or torchrun",
            )
        return context.local_world_size
    if asked is not None:
        return asked
    if context.single_launch:
        return context.visible_gpus  # one worker per GPU accelerate left visible, else the plan's
    return 1  # python -m xtrain.run without a launcher: one process unless --processes N


def _launcher_precision(context: LaunchContext | None) -> str | None:
    """What ``accelerate launch`` exported: the context's, else (a command) this environment's."""
    return context.exported_precision if context is not None else exported_precision()


def _sent_plan(context: LaunchContext | None, processes: int | None) -> Plan | None:
    """The plan xtrain's launcher sent this process, when it is for this launch."""
    sent = context.sent_plan if context is not None else None
    if sent is None or sent.world_size != context.world_size:
        return None
    return sent if context.launched or processes == sent.num_processes else None


def choose_precision(cfg: TrainConfig) -> str | None:
    """The precision the user chose in the train config (``--precision`` writes
    ``run.mixed_precision``), else None: the rules decide."""
    mp = cfg.run.mixed_precision
    return None if mp in AUTO else mp


def diagnose(facts: Facts, overrides: Overrides | None = None) -> Diagnosis:
    """Facts (+ user overrides) -> the rules' plan and the checks' findings. Pure: safe on any
    saved snapshot."""
    plan = make_plan(facts, overrides)
    findings = [f for check in CHECKS for f in check(facts, plan)]
    return Diagnosis(plan=plan, findings=findings)


def run_settings(cfg: TrainConfig, plan: Plan, world_size: int) -> RunSettings:
    """Step 3: the run's batch arithmetic, learning rate, precision and loaders for ``world_size``
    processes. Raises ``XtrainError`` (one line, with the sizes that work) when the global batch
    does not divide; the same for a ``parallel.sequence`` that does not divide the processes
    (its groups of processes share each micro-batch: they count as one in the batch arithmetic)."""
    sp = sequence_plan(cfg.parallel.sequence, world_size)
    check_length(sp.size, cfg.data.max_length)
    accumulation = gradient_accumulation(cfg, sp.data_parallel)
    global_batch = cfg.batch.per_device * sp.data_parallel * accumulation
    mp = cfg.run.mixed_precision
    asked = cfg.data.num_workers  # None: the plan's, for the kind of rows the task reads
    loaders = {
        kind: (asked, "data.num_workers")
        if asked is not None
        else (getattr(plan, kind), plan.reasons.get(kind, ""))
        for kind in ("dataloader_workers", "media_workers")
    }
    if cfg.run.compile and plan.compile_blocker:
        pip = "pip install triton-windows" if plan.os_kind == "windows" else "pip install triton"
        raise XtrainError(f"run.compile=true: {plan.compile_blocker}", f"{pip}, or set run.compile=false")
    chunked, loss_why = chunked_loss_setting(cfg)
    return RunSettings(
        world_size=world_size,
        per_device=cfg.batch.per_device,
        accumulation=accumulation,
        global_batch=global_batch,
        lr=scaled_lr(cfg, global_batch),
        precision=plan.mixed_precision if mp in AUTO else mp,
        loader_workers=loaders["dataloader_workers"][0],
        loader_why=loaders["dataloader_workers"][1],
        media_workers=loaders["media_workers"][0],
        media_why=loaders["media_workers"][1],
        pin_memory=plan.pin_memory,
        trackers=trackers(cfg),
        compile=cfg.run.compile,
        chunked_loss=chunked,
        loss_why=loss_why,
        activation_offload=offload_setting(cfg, plan),
        sequence=sp.size,
    )


def chunked_loss_setting(cfg: TrainConfig) -> tuple[str, str]:
    """``model.chunked_loss`` as the plan decides it: (auto | on | off, why when off). Its
    module hooks and per-chunk gradients are not traced by torch.compile: off under
    ``run.compile`` (``on`` refused there)."""
    asked = cfg.model.chunked_loss
    if asked == "off":
        return "off", "model.chunked_loss=off"
    if cfg.run.compile:
        if asked == "on":
            raise XtrainError(
                "model.chunked_loss=on does not run under run.compile (torch.compile does not trace it)",
                "set model.chunked_loss=auto or off, or run.compile=false",
            )
        return "off", "model.chunked_loss=auto: off under run.compile"
    return asked, ""


def offload_setting(cfg: TrainConfig, plan: Plan) -> bool:
    """``model.activation_offload``, refused in one line where it cannot work: under
    torch.compile (saved-tensor hooks are not traced) and on Apple's GPU (its memory is the host's:
    there is nowhere else to move them)."""
    if not cfg.model.activation_offload:
        return False
    if cfg.run.compile:
        raise XtrainError(
            "model.activation_offload does not run under run.compile (torch.compile does not trace "
            "saved-tensor hooks)",
            "set model.activation_offload=false or run.compile=false",
        )
    if plan.device == "mps":
        raise XtrainError(
            "model.activation_offload moves activations to host memory, and Apple's GPU already uses it",
            "set model.activation_offload=false",
        )
    return True


def trackers(cfg: TrainConfig) -> tuple[str, ...]:
    """The experiment trackers the run reports to: ``run.report_to``, whose ``auto`` is
    TensorBoard unless its shorthand ``run.tensorboard`` is off."""
    asked = cfg.run.report_to
    if isinstance(asked, str):  # auto (a checked config holds "auto" or a list)
        return ("tensorboard",) if cfg.run.tensorboard else ()
    return tuple(asked)


# ---------------------------------------------------------------------------------------------
# Step 4: the attention implementation

FLASH_PIP = "pip install flash-attn --no-build-isolation"


@dataclass(frozen=True)
class AttentionFacts:
    """What decides ``model.attn_implementation``, gathered by the caller (plain data)."""

    flash_attn: str | None  # the installed flash-attn version; None: not installed
    device: str  # cuda | mps | cpu: where the model runs
    precision: str  # the run's mixed precision: no | fp16 | bf16
    weights_dtype: str = "auto"  # model.dtype: half-precision weights run flash-attn without autocast
    model: str = "the model"  # its class, for the messages
    sdpa: bool | None = None  # the model class has an sdpa path; None: not known here
    flash: bool | None = None  # ... a flash-attention path
    capability: tuple[int, int] | None = None  # the (smallest) GPU's compute capability


@dataclass(frozen=True)
class Attention:
    """The decision: ``name`` (what the model runs), whether it is passed to ``from_pretrained``
    (``auto`` passes only flash_attention_2: otherwise transformers' own default, which is sdpa
    where the model has it, else eager), and why."""

    name: str
    passed: bool
    reason: str

    def kwargs(self) -> dict[str, str]:
        return {"attn_implementation": self.name} if self.passed else {}

    def summary(self) -> str:
        return f"{self.name} ({self.reason})"


def _flash_blocker(f: AttentionFacts) -> tuple[str, str] | None:
    """(why flash_attention_2 cannot run, the fix), or None when it can (or the model's support
    is not known: transformers checks that itself)."""
    half = f.precision in ("fp16", "bf16") or f.weights_dtype in ("bfloat16", "float16")
    sdpa = "set model.attn_implementation=sdpa"
    if f.device != "cuda":
        return f"it needs a CUDA GPU and this run is on {f.device}", sdpa
    if f.flash_attn is None:
        return "the flash-attn package is not installed", f"{FLASH_PIP}, or {sdpa}"
    if f.capability is not None and f.capability < (8, 0):
        cc = ".".join(map(str, f.capability))
        return f"it needs compute capability 8.0+ (Ampere or newer) and this GPU has {cc}", sdpa
    if not half:
        return "it runs in fp16/bf16 and this run is in fp32", f"set run.mixed_precision=bf16, or {sdpa}"
    if f.flash is False:
        return f"{f.model} has no flash-attention path in transformers", sdpa
    return None


def choose_attention(asked: str, facts: AttentionFacts) -> Attention:
    """``model.attn_implementation`` (auto | sdpa | flash_attention_2 | eager) for ``facts``.
    An explicit choice that cannot work raises one line with the fix. Pure."""
    blocker = _flash_blocker(facts)
    if asked == "eager":
        return Attention("eager", True, "model.attn_implementation=eager")
    if asked == "sdpa":
        if facts.sdpa is False:
            raise XtrainError(
                f"model.attn_implementation=sdpa: {facts.model} has no sdpa path in transformers",
                "set model.attn_implementation=eager (or auto)",
            )
        return Attention("sdpa", True, "model.attn_implementation=sdpa")
    if asked == "flash_attention_2":
        if blocker is not None:
            why, fix = blocker
            raise XtrainError(f"model.attn_implementation=flash_attention_2 cannot work: {why}", fix)
        return Attention("flash_attention_2", True, "model.attn_implementation=flash_attention_2")
    if blocker is None and facts.flash:
        why = f"flash-attn {facts.flash_attn} installed, CUDA, fp16/bf16, {facts.model} supports it"
        return Attention("flash_attention_2", True, f"auto: {why}")
    not_flash = blocker[0] if blocker is not None else f"{facts.model}'s flash-attention support is unknown"
    if facts.sdpa is None:
        return Attention(
            "sdpa or eager", False, f"auto: sdpa where the model has it; not flash_attention_2: {not_flash}"
        )
    if facts.sdpa:
        return Attention(
            "sdpa", False, f"auto: {facts.model} supports it; not flash_attention_2: {not_flash}"
        )
    return Attention("eager", False, f"auto: {facts.model} has no sdpa path")
