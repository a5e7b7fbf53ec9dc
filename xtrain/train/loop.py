# longer: the Recipe is one run read top to bottom (setup, the step, fit, evaluate/save, the end)
# in one file, as a practitioner's recipe is. What it calls lives by concern: the builders in
# parts.py, the history (RunState, Due) in state.py, evaluation and the best model in
# evaluation.py, the log window in window.py, the result in result.py, checkpoints in checkpoint/.
"""The training loop as a recipe, read top to bottom: setup, train step, optimizer step, fit,
evaluate, save, finish.

    settings     <- config + plan + world size, resolved once (the Run)   planning/run.py
    accelerator  <- the Run (backend, device, precision, TF32, env)        distributed/accelerator.py
    setup        one named builder per part (parts.py): workload (the task's model with LoRA,
                 datasets, collator), data order, optimizer, scheduler, prepare, loaders, resume
    for step in steps:                      # one optimizer step = global_batch samples
        this rank's micro-batches read ahead: the step's trained tokens counted  step_loss.py
        for micro-batch in this rank's share:
            forward, backward of its share of the step's loss  # no_sync on all but the last
        optimizer_step: clip, update, schedule (an fp16 overflow drops the update and the lr step)
        what is due (state.Due): every log_every one host sync (loss, throughput)   window.py
            every eval_every / save_every: evaluate / checkpoint     evaluation.py, checkpoint/
            no improvement in early_stopping_patience evals: stop    early_stopping.py
            a signal on any rank: checkpoint, stop
    finish: adapter (+ merged model) and train_result.json          checkpoint/

Randomness (dropout) is reseeded from (seed, step, micro-batch number) before every forward
pass, so it too is independent of how many processes share the step and of resumes. The run's
history (losses, evaluations, dropped updates) is one ``RunState`` (state.py): what a checkpoint
saves beside accelerate's state and what a resume restores.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from xtrain import tasks
from xtrain.config.loading import config_to_dict
from xtrain.config.schema import TrainConfig
from xtrain.data import encoded
from xtrain.data.collate import batch_tokens
from xtrain.data.sampler import DataOrder, mix_seed
from xtrain.model.lora_layers import adapted_modules, adapted_record, described
from xtrain.model.memory import MemoryLevers
from xtrain.model.size import total_weights
from xtrain.model.start import stage_record, start_of
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Plan
from xtrain.planning.run import Run, for_process
from xtrain.runtime import lifetime, lock, quiet, run_control
from xtrain.runtime.signals import StepSignals
from xtrain.tasks.generation import predictions_markdown
from xtrain.tasks.sizes import check_live_model
from xtrain.train import benchmarks, builtin_stages, checkpoint, failures, levers, parts, preflight, tracking
from xtrain.train.curves import History
from xtrain.train.distributed import sequence, sharded
from xtrain.train.distributed.accelerator import build_accelerator, release, stage_allreduce_on_cpu
from xtrain.train.distributed.collective import (
    BuildFn,
    agree_to_stop,
    build_workload_main_first,
    main_decides,
    stop_group,
)
from xtrain.train.early_stopping import EarlyStop, check_early_stopping, early_stop_at
from xtrain.train.evaluation import evaluate, keep_best
from xtrain.train.failures import NonFiniteLoss, TrainingStopped, out_of_memory_error
from xtrain.train.optim import build_optimizer, build_scheduler
from xtrain.train.precision import SkipDetector, frequent_overflow
from xtrain.train.report import NullReporter, Reporter, StartInfo
from xtrain.train.result import TrainResult, run_info, run_record, session_result
from xtrain.train.run_files import RunFiles, title_of
from xtrain.train.state import Due, RunState
from xtrain.train.step_loss import StepLoss
from xtrain.train.window import LogWindow, peak_memory

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from torch.distributed import ProcessGroup
    from torch.nn import Module

    from xtrain.model.memory import MemoryCheck
    from xtrain.tasks.contract import Batch, MainProcessFirst, Prediction, Workload

__all__ = ["NonFiniteLoss", "Recipe", "TrainResult", "TrainingStopped", "train"]


def train(
    cfg: TrainConfig,
    plan: Plan,
    reporter: Reporter | None = None,
    *,
    build: BuildFn | None = None,
) -> TrainResult:
    """Train as the config says, in this process, as one rank of the launch context: this
    process's ``Run`` built here (``planning.run.for_process`` with ``plan``), then ``train_run``.
    The library's entry (tests, benchmarks, notebooks): the preflight checks run here (their
    refusals raise; ``python -m xtrain.run`` builds its Run, runs them and prints their warnings,
    then calls ``train_run``)."""
    builtin_stages.ensure_config(cfg, train_run)  # a trained built-in (the model, a teacher): trained first
    run = for_process(cfg, LaunchContext.from_env(), plan=plan)
    preflight.run_checks(run)
    return train_run(run, reporter, build=build)


def train_run(run: Run, reporter: Reporter | None = None, *, build: BuildFn | None = None) -> TrainResult:
    """Train ``run`` in this process, its preflight checks passed (``preflight.run_checks``).

    ``build`` replaces ``xtrain.tasks.build_workload`` (tests, benchmarks). The main
    process holds the output folder's run lock (``xtrain.runtime.lock``) from before anything is
    read until the run ends: a second run on the same folder stops at once, touching nothing."""
    with lock.acquire(run.cfg.run.output_dir) if run.is_main else contextlib.nullcontext():
        recipe = Recipe(run, reporter, build)
        if run.context.distributed:  # its process group is never freed before the rank ends
            lifetime.keep_until_exit(recipe)
        return recipe.train()


def _default_build(run: Run, main_process_first: MainProcessFirst) -> Workload:
    from xtrain.tasks import build_workload

    return build_workload(run, main_process_first)


def _reseed(value: int, device: torch.device) -> None:
    """Seed the generators dropout draws from on this device. (``torch.manual_seed`` would also
    queue a lazy seeding of every CUDA device with a stack trace each time: 1 ms per call.)"""
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed(value)  # the current device: initialised, so no lazy queue
    elif device.type == "mps":
        torch.mps.manual_seed(value)


def _to_device(batch: Batch, device: torch.device, non_blocking: bool) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v for k, v in batch.items()}


class Recipe:
    """One training run of this rank, read top to bottom: ``setup()`` builds its parts, one
    named builder each; ``fit()`` runs ``train_step()`` per optimizer step, then what is due (log,
    eval, save, stop); ``finish()`` writes the outputs. ``state`` is the history a checkpoint
    saves. Nothing here prints (``Reporter`` does)."""

    accelerator: Accelerator  # built by train(), released at its end
    # built by setup(), in this order
    rep: Reporter
    workload: Workload
    order: DataOrder
    total_steps: int
    trainable: int  # trainable weights
    adapted: list[str]  # the layers that carry LoRA adapters (qualified names; [] for a full fine-tune)
    total_params: int  # every weight (a 4-bit one unpacked)
    model: Module  # prepared by accelerate (DDP, FSDP or DeepSpeed wrapped)
    optimizer: AcceleratedOptimizer
    scheduler: AcceleratedScheduler
    memory: MemoryCheck | None  # CUDA: the estimate for this card
    cpu_staged: bool  # DDP's all-reduce staged through the CPU (gloo on GPUs)
    stop_group: ProcessGroup | None  # the CPU group ranks agree to stop in (None: one process)
    step_loss: StepLoss  # what a step's loss is: its token sums over its trained tokens, its means
    pin: bool
    workers: tuple[int, str]  # DataLoader workers per process, and why
    eval_loader: DataLoader | None
    start_step: int
    loader: DataLoader[Any]
    params: list[torch.nn.Parameter]  # the trainable parameters (gradient clipping)
    skips: SkipDetector
    window: LogWindow
    levers: levers.Levers  # the chunked loss and activation offloading attached to the model
    sequence: sequence.SequenceRun | None  # parallel.sequence: this process's shard and attention
    data_rank: int  # the rows this process reads: its rank, or its sequence-parallel group's
    files: RunFiles | None  # the main process's curves picture, eval samples, data check (run_files.py)

    def __init__(self, run: Run, reporter: Reporter | None = None, build: BuildFn | None = None) -> None:
        cfg = run.cfg
        self.run, self.cfg, self.settings = run, cfg, run.settings
        self.build, self.reporter = build or _default_build, reporter
        self.config_dict = config_to_dict(cfg)
        self.out = Path(cfg.run.output_dir)
        # everything a user can get wrong about resuming, checked before anything starts
        self.resume = checkpoint.resume_point(self.out, cfg.run.resume, self.config_dict)
        for note in self.resume.damaged if (reporter is not None and run.context.rank == 0) else []:
            reporter.note(note)  # a damaged newest checkpoint was skipped for the previous good one
        self.state = RunState()  # the history: restored by setup() on resume, saved by save()
        self.early: EarlyStop | None = None  # run.early_stopping_patience ended the run here
        self.predictions: list[dict[str, str]] = []  # the last eval's samples (generative tasks)
        self.windows: list[dict[str, float]] = []  # this session's closed windows (TrainResult)
        self.started = time.time()  # a stop request older than this run is not its (run_control)
        self.stop_file = False  # the stop came from a stop request

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    # -- the whole run --------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """The whole run: ``setup``, ``fit``, ``finish``, the Accelerator released after."""
        s = self.settings
        if self.resume.finished is not None:  # nothing to train, nothing written: before any part is built
            return self._already_finished(self.resume.finished)
        self.accelerator = build_accelerator(self.run)
        try:
            with quiet.wrong_results_raise():  # a library warning that means wrong numbers stops the run
                self.setup()
                self.fit()
                return self.finish()
        except Warning as e:  # one of those; anything else raised as a warning goes on up as it is
            problem = quiet.wrong_result(e)
            if problem is None:
                raise
            raise problem from None
        except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is the same class
            raise out_of_memory_error(
                self.accelerator.device, s.per_device, s.world_size, s.accumulation, s.global_batch
            ) from None
        finally:
            release(self.accelerator)

    def _already_finished(self, saved: dict[str, Any]) -> TrainResult:
        """The run in this folder ended at its last checkpoint with this config's length: said in
        one note, every file left as it is; its ``train_result.json`` is the result."""
        if self.reporter is not None and self.run.context.rank == 0:
            self.reporter.note(
                f"{self.out} already finished, nothing trained (step {saved['final_step']}, every file as "
                "it was): a larger run.max_steps or run.epochs trains on, a new run.output_dir starts over"
            )
        return TrainResult.from_dict(saved)

    # -- setup: one named builder per part, in the order they need each other -------------------------
    def setup(self) -> None:
        """The run's parts, one line each, in the order they need each other (the checks that
        need the Accelerator or the built model among them)."""
        from accelerate.utils import set_seed

        cfg, acc = self.cfg, self.accelerator
        self.rep = self.reporter if (self.reporter is not None and acc.is_main_process) else NullReporter()
        set_seed(cfg.run.seed)  # identical LoRA initialisation on every rank
        sharded.check_outputs(acc, cfg.run.save_merged, cfg.lora.enabled, cfg.lora.init_weights)
        sharded.check_quantization(acc, cfg.model.quantization)  # (both before anything is built)
        self.workload = self._build_workload()
        self.order = parts.data_order(self.workload, self.settings, cfg, self.settings.data_parallel)
        self.total_steps = cfg.run.max_steps or max(1, math.ceil(cfg.run.epochs * self.order.steps_per_epoch))
        model = parts.trainable_model(self.workload, self.run.precision)
        # the chunked loss and activation offloading: hooks in the model's training forward
        own = self.workload.use_chunked_loss
        self.levers = levers.attach(model, cfg, self.settings, acc.distributed_type, own)
        # parallel.sequence: the groups, the attention around the model's own, this rank's shard
        backend = acc.state.backend if self.world > 1 else None
        plan = self.settings.sequence_plan
        self.sequence = sequence.attach(
            model, cfg, plan, acc.process_index, backend, self.device, acc.distributed_type
        )
        self.data_rank = plan.group_of(acc.process_index)
        if self.workload.shared_pass is not None:  # every process's share (a precomputed reference),
            self.workload.shared_pass(acc)  # after the build and the levers, before prepare
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.adapted = adapted_modules(model) if cfg.lora.enabled else []  # the layers LoRA adapts
        self.total_params = total_weights(model)  # a 4-bit weight unpacked, not its packed bytes
        optimizer = build_optimizer(model, cfg, self.settings.lr, self.device)
        scheduler = build_scheduler(cfg, optimizer, self.total_steps)
        for note in parts.disk_notes(self.out, cfg.run, self.total_steps, self.trainable, self.total_params):
            self.rep.note(note)  # (outputs that cannot fit stop the run here, before the first step)
        self.model, self.optimizer, self.scheduler = parts.prepare(
            acc, model, optimizer, scheduler, self.settings.per_device, cfg.optim.max_grad_norm
        )
        self.memory = self._check_memory(model)
        self.cpu_staged = stage_allreduce_on_cpu(self.model, self.run.plan, self.world)
        self.stop_group = stop_group(self.world, self.run.plan.backend)
        self.step_loss = StepLoss.of(
            tasks.get(cfg.model.task).token_loss, self.workload.trained_tokens,
            self.settings.accumulation, self.world, self.stop_group,
        )  # fmt: skip
        self.pin = self.settings.pin_memory and self.device.type == "cuda"
        self.workers = self.settings.workers_for(tasks.get(cfg.model.task).decodes_media)  # (count, why)
        loading = parts.loading(self.workload, self.workers[0], self.pin)
        self.eval_loader = parts.eval_loader(acc, self.workload, self.settings.per_device, loading)
        whole = self.workload.cuts_sequences  # (its step completes the rows and cuts them: GRPO's)
        loading = {**loading, "collate_fn": sequence.collator(loading["collate_fn"], self.sequence, whole)}
        self.start_step = self._resume()  # after prepare: accelerate loads into the prepared parts
        self.loader = parts.train_loader(
            self.workload, self.order, self.data_rank, self.start_step, self.total_steps, loading
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.skips = SkipDetector(acc.scaler)  # fp16: was a step skipped? (read one step late)
        self.window = LogWindow(self.device, self.workload.window_metrics)  # the task reduces its statistics
        check_early_stopping(cfg.run, has_eval_set=self.eval_loader is not None)
        parts.start_trackers(acc, cfg, self.settings, self.device, self.out)
        self.rep.start(self._start_info())
        self.files = self._run_files()

    def _run_files(self) -> RunFiles | None:
        """The files a person looks at (main process): the data check saved now, the eval samples
        of a resumed run's later evaluations dropped; their warnings noted."""
        if not self.accelerator.is_main_process:
            return None
        task, model = self.cfg.model.task, self.cfg.model.name_or_path
        files = RunFiles(self.out, tasks.get(task).curves, title_of(self.out, task, model))
        for note in files.started(self.workload.data_report, self.start_step, History.of(self.state)):
            self.rep.note(note)
        return files

    def _look(self, step: int, samples: list[dict[str, Any]]) -> None:
        """At an evaluation: its samples kept and the curves redrawn (main process; a failure is a
        warning line, the run goes on)."""
        if self.files is not None:
            for note in self.files.evaluated(step, samples, History.of(self.state)):
                self.rep.note(note)

    def _build_workload(self) -> Workload:
        """The task's model, datasets and collator (``Task.build``), the main process first."""
        # ZeRO-3: no zero.Init collective in a main-first build; a first run's encoding shows its progress
        reporting = encoded.reporting(self.rep.encoding, self.rep.note)  # (a damaged cache entry: a note)
        with sharded.whole_model_loading(self.accelerator), reporting:
            return build_workload_main_first(self.accelerator, self.run, self.build)

    def _check_memory(self, model: Module) -> MemoryCheck | None:
        """CUDA: the memory estimate with the real counts against this card; the main process
        notes it when it does not fit (the run goes on: the estimate is rough)."""
        if self.device.type != "cuda":
            return None
        props = torch.cuda.get_device_properties(self.device)
        running = MemoryLevers(
            chunked=self.levers.chunked_loss,
            offload=self.levers.activation_offload,
            sequence=self.settings.sequence,
        )
        check = check_live_model(
            model, self.cfg, self.settings.precision, props.total_memory, props.name, running
        )
        if check is not None and check.warning:
            self.rep.note(check.warning)
        return check

    def _resume(self) -> int:
        """The step to start at: 0 for a new run; on resume the checkpoint's weights, optimizer,
        scheduler and RNG loaded (accelerate), its history into ``state``, what changed noted,
        and its evaluations asked again whether they ended the run."""
        acc, saved = self.accelerator, self.resume.saved
        if acc.is_main_process:
            checkpoint.remove_partial(self.out)
        if self.resume.path is None or saved is None:
            return 0
        checkpoint.load(acc, self.resume.path)
        self.state = RunState.resumed(saved)
        batch, samples = self.settings.global_batch, self.order.num_samples
        for note in checkpoint.changes(saved, self.config_dict, batch, samples, self.total_steps):
            self.rep.note(note)
        # the same history decides the same: a run that stopped early does not train on
        self.early = self._early_stop(saved.step)
        if self.early is not None:
            self.rep.note(
                f"this run already {self.early.reason}; nothing to train (a larger "
                "run.early_stopping_patience trains on, a new run.output_dir starts over)"
            )
        return min(saved.step, self.total_steps)

    def _start_info(self) -> StartInfo:
        return StartInfo.of(
            self.settings, processes=self.world, device=str(self.device),
            backend=self.accelerator.state.backend if self.world > 1 else None,
            total_steps=self.total_steps, start_step=self.start_step, trainable_params=self.trainable,
            total_params=self.total_params, output_dir=str(self.out), cpu_staged_allreduce=self.cpu_staged,
            resumed_from=str(self.resume.path) if self.resume.path else None,
            loader_workers=self.workers[0], loader_why=self.workers[1],
            levers=self.levers.lines + ((f"sequence: {self.sequence.line}",) if self.sequence else ()),
            data_checked=report.summary() if (report := self.workload.data_report) is not None else None,
            lora=described(self.adapted) if self.adapted else None,
        )  # fmt: skip

    # -- the hot path -------------------------------------------------------------------------------
    def train_step(self, step: int, batches: Iterator[Batch]) -> None:
        """One optimizer step: this rank's ``accumulation`` micro-batches read ahead and their
        trained tokens counted on the host, summed over the processes (``step_loss``); each one's
        share of the step's loss back-propagated, gradients all-reduced once (on the last
        backward), then ``optimizer_step``. No device sync."""
        acc, model, device, window = self.accelerator, self.model, self.device, self.window
        accumulation, tokens_key = self.settings.accumulation, self.workload.tokens_key
        rank = self.data_rank
        shard = () if self.sequence is None else (self.sequence.shard,)  # a shard's dropout: its own draws
        forward = self.workload.forward
        if self.workload.at_step is not None:  # the task told the step's number (GRPO's sampling seeds)
            self.workload.at_step(step)
        ahead = [window.next_batch(batches) for _ in range(accumulation)]  # collated, on the host
        counts, total = self.step_loss.tokens(ahead)  # (one CPU all-reduce with several processes)
        if self.workload.step_start is not None:
            ahead = self._whole_step(ahead)
        for micro in range(accumulation):
            batch = _to_device(ahead[micro], device, self.pin)
            _reseed(mix_seed(self.cfg.run.seed, step, self.order.micro_index(rank, micro), *shard), device)
            last = micro == accumulation - 1
            # accelerate's own flag (public setter): DeepSpeed's backward ends its accumulation and
            # steps its engine only on the last micro-batch; the optimizer wrappers read it too
            acc.sync_gradients = last
            with contextlib.nullcontext() if last else acc.no_sync(model):  # DDP/FSDP: sync on the last only
                out = forward(model, batch) if forward else model(**batch)  # the task's loss, or the model's
                loss, share = self.step_loss.micro(out, counts[micro], total)
                acc.backward(loss)  # divides by the accumulation (and scales the loss for fp16)
            # packed rows: no mask, every id a token; a task's own per-micro-batch metrics (Workload.forward)
            window.add(share, batch_tokens(batch, tokens_key), getattr(out, "metrics", None))
        self.optimizer_step()
        window.end_step()

    def _whole_step(self, ahead: list[Batch]) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of the step, on the device, handed to the task's
        ``step_start`` before the first forward (KTO: the KL estimate over the global batch)."""
        on_device = [_to_device(batch, self.device, self.pin) for batch in ahead]
        assert self.workload.step_start is not None
        self.workload.step_start(self.model, on_device, self.accelerator.gather)
        return on_device

    def optimizer_step(self) -> None:
        """Clip, update, schedule: the one place an update is counted as done or dropped (fp16
        overflow) and the lr schedule advances. Under a loss scale the skip is read one step late
        (``settle``, precision.py): no host sync here."""
        if self.cfg.optim.max_grad_norm:
            self.accelerator.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        self.settle()  # the previous step's
        self.skips.before_step()
        self.optimizer.step()  # accelerate's wrapper: scaler.step + scaler.update (fp16)
        if self.skips.scaler is None:
            # no loss scale to read: the optimizer's own word (its scheduler wrapper would not step either)
            self._updated(skipped=self.optimizer.step_was_skipped)
        else:
            self.skips.record()  # settled before the next update, or at the next window sync
        self.optimizer.zero_grad(set_to_none=True)

    def settle(self) -> None:
        """The recorded step's skip check, where one is pending (fp16 under a loss scale)."""
        if self.skips.pending:
            self._updated(skipped=self.skips.settle())

    def _updated(self, skipped: bool) -> None:
        """An overflowed update is counted and the lr schedule does not advance; else it does."""
        if skipped:
            self.state.skipped_steps += 1
        else:
            self.scheduler.step()

    # -- the loop -----------------------------------------------------------------------------------
    def fit(self) -> None:
        """Every optimizer step from ``start_step`` on, then what it calls for: log, eval, save, stop."""
        if self.cfg.run.eval_at_start and self.start_step == 0:
            self.evaluate(0)  # the "before" of a before/after comparison (xtrain quickstart's table)
        if self.early is not None:  # resumed at the evaluation that stopped it
            return
        self.model.train()
        batches = iter(self.loader)
        self.window.reset()
        with StepSignals() as signals:
            for step in range(self.start_step, self.total_steps):
                self.train_step(step, batches)
                asked = signals.signum or self._stop_asked()
                stop = agree_to_stop(self.accelerator, asked, self.stop_group)
                due = Due.after(step + 1, self.total_steps, self.cfg.run, stop)
                if not due.anything:
                    self.rep.progress(due.done, self.total_steps)
                    continue
                self.close_window(due.done)
                if due.eval and self.evaluate_ends_run(due.done):
                    return  # a clean end: finish() saves and writes the result
                if due.save:
                    self.save(due.done)
                if due.stop:
                    self.stop(due.done, due.stop)
                self.window.reset()

    def evaluate_ends_run(self, step: int) -> bool:
        """Evaluate at ``step``; True when early stopping ends the run there."""
        self.evaluate(step)
        self.early = self._early_stop(step)
        if self.early is not None:
            self.rep.note(f"{self.early.reason}; the best model: {self.out / checkpoint.BEST}")
        return self.early is not None

    def stop(self, step: int, signum: int) -> None:
        """A signal stopped the run: checkpointed at ``step`` (once), then ``TrainingStopped``."""
        path = self.save(step) if self.state.last_saved != step else self._step_dir(step)
        if self.files is not None:  # a stop asked through the run's folder: honoured
            run_control.clear_stop(self.out)
        how = "a stop request" if self.stop_file else f"signal {signum}"
        self.rep.note(f"stopped at step {step} on {how}; resume with the same command")
        raise TrainingStopped(step, path, signum)

    def _stop_asked(self) -> int | None:
        """A stop asked through the run's folder (``runtime.run_control``: the studio's Stop), read
        by the main process at a step boundary: a Ctrl+C for every rank (a checkpoint, then the stop)."""
        if self.files is None or not run_control.stop_requested(self.out, self.started):
            return None
        self.stop_file = True
        return signal.SIGINT

    def _early_stop(self, step: int) -> EarlyStop | None:
        """Whether the evaluations so far end the run at ``step`` (run.early_stopping_patience).
        Every rank decides from the same gathered metrics; the main process's answer is taken."""
        if not self.cfg.run.early_stopping_patience:
            return None  # (no collective either)
        found = early_stop_at(step, self.state.eval_history, self.cfg.run)
        if not main_decides(self.accelerator, found is not None, self.stop_group):
            return None
        return found or EarlyStop.followed(step)  # a rank that saw otherwise follows rank 0

    def close_window(self, done: int) -> dict[str, float]:
        """The logging window's one host sync: loss, throughput, memory; divergence stops here."""
        self.settle()  # lr, skipped count and scheduler state complete before log/save
        acc, s = self.accelerator, self.settings
        w = self.window.close(acc, s.accumulation * self.world, s.global_batch)
        failures.check_streak(w.worst_streak, done, self.out)  # diverged: stop here
        self.windows.append(w.record(done))
        metrics = {**w.metrics(float(self.scheduler.get_last_lr()[0])), **peak_memory(acc, self.device)}
        self.state.losses.append([done, w.loss])
        self.state.log_history.append({"step": done, **metrics})  # the curves (run_files.py)
        for note in self.files.logged(self.state.log_history[-1]) if self.files is not None else []:
            self.rep.note(note)  # history.jsonl: a page draws the curves as the run goes
        acc.log(metrics, step=done)
        self.rep.progress(done, self.total_steps, metrics)
        return metrics

    # -- evaluation and checkpoints -------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Evaluate (forward-only or by generation), log, and keep the best checkpoint."""
        acc, out, history = self.accelerator, self.out, self.state.eval_history
        samples: list[Prediction] = []
        metrics = (
            evaluate(acc, self.model, self.eval_loader, self.workload, samples) if self.eval_loader else {}
        )
        if metrics:
            history.append({"step": step, **metrics})
            acc.log(metrics, step=step)
            self.rep.evaluated(step, metrics)
        # the task's warnings; a run without eval data gets them at each eval_every and its end
        if (metrics or self.eval_loader is None) and self.workload.notes:
            for line in self.workload.notes(history):
                self.rep.note(line)  # the task's warnings (reward accuracy at chance, a tool that raises)
        if samples:  # generative tasks: reference vs prediction, shown and logged as text
            self.predictions[:] = [asdict(p) for p in samples]
            self.rep.predictions(step, self.predictions)
            tracking.log_text(acc, {"eval/predictions": predictions_markdown(samples)}, step)
        self._look(step, self.predictions if samples else [])
        check_early_stopping(self.cfg.run, True, metrics)
        note = keep_best(acc, self.model, self.workload, out, step, metrics, history, self.cfg, self.record)
        if note is not None:
            self.rep.note(note)
        return metrics

    def save(self, step: int) -> Path:
        """A resumable checkpoint of this step (never of NaN/inf weights): accelerate's state and
        ``state``, the run's history."""
        finite = sharded.finite_check_input(self.accelerator, self.params)  # sharded: all ranks agree
        failures.check_finite(finite, step, self.window.streak, self.out)
        start = [a.sha256 for a in start_of(self.cfg.model.name_or_path).adapters]  # resume checks it
        saved = self.state.saved_at(
            step,
            self.order,
            self.settings,
            self.world,
            self.total_steps,
            self.cfg.run.seed,
            self.config_dict,
            start,
        )
        adapter = checkpoint.checkpoint_result(  # a LoRA checkpoint holds its adapter: a start of its own
            self.accelerator, self.model, self.workload.tokenizer, self.record, self.cfg.lora.enabled
        )
        path = checkpoint.save(self.accelerator, self.out, saved, self.cfg.run.keep_checkpoints, adapter)
        self.rep.checkpoint_saved(step, str(path))
        self.state.last_saved = step
        return path

    @property
    def record(self) -> dict[str, str]:
        """The run record saved with the adapter/model (what ``xtrain predict`` reads)."""
        cfg = self.cfg
        quantized = {"quantization": cfg.model.quantization} if cfg.model.quantization else {}
        # what the stage started from and trained (model.start: the lineage a next stage extends)
        mode = "full" if not cfg.lora.enabled else "continue" if cfg.lora.continue_adapter else "new"
        stage = stage_record(start_of(cfg.model.name_or_path), mode)
        # the data settings: ``xtrain predict --data`` reads a file with the run's own columns and format
        more = {**self.workload.record, **quantized, "data": self.config_dict["data"], **stage}
        return run_record(cfg.model.task, self.workload.chat, more)

    def _step_dir(self, step: int) -> Path:
        return checkpoint.checkpoints_dir(self.out) / f"step-{step}"

    # -- the end ------------------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """Final eval and checkpoint, the adapter (+ merged model) and ``train_result.json``."""
        acc, out, total, state = self.accelerator, self.out, self.total_steps, self.state
        final = self.early.step if self.early is not None else total  # the last step trained
        if frequent_overflow(state.skipped_steps, total):
            self.rep.note(
                f"{state.skipped_steps} of {total} optimizer steps were skipped for fp16 overflow (their "
                "update dropped); bf16 has fp32's range and needs no loss scaling: --precision bf16"
            )
        if not state.eval_history or state.eval_history[-1]["step"] != final:
            final_metrics = self.evaluate(final)
        else:
            final_metrics = {k: v for k, v in state.eval_history[-1].items() if k != "step"}
        outputs: dict[str, str] = {}
        if (out / checkpoint.BEST).is_dir() and self.cfg.run.best_metric:
            outputs["best"] = str(out / checkpoint.BEST)
        outputs["checkpoint"] = str(self.save(final) if state.last_saved != final else self._step_dir(final))
        if self.files is not None:  # the curves of the whole run (the last evaluation may have skipped them)
            for note in self.files.finished(History.of(state)):
                self.rep.note(note)
            if self.files.picture is not None:
                outputs["curves"] = str(self.files.picture)
        result = self._result(final, final_metrics, outputs)
        acc.wait_for_everyone()

        def write(model: Module, saved: dict[str, Any] | None) -> None:
            tokenizer, merged = self.workload.tokenizer, self.cfg.run.save_merged
            outputs.update(checkpoint.save_final(model, tokenizer, out, merged, self.record, saved))
            # a re-run of a finished run trains nothing: its train_result.json (throughput, ...) stays
            keep = self.start_step >= final
            outputs["result"] = str(checkpoint.write_result(out, asdict(result), keep=keep))

        # sharded weights: gathered on every rank, written by the main process (sharded.py); the
        # filesystem failing under it stops every rank with one line (checkpoint.write_on_main)
        lora = self.cfg.lora.enabled
        sharded.save_on_main(acc, self.model, write, ("the final outputs", out), trainable_only=lora)
        if self.cfg.eval.benchmarks:  # the saved result scored by these processes, the training let go
            result = self._benchmarks(result)
        self.rep.end(result)
        return result

    def _benchmarks(self, result: TrainResult) -> TrainResult:
        """``eval.benchmarks`` on the saved result (``train/benchmarks.py``), once the training's
        model, optimizer and data are let go; the result file and curves rewritten with them."""
        for part in (
            "model",
            "optimizer",
            "scheduler",
            "workload",
            "loader",
            "eval_loader",
            "params",
            "levers",
        ):
            self.__dict__.pop(part, None)
        self.accelerator.free_memory()
        result = benchmarks.at_end(self.run, self.accelerator, result, self.rep)
        if self.accelerator.is_main_process:
            checkpoint.write_result(self.out, asdict(result))
            for note in self.files.draw(History.of(result)) if self.files is not None else []:
                self.rep.note(note)
        return result

    def _result(self, final: int, metrics: dict[str, float], outputs: dict[str, str]) -> TrainResult:
        """``TrainResult``: the history, the outputs, this session's throughput (its windows)."""
        s = self.settings
        info = run_info(self.accelerator, self.run.plan, s, self.cpu_staged, self.skips, self.memory)
        return session_result(
            final, self.total_steps, self.state, metrics, outputs, self.windows, s, self.world,
            resumed_from=str(self.resume.path) if self.resume.path else None, predictions=self.predictions,
            stopped_early=self.early.to_dict() if self.early is not None else None,
            run_info=info | self.levers.record() | adapted_record(self.adapted)
            | (self.sequence.record() if self.sequence else {}),
        )  # fmt: skip
