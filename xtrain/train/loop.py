"""The training loop: one readable function from a config and a plan to a trained adapter.

    accelerator  <- the plan (backend, cpu, precision, TF32, env)          accelerator.py
    workload     <- the task (model with LoRA, datasets, collator)         tasks.py
    data order   <- (seed, global batch): same samples for any process count  sampler.py
    for step in steps:                      # one optimizer step = global_batch samples
        for micro-batch in this rank's share:
            forward, backward (DDP syncs on the last micro-batch only)
        clip, optimizer, scheduler
        every log_every: one host sync for loss / throughput
        every eval_every / save_every: evaluate / checkpoint
    adapter (+ merged model) and train_result.json                   checkpoint.py

Randomness (dropout) is reseeded from (seed, step, micro-batch number) before every forward
pass, so it too is independent of how many processes share the step and of resumes.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from xtrain.errors import XtrainError
from xtrain.launch.stops import StopAtOnce
from xtrain.planning.plan import Plan
from xtrain.train import checkpoint, preflight
from xtrain.train import lock as run_lock
from xtrain.train.accelerator import (
    LaunchContext,
    build_accelerator,
    mixed_precision,
    release,
    wants_cpu_staged_allreduce,
)
from xtrain.train.config import TrainConfig, config_to_dict, gradient_accumulation, scaled_lr
from xtrain.train.precision import SkipDetector, frequent_overflow, upcast_trainable
from xtrain.train.report import NullReporter, Reporter, StartInfo
from xtrain.train.sampler import DataOrder, RankBatchSampler, mix_seed
from xtrain.train.workload import Workload

BuildFn = Callable[[TrainConfig, Callable[[], Any]], Workload]

# Consecutive optimizer steps with a non-finite loss (on any rank) that stop a run. A few in a
# row happen with fp16 while the scaler finds its scale (those steps are skipped, not applied);
# more is a diverged run. Checked at the logging interval's host sync, never per step.
NONFINITE_LIMIT = 3


@dataclass
class TrainResult:
    """What a training run produced (also written to ``output_dir/train_result.json``)."""

    final_step: int
    total_steps: int
    losses: list[list[float]]  # [[step, mean loss over the log window], ...]
    eval_metrics: dict[str, float]  # the final evaluation ({} without an eval set)
    eval_history: list[dict[str, float]]  # [{"step": s, "eval_loss": ...}, ...]
    outputs: dict[str, str]  # adapter / model / merged / checkpoint / result -> path
    samples_per_s: float  # over the optimizer steps of this session (eval and saves excluded)
    tokens_per_s: float
    world_size: int
    accumulation: int
    global_batch: int
    resumed_from: str | None = None
    skipped_steps: int = 0
    run_info: dict[str, Any] = field(default_factory=dict)  # how it ran: backend, device, hook, ...
    predictions: list[dict[str, str]] = field(default_factory=list)  # [{"reference", "prediction"}]


class NonFiniteLoss(XtrainError):
    """The loss stayed NaN/inf: the run stops without writing the non-finite weights."""

    def __init__(self, first_bad: int, step: int, last_good: Path | None, reason: str) -> None:
        where = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was saved"
        super().__init__(
            f"training diverged: the loss is not finite since step {first_bad} ({reason}); "
            f"stopped at step {step}, nothing written; {where}",
            "lower optim.lr, keep optim.max_grad_norm set, or use bf16 instead of fp16; "
            "run.resume=auto continues from the last good checkpoint",
            exit_code=3,
        )
        self.first_bad = first_bad
        self.step = step
        self.last_good = last_good


def out_of_memory_error(
    device: Any, per_device: int, world: int, accumulation: int, global_batch: int
) -> XtrainError:
    """Out of device memory: name the batch arithmetic and a smaller per-device batch that keeps
    the global batch (the accumulation grows instead)."""
    procs = f"{world} process{'es' if world != 1 else ''}"
    message = (
        f"out of memory on {device} with batch.per_device={per_device} "
        f"(global batch {global_batch} = {per_device} per device x {procs} x accumulation {accumulation})"
    )
    smaller = [d for d in range(per_device - 1, 0, -1) if per_device % d == 0]
    if not smaller:
        return XtrainError(
            message,
            "the per-device batch is already 1: lower data.max_length, set "
            "model.gradient_checkpointing=true, or use run.mixed_precision=bf16/fp16",
        )
    new = smaller[0] if per_device % 2 else per_device // 2
    new_acc = global_batch // (new * world)
    return XtrainError(
        message,
        f"batch.per_device={new} batch.global_batch={global_batch} keeps the global batch "
        f"{global_batch}; accumulation becomes {new_acc}",
    )


class TrainingStopped(XtrainError):
    """SIGINT/SIGTERM: the run stopped at a step boundary after saving a checkpoint."""

    def __init__(self, step: int, path: Path, signum: int) -> None:
        code = 130 if signum == signal.SIGINT else 128 + int(signum)
        super().__init__(
            f"stopped at step {step}; checkpoint saved to {path}",
            "run the same command again to resume",
            exit_code=code,
        )
        self.step = step
        self.path = path


# -- stop requests -------------------------------------------------------------------------------
class StopSignals:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary; a second SIGINT
    interrupts at once. Handlers are only installed in the main thread."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise StopAtOnce()  # a KeyboardInterrupt: the second Ctrl+C stops at once
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def _agree_to_stop(accelerator: Any, signum: int | None, group: Any) -> int | None:
    """All ranks stop together: the highest signal number any rank got (CPU all-reduce, no
    device sync)."""
    if accelerator.num_processes == 1:
        return signum
    import torch.distributed as dist

    flag = torch.tensor([signum or 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    value = int(flag.item())
    return value or None


# -- pieces of the loop ----------------------------------------------------------------------------
def _default_build(cfg: TrainConfig, main_process_first: Callable[[], Any]) -> Workload:
    from xtrain.train.tasks import build_workload

    return build_workload(cfg, main_process_first)


def _build_workload(accelerator: Any, cfg: TrainConfig, build: BuildFn) -> Workload:
    """The main process builds first (it fills the datasets cache), the others follow. When the
    main process fails, the others raise the same error instead of waiting forever."""
    if accelerator.num_processes == 1:
        return build(cfg, contextlib.nullcontext)
    from accelerate.utils import broadcast_object_list

    workload: Workload | None = None
    failure: list[Any] = [None]
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            workload = build(cfg, contextlib.nullcontext)
        except XtrainError as e:
            error, failure[0] = e, (e.message, e.hint, e.exit_code)
        except Exception as e:
            error, failure[0] = e, ("the main process failed to build the workload", None, 1)
    broadcast_object_list(failure, from_process=0)
    if error is not None:
        raise error
    if failure[0] is not None:
        message, hint, code = failure[0]
        raise XtrainError(message, hint, exit_code=code)
    if workload is None:
        workload = build(cfg, contextlib.nullcontext)
    return workload


def _optimizer(
    model: torch.nn.Module, cfg: TrainConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only; no weight decay on biases and norms."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise XtrainError(
            "the model has no trainable parameters", "check lora.target_modules or lora.enabled"
        )
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, fused=fused or None
    )


def _scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    from transformers import get_scheduler

    warmup = cfg.optim.warmup_steps or int(round(cfg.optim.warmup_ratio * total_steps))
    name = {"constant": "constant_with_warmup"}.get(cfg.optim.schedule, cfg.optim.schedule)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)


def _reseed(value: int, device: torch.device) -> None:
    """Seed the generators dropout draws from on this device. (``torch.manual_seed`` would also
    queue a lazy seeding of every CUDA device with a stack trace each time: 1 ms per call.)"""
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed(value)  # the current device: initialised, so no lazy queue
    elif device.type == "mps":
        torch.mps.manual_seed(value)


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v for k, v in batch.items()}


def _default_eval_batch(outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
    """Without a task-specific eval: the batch's mean loss, weighted by its examples."""
    n = next(v for v in batch.values() if torch.is_tensor(v)).shape[0]
    loss = outputs.loss.detach().float()
    return {"loss_sum": loss.expand(n), "count": torch.ones(n, device=loss.device)}


def evaluate(
    accelerator: Any, model: Any, loader: Any, workload: Workload, samples: list[Any] | None = None
) -> dict[str, float]:
    """Eval loss (and the task's metrics) over the whole eval set, gathered from all ranks.
    A task that evaluates by generation (``workload.evaluate``) runs that instead; its sample
    predictions are appended to ``samples``."""
    if workload.evaluate is not None:
        metrics, predictions = workload.evaluate(accelerator, model, loader)
        if samples is not None:
            samples.extend(predictions)
        return metrics
    eval_batch = workload.eval_batch or _default_eval_batch
    parts: dict[str, list[torch.Tensor]] = {}
    model.eval()
    with torch.no_grad():
        for batch in loader:
            stats = eval_batch(model(**batch), batch)
            stats = accelerator.gather_for_metrics({k: v.detach() for k, v in stats.items()})
            for k, v in stats.items():
                parts.setdefault(k, []).append(v)
    model.train()
    if not parts:
        return {}
    gathered = {k: torch.cat([t.reshape(-1) for t in v]).float().cpu() for k, v in parts.items()}
    metrics = {"eval_loss": float(gathered["loss_sum"].sum() / gathered["count"].sum().clamp(min=1))}
    if workload.reduce_metrics is not None:
        metrics.update({k: float(v) for k, v in workload.reduce_metrics(gathered).items()})
    return metrics


def _flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """The config as flat scalars (TensorBoard's hparams accept nothing else)."""
    flat: dict[str, Any] = {}
    for section, values in asdict(cfg).items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


@dataclass
class _Window:
    """Logging window: device-side sums, synced to the host only when the window closes."""

    loss: torch.Tensor
    tokens: torch.Tensor
    steps: int = 0
    started: float = 0.0

    def reset(self) -> None:
        self.loss.zero_()
        self.tokens.zero_()
        self.steps = 0
        self.started = time.perf_counter()


# -- the loop ----------------------------------------------------------------------------------------
def train(
    cfg: TrainConfig,
    plan: Plan,
    reporter: Reporter | None = None,
    *,
    build: BuildFn | None = None,
) -> TrainResult:
    """Train as the config says, in this process, as one rank of the launch context.

    ``build`` replaces ``xtrain.train.tasks.build_workload`` (tests, benchmarks). The main
    process holds the output folder's run lock (``xtrain.train.lock``) from before anything is read
    until the run ends: a second run on the same folder stops at once, touching nothing."""
    checkpoint.check_output_dir(cfg.run.output_dir)
    preflight.check_paths(cfg)  # output folder and caches writable: before anything starts
    if LaunchContext.from_env().rank != 0:
        return _train_unlocked(cfg, plan, reporter, build=build)
    with run_lock.acquire(cfg.run.output_dir):
        return _train_unlocked(cfg, plan, reporter, build=build)


def _train_unlocked(
    cfg: TrainConfig,
    plan: Plan,
    reporter: Reporter | None = None,
    *,
    build: BuildFn | None = None,
) -> TrainResult:
    ctx = LaunchContext.from_env()
    accumulation = gradient_accumulation(cfg, ctx.world_size)
    global_batch = cfg.batch.per_device * ctx.world_size * accumulation
    config_dict = config_to_dict(cfg)
    # Everything a user can get wrong about resuming is checked before anything starts.
    checkpoint.check_output_dir(cfg.run.output_dir)
    resume_from, damaged = checkpoint.find_resume_checked(cfg.run.output_dir, cfg.run.resume)
    for note in damaged if (reporter is not None and ctx.rank == 0) else []:
        reporter.note(note)  # a damaged newest checkpoint was skipped for the previous good one
    resume_state = checkpoint.read_state(resume_from, config_dict) if resume_from else None

    accelerator = build_accelerator(cfg, plan, ctx, accumulation)
    try:
        return _train(
            cfg,
            plan,
            accelerator,
            reporter,
            build or _default_build,
            accumulation,
            global_batch,
            config_dict,
            resume_from,
            resume_state,
        )
    except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is the same class
        raise out_of_memory_error(
            accelerator.device, cfg.batch.per_device, ctx.world_size, accumulation, global_batch
        ) from None
    finally:
        release(accelerator)


def _train(
    cfg: TrainConfig,
    plan: Plan,
    accelerator: Any,
    reporter: Reporter | None,
    build: BuildFn,
    accumulation: int,
    global_batch: int,
    config_dict: dict[str, Any],
    resume_from: Path | None,
    resume_state: checkpoint.TrainState | None,
) -> TrainResult:
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    rep: Reporter = reporter if (reporter is not None and accelerator.is_main_process) else NullReporter()
    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    out = Path(cfg.run.output_dir)
    seed = cfg.run.seed

    # -- what to train ----------------------------------------------------------------------------
    set_seed(seed)  # identical LoRA initialisation on every rank
    workload = _build_workload(accelerator, cfg, build)
    order = DataOrder(len(workload.train_dataset), global_batch, cfg.batch.per_device, world, seed)
    total_steps = cfg.run.max_steps or max(1, math.ceil(cfg.run.epochs * order.steps_per_epoch))

    model = workload.model
    upcast_trainable(model, mixed_precision(cfg, plan))  # fp32 master weights under autocast
    optimizer = _optimizer(model, cfg, scaled_lr(cfg, global_batch), device)
    scheduler = _scheduler(cfg, optimizer, total_steps)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total_params = sum(p.numel() for p in model.parameters())
    saves = total_steps // cfg.run.save_every + 1 if cfg.run.save_every else 1
    for note in preflight.check_disk(
        out, trainable, total_params, cfg.run.keep_checkpoints, cfg.run.save_merged, saves
    ):
        rep.note(note)  # (a run that cannot fit stops here, before the first step)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    checkpoint.install_model_hooks(accelerator)
    cpu_staged = False
    if world > 1 and wants_cpu_staged_allreduce(plan):
        from xtrain.train import comm_hook

        cpu_staged = comm_hook.register(model)
    stop_group = None
    if world > 1 and plan.backend not in (None, "gloo"):
        import torch.distributed as dist

        stop_group = dist.new_group(backend="gloo")  # stop flags travel on the CPU

    pin = bool(plan.pin_memory and device.type == "cuda")
    # data.num_workers overrides the plan's choice (image decoding wants workers even where text needs none)
    workers = plan.dataloader_workers if cfg.data.num_workers is None else cfg.data.num_workers
    eval_loader = None
    if workload.eval_dataset is not None and len(workload.eval_dataset) > 0:
        eval_loader = accelerator.prepare(
            DataLoader(
                workload.eval_dataset,
                batch_size=cfg.batch.per_device * world,  # split_batches: per_device on each rank
                collate_fn=workload.collator,
                num_workers=workers,
                pin_memory=pin,
            )
        )

    # -- where to start ------------------------------------------------------------------------------
    start_step, losses, eval_history, skipped = 0, [], [], 0
    if resume_from is not None and resume_state is not None:
        if accelerator.is_main_process:
            checkpoint.remove_partial(out)
        checkpoint.load(accelerator, resume_from)
        start_step = resume_state.step
        losses, eval_history = list(resume_state.losses), list(resume_state.eval_history)
        skipped = resume_state.skipped_steps
        for note in checkpoint.changes(
            resume_state, config_dict, global_batch, order.num_samples, total_steps
        ):
            rep.note(note)
    elif accelerator.is_main_process:
        checkpoint.remove_partial(out)
    start_step = min(start_step, total_steps)

    loader = DataLoader(
        workload.train_dataset,
        batch_sampler=RankBatchSampler(order, rank, start_step, total_steps),
        collate_fn=workload.collator,
        num_workers=workers,
        pin_memory=pin,
    )

    if cfg.run.tensorboard and accelerator.log_with:
        accelerator.init_trackers("xtrain", config=_flat_config(cfg))
    rep.start(
        StartInfo(
            processes=world,
            device=str(device),
            backend=accelerator.state.backend if world > 1 else None,
            precision=mixed_precision(cfg, plan),
            per_device=cfg.batch.per_device,
            accumulation=accumulation,
            global_batch=global_batch,
            total_steps=total_steps,
            start_step=start_step,
            trainable_params=trainable,
            total_params=total_params,
            output_dir=str(out),
            resumed_from=str(resume_from) if resume_from else None,
            cpu_staged_allreduce=cpu_staged,
        )
    )

    def state_at(step: int) -> checkpoint.TrainState:
        epoch, in_epoch = order.position(step)
        return checkpoint.TrainState(
            step=step, epoch=epoch, step_in_epoch=in_epoch, samples_seen=step * global_batch, seed=seed,
            global_batch=global_batch, per_device=cfg.batch.per_device, world_size=world,
            accumulation=accumulation, num_samples=order.num_samples, total_steps=total_steps,
            config=config_dict, losses=losses, eval_history=eval_history, skipped_steps=skipped,
        )  # fmt: skip

    def last_good() -> Path | None:
        found = checkpoint.list_checkpoints(out)
        return found[-1][1] if found else None

    def check_finite(step: int) -> None:
        """Before anything is saved: no NaN/inf weights ever reach a checkpoint or the adapter
        (one host sync per save; all ranks hold the same weights, so all agree)."""
        finite = torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()
        if not bool(finite):
            bad_since = step - int(streak) + 1 if int(streak) else step
            raise NonFiniteLoss(bad_since, step, last_good(), "the weights are NaN/inf")

    def save(step: int) -> Path:
        check_finite(step)
        path = checkpoint.save(accelerator, out, state_at(step), cfg.run.keep_checkpoints)
        rep.checkpoint_saved(step, str(path))
        return path

    def run_eval(step: int) -> dict[str, float]:
        samples: list[Any] = []
        metrics = (
            evaluate(accelerator, model, eval_loader, workload, samples) if eval_loader is not None else {}
        )
        if metrics:
            eval_history.append({"step": step, **metrics})
            accelerator.log(metrics, step=step)
            rep.evaluated(step, metrics)
        if samples:  # generative tasks: reference vs prediction, shown and logged as text
            from xtrain.train.generation import predictions_markdown

            predictions[:] = [asdict(s) for s in samples]
            rep.predictions(step, predictions)
            accelerator.log({"eval/predictions": predictions_markdown(samples)}, step=step)
        best = cfg.run.best_metric
        if best and best in metrics and checkpoint.is_new_best(best, metrics[best], eval_history[:-1]):
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                unwrapped = accelerator.unwrap_model(model)
                checkpoint.save_best(unwrapped, workload.tokenizer, out, step, best, metrics[best])
            accelerator.wait_for_everyone()
            rep.note(f"best {best} so far ({metrics[best]:.4f} at step {step}) -> {out / checkpoint.BEST}")
        return metrics

    # -- the loop ---------------------------------------------------------------------------------------
    params = [p for p in model.parameters() if p.requires_grad]
    skips = SkipDetector(accelerator.scaler)  # fp16: was a step skipped? (read one step late)

    def settle() -> None:
        nonlocal skipped
        if skips.pending:
            if skips.settle():
                skipped += 1  # overflow: no update, and the lr schedule does not advance
            else:
                scheduler.step()

    max_norm = cfg.optim.max_grad_norm
    tokens_key = workload.tokens_key
    window = _Window(torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.long))
    window.reset()
    # consecutive steps whose loss was NaN/inf on this rank: device-side, read at the window sync
    streak = torch.zeros((), device=device, dtype=torch.long)
    step_bad = torch.zeros((), device=device, dtype=torch.bool)
    trained_s, trained_samples, trained_tokens = 0.0, 0, 0
    log_every = max(1, cfg.run.log_every)
    last_saved = start_step if resume_from is not None else -1
    final_metrics: dict[str, float] = {}
    predictions: list[dict[str, str]] = []  # the last eval's sample predictions (generative tasks)
    batches: Iterator[Any] = iter(loader)
    if cfg.run.eval_at_start and start_step == 0:
        run_eval(0)  # the "before" of a before/after comparison (xtrain quickstart's table)
    model.train()

    with StopSignals() as signals:
        for step in range(start_step, total_steps):
            accelerator.step = 0  # align accelerate's micro-step counter: sync on the last micro-batch
            step_bad.zero_()
            for a in range(accumulation):
                batch = _to_device(next(batches), device, pin)
                _reseed(mix_seed(seed, step, order.micro_index(rank, a)), device)
                with accelerator.accumulate(model):  # DDP syncs on the last micro-batch only
                    loss = model(**batch).loss
                    accelerator.backward(loss)  # divides by the accumulation
                if accelerator.sync_gradients:
                    if max_norm:
                        accelerator.clip_grad_norm_(params, max_norm)
                    settle()  # the previous step's skip check + lr step (fp16; see precision.py)
                    skips.before_step()
                    optimizer.step()  # accelerate's wrapper: scaler.step + scaler.update (fp16)
                    if skips.scaler is None:
                        # no loss scale to read: the optimizer's own word (its wrapper holds the
                        # schedule back on a skip)
                        skipped += int(optimizer.step_was_skipped)
                        scheduler.step()
                    else:
                        skips.record()  # settled before the next update, or at the next sync
                    optimizer.zero_grad(set_to_none=True)
                window.loss += loss.detach().float()
                step_bad |= ~torch.isfinite(loss.detach())
                if tokens_key and tokens_key in batch:
                    window.tokens += batch[tokens_key].sum()
            window.steps += 1
            streak.add_(1).mul_(step_bad)  # +1, or back to 0 after a finite step
            done = step + 1

            stop = _agree_to_stop(accelerator, signals.signum, stop_group)
            eval_due = bool(cfg.run.eval_every) and done % cfg.run.eval_every == 0 and done < total_steps
            save_due = bool(cfg.run.save_every) and done % cfg.run.save_every == 0 and done < total_steps
            if done % log_every == 0 or done == total_steps or eval_due or save_due or stop:
                settle()  # lr, skipped count and scheduler state complete before log/save
                # the one host sync of the window: [loss, tokens, non-finite streak] of every rank
                stats = accelerator.gather(
                    torch.stack([window.loss, window.tokens.to(window.loss.dtype), streak.float()])
                ).reshape(-1, 3)
                sums = stats[:, :2].sum(0)
                worst = int(stats[:, 2].max())
                if worst >= NONFINITE_LIMIT:
                    raise NonFiniteLoss(done - worst + 1, done, last_good(), f"{worst} steps in a row")
                elapsed = time.perf_counter() - window.started
                loss_value = float(sums[0]) / (window.steps * accumulation * world)
                tokens = int(sums[1])
                samples = window.steps * global_batch
                trained_s, trained_samples, trained_tokens = (
                    trained_s + elapsed,
                    trained_samples + samples,
                    trained_tokens + tokens,
                )
                metrics = {
                    "loss": loss_value,
                    "lr": float(scheduler.get_last_lr()[0]),
                    "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
                    "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
                }
                if device.type == "cuda":
                    peaks = accelerator.gather(
                        torch.tensor([torch.cuda.max_memory_allocated(device)], device=device)
                    )
                    metrics.update(
                        {f"peak_mem_mib/rank{i}": float(v) / 2**20 for i, v in enumerate(peaks.tolist())}
                    )
                losses.append([done, loss_value])
                accelerator.log(metrics, step=done)
                rep.progress(done, total_steps, metrics)
                if eval_due:
                    final_metrics = run_eval(done)
                if save_due:
                    save(done)
                    last_saved = done
                if stop:
                    path = (
                        save(done) if last_saved != done else checkpoint.checkpoints_dir(out) / f"step-{done}"
                    )
                    rep.note(f"stopped at step {done} on signal {stop}; resume with the same command")
                    raise TrainingStopped(done, path, stop)
                window.reset()
            else:
                rep.progress(done, total_steps)

    # -- the end ----------------------------------------------------------------------------------------
    if frequent_overflow(skipped, total_steps):
        rep.note(
            f"{skipped} of {total_steps} optimizer steps were skipped for fp16 overflow (their update "
            "dropped); bf16 has fp32's range and needs no loss scaling: --precision bf16"
        )
    if not eval_history or eval_history[-1]["step"] != total_steps:
        final_metrics = run_eval(total_steps)
    else:
        final_metrics = {k: v for k, v in eval_history[-1].items() if k != "step"}
    outputs: dict[str, str] = {}
    if (out / checkpoint.BEST).is_dir() and cfg.run.best_metric:
        outputs["best"] = str(out / checkpoint.BEST)
    if last_saved != total_steps:
        outputs["checkpoint"] = str(save(total_steps))
    else:
        outputs["checkpoint"] = str(checkpoint.checkpoints_dir(out) / f"step-{total_steps}")
    result = TrainResult(
        final_step=total_steps,
        total_steps=total_steps,
        losses=losses,
        eval_metrics=final_metrics,
        eval_history=eval_history,
        outputs=outputs,
        samples_per_s=trained_samples / trained_s if trained_s > 0 else 0.0,
        tokens_per_s=trained_tokens / trained_s if trained_s > 0 else 0.0,
        world_size=world,
        accumulation=accumulation,
        global_batch=global_batch,
        resumed_from=str(resume_from) if resume_from else None,
        skipped_steps=skipped,
        predictions=predictions,
        run_info={
            "device": str(device),
            "backend": accelerator.state.backend if world > 1 else None,
            "distributed_type": str(accelerator.distributed_type),
            "precision": mixed_precision(cfg, plan),
            "plan_os": plan.os_kind,
            "cpu_staged_allreduce": cpu_staged,
            "use_libuv": os.environ.get("USE_LIBUV"),
            # this rank's peak of allocated device memory (the main process writes the result)
            "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20
            if device.type == "cuda"
            else None,
            "skip_check": "loss scale" if skips.scaler is not None else None,
        },
    )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        outputs.update(checkpoint.save_final(unwrapped, workload.tokenizer, out, cfg.run.save_merged))
        # a re-run of a finished run trains nothing: its train_result.json (throughput, ...) stays
        outputs["result"] = str(checkpoint.write_result(out, asdict(result), keep=start_step >= total_steps))
    accelerator.wait_for_everyone()
    rep.end(result)
    return result
