"""Training events and how the command line shows them.

The loop reports through the small ``Reporter`` protocol and never prints. ``RichReporter``
(the CLI edge, main process only) turns the events into a start banner, a progress bar with
loss, lr, samples/s, tokens/s and ETA, a line of the task's own metrics every logging window
(rewards, margins, KL, ...), eval lines and a closing summary. ``NullReporter`` is the
default for library use and for every rank but the main one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from xtrain.console import make_console
from xtrain.planning.batch import batch_line

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from xtrain.planning.resolve import RunSettings
    from xtrain.train.result import TrainResult


@dataclass
class StartInfo:
    """What the start banner shows."""

    processes: int
    device: str
    backend: str | None
    precision: str
    per_device: int
    accumulation: int
    global_batch: int
    total_steps: int
    start_step: int
    trainable_params: int
    total_params: int
    output_dir: str
    resumed_from: str | None = None
    cpu_staged_allreduce: bool = False
    loader_workers: int = 0
    loader_why: str = ""
    data_checked: str | None = None  # the task's data check on its first rows (DataReport.summary)
    levers: tuple[str, ...] = ()  # the loss and activation offloading, a line each (train/levers.py)
    lora: str | None = None  # the layers LoRA adapts (``lora_layers.described``); None: no adapters
    sequence: int = 1  # parallel.sequence: processes a sequence is split across (they share its rows)

    @classmethod
    def of(cls, settings: RunSettings, **found: Any) -> StartInfo:
        """The banner of a run with these ``RunSettings``; ``found``: what setup found."""
        s = settings
        return cls(precision=s.precision, per_device=s.per_device, accumulation=s.accumulation,
                   global_batch=s.global_batch, sequence=s.sequence, **found)  # fmt: skip

    @property
    def batch_line(self) -> str:
        return batch_line(
            self.global_batch, self.per_device, self.processes, self.accumulation, self.sequence
        )


class Reporter(Protocol):
    def start(self, info: StartInfo) -> None: ...

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        """Called after every optimizer step; ``metrics`` only at log points."""

    def evaluated(self, step: int, metrics: dict[str, float]) -> None: ...

    def checkpoint_saved(self, step: int, path: str) -> None: ...

    def predictions(self, step: int, samples: list[dict[str, str]]) -> None:
        """Sample predictions of a generative eval: [{"reference": ..., "prediction": ...,
        "labels": (what each is)}]."""

    def note(self, message: str) -> None:
        """Something the user should know (resumed, global batch changed, stopping, ...)."""

    def encoding(self, what: str, done: int, total: int) -> None:
        """A first run encoding its rows (``xtrain.data.encoded``): ``done`` of ``total`` rows."""

    def end(self, result: TrainResult) -> None: ...


class NullReporter:
    """Reports nothing."""

    def start(self, info: StartInfo) -> None:
        pass

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        pass

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def checkpoint_saved(self, step: int, path: str) -> None:
        pass

    def predictions(self, step: int, samples: list[dict[str, str]]) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def encoding(self, what: str, done: int, total: int) -> None:
        pass

    def end(self, result: TrainResult) -> None:
        pass


class ListReporter(NullReporter):
    """Records every event (tests, and callers who want the events as data)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def start(self, info: StartInfo) -> None:
        self.events.append(("start", info))

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        if metrics is not None:
            self.events.append(("progress", (step, dict(metrics))))

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        self.events.append(("eval", (step, dict(metrics))))

    def checkpoint_saved(self, step: int, path: str) -> None:
        self.events.append(("checkpoint", (step, path)))

    def predictions(self, step: int, samples: list[dict[str, str]]) -> None:
        self.events.append(("predictions", (step, [dict(s) for s in samples])))

    def note(self, message: str) -> None:
        self.events.append(("note", message))

    def encoding(self, what: str, done: int, total: int) -> None:
        if done == total:  # the last call of an encoding
            self.events.append(("encoded", (what, total)))

    def end(self, result: TrainResult) -> None:
        self.events.append(("end", result))


# what the loop logs of every window (train/window.py); the other keys are the task's own metrics
LOOP_KEYS = frozenset({"loss", "lr", "samples_per_s", "tokens_per_s"})


def _esc(text: object) -> str:
    """A path or message as plain text (a folder named "[run1]" is not rich markup)."""
    from rich.markup import escape

    return escape(str(text))


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:.3g}"


class RichReporter:
    """A rich progress bar and banner on stderr (the main process of the CLI). When stderr is
    not a terminal (a log file, a pipe) there is no live bar: a plain progress line is printed at
    log points, at most every ``plain_every_s`` seconds (and at the last step)."""

    def __init__(self, console: Console | None = None, plain_every_s: float = 10.0) -> None:
        self.console = console or make_console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._fields = "starting"
        self._plain_every_s = plain_every_s
        self._last_plain = -float("inf")
        self._started = 0.0
        self._start_step = 0
        self._encoding: _EncodingBar | None = None

    # -- events --------------------------------------------------------------------------------
    def start(self, info: StartInfo) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        c = self.console
        comm = info.backend or "no process group"
        if info.cpu_staged_allreduce:
            comm += " (gradients all-reduced through CPU copies)"
        c.print(
            f"[bold]xtrain[/] {info.processes} process{'es' if info.processes != 1 else ''} on "
            f"{info.device}, {comm}, precision {info.precision if info.precision != 'no' else 'fp32'}"
        )
        c.print(f"  {info.batch_line}")
        if info.data_checked:
            c.print(f"  data checked: {_esc(info.data_checked)}")
        if info.loader_workers:
            c.print(f"  data: {info.loader_workers} loader worker(s) per process ({_esc(info.loader_why)})")
        for line in info.levers:
            c.print(f"  {_esc(line)}")
        if info.lora:
            c.print(f"  LoRA on {_esc(info.lora)}")
        share = 100 * info.trainable_params / max(1, info.total_params)
        c.print(
            f"  trainable parameters {info.trainable_params:,} of {info.total_params:,} ({share:.2f}%), "
            f"{info.total_steps} steps -> {_esc(info.output_dir)}"
        )
        if info.resumed_from:
            c.print(f"  resuming from {_esc(info.resumed_from)} (step {info.start_step})")
        if not c.is_terminal:  # a file or a pipe: periodic plain lines instead of a live bar
            self._started, self._start_step = time.monotonic(), info.start_step
            return
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=c,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "train", total=info.total_steps, completed=info.start_step, stats=self._fields
        )

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        if self._progress is None and not (metrics and not self.console.is_terminal):
            return
        if metrics:
            parts = [f"loss {metrics['loss']:.4f}"] if "loss" in metrics else []
            if "lr" in metrics:
                parts.append(f"lr {metrics['lr']:.2e}")
            if "samples_per_s" in metrics:
                parts.append(f"{_fmt(metrics['samples_per_s'])} samples/s")
            if metrics.get("tokens_per_s"):
                parts.append(f"{_fmt(metrics['tokens_per_s'])} tok/s")
            self._fields = "  ".join(parts)
        if self._progress is None:
            self._plain_line(step, total)
        else:
            self._progress.update(self._task, completed=step, stats=self._fields)
        if metrics:
            self._task_line(step, metrics)

    def _task_line(self, step: int, metrics: dict[str, float]) -> None:
        """The task's own metrics of the window (rewards, margins, KL, ...), a line every window:
        the bar's line holds the loop's."""
        own = {k: v for k, v in metrics.items() if k not in LOOP_KEYS and not k.startswith("peak_mem_mib/")}
        if own:
            shown = "  ".join(f"{k} {_fmt(v)}" for k, v in own.items())
            self._print(f"  [dim]step {step}[/] {_esc(shown)}")

    def _plain_line(self, step: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last_plain < self._plain_every_s and step < total:
            return
        self._last_plain = now
        done, elapsed = step - self._start_step, now - self._started
        eta = ""
        if done > 0 and step < total:
            eta = f"  eta {_duration(elapsed / done * (total - step))}"
        self.console.print(f"  step {step}/{total} ({100 * step // max(1, total)}%)  {self._fields}{eta}")

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        text = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        self._print(f"  eval @ step {step}: {text}")

    def checkpoint_saved(self, step: int, path: str) -> None:
        self._print(f"  checkpoint step {step} -> {_esc(path)}")

    def predictions(self, step: int, samples: list[dict[str, str]]) -> None:
        from rich.markup import escape

        for s in samples:
            ref, pred = escape(repr(s["reference"])), escape(repr(s["prediction"]))
            first, second = s.get("labels") or ("reference", "prediction")
            self._print(f"    [dim]{first}[/] {ref}  [dim]{second}[/] {pred}")

    def note(self, message: str) -> None:
        self._print(f"  [yellow]note:[/] {_esc(message)}")

    def encoding(self, what: str, done: int, total: int) -> None:
        if self._encoding is None or self._encoding.what != what:
            self._encoding = _EncodingBar(self.console, what, total, self._plain_every_s)
        if self._encoding.update(done):
            self._encoding = None

    def end(self, result: TrainResult) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        c = self.console
        outputs = getattr(result, "outputs", {}) or {}
        tokens = f", {_fmt(result.tokens_per_s)} tokens/s" if result.tokens_per_s else ""  # none for images
        wait = result.data_wait
        waited = f"; waiting for data {wait:.0%} of the time" if wait is not None else ""
        peak = (getattr(result, "run_info", None) or {}).get("peak_mem_mib")
        peaked = f"; peak GPU memory {peak / 1024:.2f} GiB" if peak else ""  # CUDA: this rank's allocated
        c.print(
            f"[bold green]done[/] step {result.final_step}: {_fmt(result.samples_per_s)} samples/s{tokens}"
            + waited
            + peaked
        )
        early = getattr(result, "stopped_early", None)
        if early:
            c.print(f"  [yellow]{_esc(early['reason'])}[/] (of {result.total_steps} steps)")
        if result.eval_metrics:
            c.print("  final eval: " + ", ".join(f"{k} {v:.4f}" for k, v in result.eval_metrics.items()))
        for name, path in outputs.items():
            c.print(f"  {name}: {_esc(path)}")

    def _print(self, text: str) -> None:
        (self._progress.console if self._progress is not None else self.console).print(text)


class _EncodingBar:
    """A first run's encoding of its rows: a live bar with rows/s and the time left on a terminal,
    a plain line every ``every_s`` seconds elsewhere; a closing line with the rate."""

    def __init__(self, console: Console, what: str, total: int, every_s: float) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console, self.what, self.total, self.every_s = console, what, total, every_s
        self.started = self.last_plain = time.monotonic()
        self.progress: Progress | None = None
        if console.is_terminal:
            self.progress = Progress(
                TextColumn(f"[bold]{_esc(what)}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=console, transient=True,
            )  # fmt: skip
            self.progress.start()
            self.task = self.progress.add_task(what, total=total, rate="")

    def update(self, done: int) -> bool:
        """Show ``done`` rows; True once all are (the bar closed, its line printed)."""
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        if self.progress is not None:
            self.progress.update(self.task, completed=done, rate=f"{_fmt(rate)} rows/s")
        elif done < self.total and time.monotonic() - self.last_plain >= self.every_s:
            self.last_plain = time.monotonic()
            eta = f"  eta {_duration((self.total - done) / rate)}" if rate > 0 else ""
            self.console.print(f"  {_esc(self.what)}: {done:,}/{self.total:,} rows, {_fmt(rate)} rows/s{eta}")
        if done < self.total:
            return False
        if self.progress is not None:
            self.progress.stop()
        took = f"{self.total:,} rows in {_duration(elapsed)} ({_fmt(rate)} rows/s)"
        self.console.print(f"  {_esc(self.what)}: {took}, cached for the next run")
        return True
