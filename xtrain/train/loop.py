# longer: the Recipe holds one run, read top to bottom in one file; the next step of issue 33
# (the loop as a recipe: setup as named builders, one RunState) splits it.
"""The training loop as a recipe: setup, train step, evaluate, checkpoint, each readable alone.

    settings     <- config + plan + world size, resolved once        planning/resolve.py
    accelerator  <- the plan (backend, cpu, precision, TF32, env)     accelerator.py
    workload     <- the task (model with LoRA, datasets, collator)    tasks/
    data order   <- (seed, global batch): same samples for any process count   sampler.py
    for step in steps:                      # one optimizer step = global_batch samples
        for micro-batch in this rank's share:
            forward, backward               # no_sync on all but the last micro-batch
        clip, optimizer, scheduler
        every log_every: one host sync for loss / throughput           window.py
        every eval_every / save_every: evaluate / checkpoint           evaluation.py, checkpoint.py
        no improvement in early_stopping_patience evals: stop early    stops.py
    adapter (+ merged model) and train_result.json                   checkpoint.py

Randomness (dropout) is reseeded from (seed, step, micro-batch number) before every forward
pass, so it too is independent of how many processes share the step and of resumes.

One class, ``Recipe``, holds one run: its parts share the run's state, and reading them in one
file is reading the run. The pieces with a job of their own live beside it: window.py (logging
sync), evaluation.py, optim.py, failures.py, collective.py, stops.py, result.py, tracking.py.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from xtrain.config.loading import config_to_dict, flat_config
from xtrain.config.schema import TrainConfig
from xtrain.data.collate import batch_tokens
from xtrain.data.sampler import DataOrder, RankBatchSampler, mix_seed, train_lengths
from xtrain.model import quantization
from xtrain.model.sharding import prepare_generation
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Plan
from xtrain.planning.run import Run, for_process
from xtrain.runtime import lifetime, lock, quiet
from xtrain.runtime.signals import StepSignals
from xtrain.train import checkpoint, failures, preflight, tracking
from xtrain.train.distributed import sharded
from xtrain.train.distributed.accelerator import build_accelerator, release, stage_allreduce_on_cpu
from xtrain.train.distributed.collective import (
    BuildFn,
    agree_to_stop,
    build_workload_main_first,
    main_decides,
    on_main,
    stop_group,
)
from xtrain.train.early_stopping import EarlyStop, check_early_stopping, early_stop_at
from xtrain.train.evaluation import evaluate
from xtrain.train.failures import NonFiniteLoss, TrainingStopped, out_of_memory_error
from xtrain.train.optim import build_optimizer, build_scheduler
from xtrain.train.precision import SkipDetector, frequent_overflow, upcast_trainable
from xtrain.train.report import NullReporter, Reporter, StartInfo
from xtrain.train.result import TrainResult, run_info, run_record
from xtrain.train.window import LogWindow, peak_memory

if TYPE_CHECKING:
    from xtrain.tasks.contract import MainProcessFirst, Workload

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


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v for k, v in batch.items()}


class Recipe:
    """One training run of this rank: ``run()`` = ``setup()``, then ``train_step()`` per
    optimizer step with ``close_window()``, ``evaluate()`` and ``save()`` at their intervals,
    then ``finish()``. State lives on the instance; nothing here prints (``Reporter`` does)."""

    def __init__(self, run: Run, reporter: Reporter | None = None, build: BuildFn | None = None) -> None:
        cfg = run.cfg
        self.run, self.build = run, build or _default_build
        self.cfg, self.plan, self.ctx, self.settings = cfg, run.plan, run.context, run.settings
        self.config_dict = config_to_dict(cfg)
        self.out = Path(cfg.run.output_dir)
        # Everything a user can get wrong about resuming is checked before anything starts.
        self.resume_from, damaged = checkpoint.find_resume_checked(self.out, cfg.run.resume)
        for note in damaged if (reporter is not None and self.ctx.rank == 0) else []:
            reporter.note(note)  # a damaged newest checkpoint was skipped for the previous good one
        self.resume_state = (
            checkpoint.read_state(self.resume_from, self.config_dict) if self.resume_from else None
        )
        self.reporter = reporter
        # run state, filled by setup() and the loop
        self.losses: list[list[float]] = []
        self.eval_history: list[dict[str, float]] = []
        self.predictions: list[dict[str, str]] = []  # the last eval's samples (generative tasks)
        self.skipped = 0  # optimizer steps dropped for fp16 overflow
        self.last_saved = -1
        self.early: EarlyStop | None = None  # run.early_stopping_patience ended the run here
        self.trained = [0.0, 0, 0]  # seconds, samples, tokens over closed windows
        self.windows: list[dict[str, float]] = []  # this session's closed windows (TrainResult)

    # -- the whole run --------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """The whole run: ``setup``, ``fit``, ``finish``, the Accelerator released after."""
        s = self.settings
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

    # -- setup: workload, data order, optimizer, scheduler, prepare, loaders, resume ------------------
    def setup(self) -> None:
        from accelerate.utils import set_seed

        cfg, acc = self.cfg, self.accelerator
        self.rep: Reporter = (
            self.reporter if (self.reporter is not None and acc.is_main_process) else NullReporter()
        )
        self.world, self.rank, self.device = acc.num_processes, acc.process_index, acc.device

        set_seed(cfg.run.seed)  # identical LoRA initialisation on every rank
        sharded.check_outputs(
            acc, cfg.run.save_merged, cfg.lora.enabled, cfg.lora.init_weights
        )  # before anything is built
        sharded.check_quantization(acc, cfg.model.quantization)
        self._setup_model()
        self._setup_data()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.skips = SkipDetector(acc.scaler)  # fp16: was a step skipped? (read one step late)
        self.window = LogWindow(self.device)
        check_early_stopping(cfg.run, has_eval_set=self.eval_loader is not None)
        backend = acc.state.backend if self.world > 1 else None
        values = tracking.params(flat_config(cfg), self.settings, self.world, backend, self.device)
        on_main(acc, lambda: tracking.start(acc, self.settings.trackers, self.out, values), "start trackers")
        self.rep.start(self._start_info())

    def _setup_model(self) -> None:
        """Workload, data order, optimizer, schedule; all prepared by accelerate."""
        cfg, s, acc = self.cfg, self.settings, self.accelerator
        with sharded.whole_model_loading(acc):  # ZeRO-3: no zero.Init collective in a main-first build
            self.workload = build_workload_main_first(acc, self.run, self.build)
        # data.group_by_length: one length per sample (a task without lengths: one line, before any step)
        lengths = train_lengths(self.workload) if cfg.data.group_by_length else None
        self.order = DataOrder(
            len(self.workload.train_dataset),
            s.global_batch,
            s.per_device,
            self.world,
            cfg.run.seed,
            lengths=lengths,
        )
        self.total_steps = cfg.run.max_steps or max(1, math.ceil(cfg.run.epochs * self.order.steps_per_epoch))

        model = self.workload.model
        quantization.keep_training_layout(model)  # evaluations leave 4-bit weights as training needs them
        upcast_trainable(model, s.precision)  # fp32 master weights under autocast
        optimizer = build_optimizer(model, cfg, s.lr, self.device)
        scheduler = build_scheduler(cfg, optimizer, self.total_steps)
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        from xtrain.model.size import total_weights

        self.total_params = total_weights(model)  # a 4-bit weight unpacked, not its packed bytes
        saves = self.total_steps // cfg.run.save_every + 1 if cfg.run.save_every else 1
        for note in preflight.check_disk(
            self.out, self.trainable, self.total_params, cfg.run.keep_checkpoints, cfg.run.save_merged, saves
        ):
            self.rep.note(note)  # (a run that cannot fit stops here, before the first step)
        sharded.fill_deepspeed(acc, s.per_device, cfg.optim.max_grad_norm)
        self.model, self.optimizer, self.scheduler = acc.prepare(model, optimizer, scheduler)
        prepare_generation(acc, self.model)  # FSDP2: generate all-gathers like forward
        checkpoint.install_model_hooks(acc)
        self.memory = self._check_memory(model)
        self.cpu_staged = stage_allreduce_on_cpu(self.model, self.plan, self.world)
        self.stop_group = stop_group(self.world, self.plan.backend)

    def _check_memory(self, model: Any) -> Any:
        """CUDA: the memory estimate with the real counts against this card; the main process
        notes it when it does not fit (the run goes on: the estimate is rough)."""
        if self.device.type != "cuda":
            return None
        from xtrain.tasks.sizes import check_live_model

        props = torch.cuda.get_device_properties(self.device)
        check = check_live_model(model, self.cfg, self.settings.precision, props.total_memory, props.name)
        if check is not None and check.warning:
            self.rep.note(check.warning)
        return check

    def _setup_data(self) -> None:
        """The eval loader, the resume position and this rank's train loader from it."""
        from torch.utils.data import DataLoader

        from xtrain.tasks import get as get_task

        s, w = self.settings, self.workload
        self.pin = s.pin_memory and self.device.type == "cuda"
        self.workers = s.workers_for(get_task(self.cfg.model.task).decodes_media)  # (count, why)
        loading: dict[str, Any] = {"collate_fn": w.collator, "num_workers": self.workers[0]}
        loading["pin_memory"] = self.pin
        if self.workers[0]:  # started once per run: a spawned worker (Windows, macOS) costs an import
            loading["persistent_workers"] = True
        self.eval_loader = None
        if w.eval_dataset is not None and len(w.eval_dataset) > 0:
            # split_batches: per_device on each rank
            eval_loader = DataLoader(w.eval_dataset, batch_size=s.per_device * self.world, **loading)
            self.eval_loader = self.accelerator.prepare(eval_loader)
        self.start_step = self._resume_position()
        sampler = RankBatchSampler(self.order, self.rank, self.start_step, self.total_steps)
        self.loader = DataLoader(w.train_dataset, batch_sampler=sampler, **loading)

    def _start_info(self) -> StartInfo:
        return StartInfo.of(
            self.settings, processes=self.world, device=str(self.device),
            backend=self.accelerator.state.backend if self.world > 1 else None,
            total_steps=self.total_steps, start_step=self.start_step, trainable_params=self.trainable,
            total_params=self.total_params, output_dir=str(self.out), cpu_staged_allreduce=self.cpu_staged,
            resumed_from=str(self.resume_from) if self.resume_from else None,
            loader_workers=self.workers[0], loader_why=self.workers[1],
            data_checked=report.summary() if (report := self.workload.data_report) is not None else None,
        )  # fmt: skip

    def _resume_position(self) -> int:
        """Load the checkpoint to resume from (if any) and return the step to start at."""
        acc, state = self.accelerator, self.resume_state
        if acc.is_main_process:
            checkpoint.remove_partial(self.out)
        if self.resume_from is None or state is None:
            return 0
        checkpoint.load(acc, self.resume_from)
        self.losses, self.eval_history = list(state.losses), list(state.eval_history)
        self.skipped = state.skipped_steps
        self.last_saved = state.step
        s = self.settings
        for note in checkpoint.changes(
            state, self.config_dict, s.global_batch, self.order.num_samples, self.total_steps
        ):
            self.rep.note(note)
        # the same history decides the same: a run that stopped early does not train on
        self.early = self._early_stop(state.step)
        if self.early is not None:
            self.rep.note(
                f"this run already {self.early.reason}; nothing to train (a larger "
                "run.early_stopping_patience trains on, a new run.output_dir starts over)"
            )
        return min(state.step, self.total_steps)

    # -- the hot path -------------------------------------------------------------------------------
    def train_step(self, step: int, batches: Iterator[Any]) -> None:
        """One optimizer step: ``accumulation`` micro-batches of this rank's share, gradients
        all-reduced once (on the last backward), then clip, update, schedule. No host sync."""
        acc, model, device, window = self.accelerator, self.model, self.device, self.window
        accumulation, tokens_key = self.settings.accumulation, self.workload.tokens_key
        for micro in range(accumulation):
            batch = _to_device(window.next_batch(batches), device, self.pin)
            _reseed(mix_seed(self.cfg.run.seed, step, self.order.micro_index(self.rank, micro)), device)
            last = micro == accumulation - 1
            # accelerate's own flag (public setter): DeepSpeed's backward ends its accumulation and
            # steps its engine only on the last micro-batch; the optimizer wrappers read it too
            acc.sync_gradients = last
            with contextlib.nullcontext() if last else acc.no_sync(model):  # DDP/FSDP: sync on the last only
                loss = model(**batch).loss
                acc.backward(loss)  # divides by the accumulation (and scales the loss for fp16)
            window.add(loss, batch_tokens(batch, tokens_key))  # packed rows: no mask, every id a token
        if self.cfg.optim.max_grad_norm:
            acc.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        self._settle()  # the previous step's skip check + lr step (fp16; see precision.py)
        self.skips.before_step()
        self.optimizer.step()  # accelerate's wrapper: scaler.step + scaler.update (fp16)
        if self.skips.scaler is None:
            # no loss scale to read: the optimizer's own word (its wrapper holds the schedule back)
            self.skipped += int(self.optimizer.step_was_skipped)
            self.scheduler.step()
        else:
            self.skips.record()  # settled before the next update, or at the next window sync
        self.optimizer.zero_grad(set_to_none=True)
        window.end_step()

    def _settle(self) -> None:
        if self.skips.pending:
            if self.skips.settle():
                self.skipped += 1  # overflow: no update, and the lr schedule does not advance
            else:
                self.scheduler.step()

    # -- the loop -----------------------------------------------------------------------------------
    def fit(self) -> None:
        cfg, total = self.cfg, self.total_steps
        log_every, eval_every, save_every = max(1, cfg.run.log_every), cfg.run.eval_every, cfg.run.save_every
        if cfg.run.eval_at_start and self.start_step == 0:
            self.evaluate(0)  # the "before" of a before/after comparison (xtrain quickstart's table)
        if self.early is not None:  # resumed at the evaluation that stopped it
            return
        self.model.train()
        batches = iter(self.loader)
        self.window.reset()
        with StepSignals() as signals:
            for step in range(self.start_step, total):
                self.train_step(step, batches)
                done = step + 1
                stop = agree_to_stop(self.accelerator, signals.signum, self.stop_group)
                eval_due = bool(eval_every) and done % eval_every == 0 and done < total
                save_due = bool(save_every) and done % save_every == 0 and done < total
                if not (done % log_every == 0 or done == total or eval_due or save_due or stop):
                    self.rep.progress(done, total)
                    continue
                self.close_window(done)
                if eval_due:
                    self.evaluate(done)
                    self.early = self._early_stop(done)
                    if self.early is not None:  # a clean end: finish() saves and writes the result
                        self.rep.note(f"{self.early.reason}; the best model: {self.out / checkpoint.BEST}")
                        return
                if save_due:
                    self.save(done)
                if stop:
                    path = self.save(done) if self.last_saved != done else self._step_dir(done)
                    self.rep.note(f"stopped at step {done} on signal {stop}; resume with the same command")
                    raise TrainingStopped(done, path, stop)
                self.window.reset()

    def _early_stop(self, step: int) -> EarlyStop | None:
        """Whether the evaluations so far end the run at ``step`` (run.early_stopping_patience).
        Every rank decides from the same gathered metrics; the main process's answer is taken."""
        if not self.cfg.run.early_stopping_patience:
            return None  # (no collective either)
        found = early_stop_at(step, self.eval_history, self.cfg.run)
        if not main_decides(self.accelerator, found is not None, self.stop_group):
            return None
        return found or EarlyStop.followed(step)  # a rank that saw otherwise follows rank 0

    def close_window(self, done: int) -> dict[str, float]:
        """The logging window's one host sync: loss, throughput, memory; divergence stops here."""
        self._settle()  # lr, skipped count and scheduler state complete before log/save
        acc, s = self.accelerator, self.settings
        w = self.window.close(acc, s.accumulation * self.world, s.global_batch)
        failures.check_streak(w.worst_streak, done, self.out)  # diverged: stop here
        for i, v in enumerate((w.seconds, w.samples, w.tokens)):
            self.trained[i] += v
        self.windows.append(w.record(done))
        metrics = {**w.metrics(float(self.scheduler.get_last_lr()[0])), **peak_memory(acc, self.device)}
        self.losses.append([done, w.loss])
        acc.log(metrics, step=done)
        self.rep.progress(done, self.total_steps, metrics)
        return metrics

    # -- evaluation and checkpoints -------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Evaluate (forward-only or by generation), log, and keep the best checkpoint."""
        acc, out = self.accelerator, self.out
        samples: list[Any] = []
        metrics = (
            evaluate(acc, self.model, self.eval_loader, self.workload, samples) if self.eval_loader else {}
        )
        if metrics:
            self.eval_history.append({"step": step, **metrics})
            acc.log(metrics, step=step)
            self.rep.evaluated(step, metrics)
        if samples:  # generative tasks: reference vs prediction, shown and logged as text
            from xtrain.tasks.generation import predictions_markdown

            self.predictions[:] = [asdict(p) for p in samples]
            self.rep.predictions(step, self.predictions)
            tracking.log_text(acc, {"eval/predictions": predictions_markdown(samples)}, step)
        check_early_stopping(self.cfg.run, True, metrics)
        best = self.cfg.run.best_metric
        if best and best in metrics and checkpoint.is_new_best(best, metrics[best], self.eval_history[:-1]):
            sharded.save_on_main(
                acc,
                self.model,
                lambda model, state: checkpoint.save_best(
                    model, self.workload.tokenizer, out, step, best, metrics[best], self.record, state
                ),
                ("the best model", out),
                trainable_only=self.cfg.lora.enabled,
            )
            self.rep.note(
                f"best {best} so far ({metrics[best]:.4f} at step {step}) -> {out / checkpoint.BEST}"
            )
        return metrics

    def save(self, step: int) -> Path:
        """A resumable checkpoint of this step (never of NaN/inf weights)."""
        finite = sharded.finite_check_input(self.accelerator, self.params)  # sharded: all ranks agree
        failures.check_finite(finite, step, self.window.streak, self.out)
        path = checkpoint.save(
            self.accelerator, self.out, self._state_at(step), self.cfg.run.keep_checkpoints
        )
        self.rep.checkpoint_saved(step, str(path))
        self.last_saved = step
        return path

    def _state_at(self, step: int) -> checkpoint.TrainState:
        s, epoch_in = self.settings, self.order.position(step)
        return checkpoint.TrainState(
            step=step, epoch=epoch_in[0], step_in_epoch=epoch_in[1], samples_seen=step * s.global_batch,
            seed=self.cfg.run.seed, global_batch=s.global_batch, per_device=s.per_device,
            world_size=self.world, accumulation=s.accumulation, num_samples=self.order.num_samples,
            total_steps=self.total_steps, config=self.config_dict, losses=self.losses,
            eval_history=self.eval_history, skipped_steps=self.skipped,
        )  # fmt: skip

    @property
    def record(self) -> dict[str, str]:
        """The run record saved with the adapter/model (what ``xtrain predict`` reads)."""
        quantized = {"quantization": self.cfg.model.quantization} if self.cfg.model.quantization else {}
        # the data settings: ``xtrain predict --data`` reads a file with the run's own columns and format
        more = {**self.workload.record, **quantized, "data": self.config_dict["data"]}
        return run_record(self.cfg.model.task, self.workload.chat, more)

    def _step_dir(self, step: int) -> Path:
        return checkpoint.checkpoints_dir(self.out) / f"step-{step}"

    # -- the end ------------------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """Final eval and checkpoint, the adapter (+ merged model) and ``train_result.json``."""
        acc, s, out, total = self.accelerator, self.settings, self.out, self.total_steps
        final = self.early.step if self.early is not None else total  # the last step trained
        if frequent_overflow(self.skipped, total):
            self.rep.note(
                f"{self.skipped} of {total} optimizer steps were skipped for fp16 overflow (their update "
                "dropped); bf16 has fp32's range and needs no loss scaling: --precision bf16"
            )
        if not self.eval_history or self.eval_history[-1]["step"] != final:
            final_metrics = self.evaluate(final)
        else:
            final_metrics = {k: v for k, v in self.eval_history[-1].items() if k != "step"}
        outputs: dict[str, str] = {}
        if (out / checkpoint.BEST).is_dir() and self.cfg.run.best_metric:
            outputs["best"] = str(out / checkpoint.BEST)
        outputs["checkpoint"] = str(self.save(final) if self.last_saved != final else self._step_dir(final))
        seconds, samples, tokens = self.trained
        result = TrainResult(
            final_step=final,
            total_steps=total,
            losses=self.losses,
            eval_metrics=final_metrics,
            eval_history=self.eval_history,
            outputs=outputs,
            samples_per_s=samples / seconds if seconds > 0 else 0.0,
            tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
            world_size=self.world,
            accumulation=s.accumulation,
            global_batch=s.global_batch,
            resumed_from=str(self.resume_from) if self.resume_from else None,
            skipped_steps=self.skipped,
            predictions=self.predictions,
            windows=self.windows,
            stopped_early=self.early.to_dict() if self.early is not None else None,
            run_info=run_info(
                self.accelerator, self.plan, self.settings, self.cpu_staged, self.skips, self.memory
            ),
        )
        acc.wait_for_everyone()

        def write(model: Any, state: dict[str, Any] | None) -> None:
            tokenizer, merged = self.workload.tokenizer, self.cfg.run.save_merged
            outputs.update(checkpoint.save_final(model, tokenizer, out, merged, self.record, state))
            # a re-run of a finished run trains nothing: its train_result.json (throughput, ...) stays
            keep = self.start_step >= final
            outputs["result"] = str(checkpoint.write_result(out, asdict(result), keep=keep))

        # sharded weights: gathered on every rank, written by the main process (sharded.py); the
        # filesystem failing under it stops every rank with one line (checkpoint.write_on_main)
        lora = self.cfg.lora.enabled
        sharded.save_on_main(acc, self.model, write, ("the final outputs", out), trainable_only=lora)
        self.rep.end(result)
        return result
