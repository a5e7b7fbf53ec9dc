"""A run's ``eval.benchmarks``: its saved result scored through lm-evaluation-harness at the end of
the run, by the run's own processes (``xtrain.evaluate``: lm-eval's data-parallel mode on the
process group and accelerate state the run already has), after the training's model, optimizer and
data were let go (``Recipe.finish``), so the scoring has the cards to itself.

Why here and not in a launch of its own after the run: it then holds under every launcher (``xtrain
train``, ``accelerate launch``, ``torchrun``, Windows spawn, ``python -m xtrain.run``), needs no
second start of Python and of the group, and the run's ``train_result.json`` carries the scores when
it is written for the last time. The result is scored as ``xtrain eval RUN`` scores it (the same
model arguments, tasks and options: the same numbers), with the run's chat decision (its record's);
``eval.at_start`` adds the model the run started from, scored the same way right before (so a
resumed run has its "before" too, and the two are prompted alike).

The main process keeps what came back: lm-eval's JSON in ``benchmarks/`` (``evaluate.saved``), the
rows in ``TrainResult.benchmarks`` (train_result.json), the curves redrawn with them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.evaluate import saved
from xtrain.evaluate.benchmarks import resolve, split
from xtrain.evaluate.harness import Options, stage_gathers_on_cpu
from xtrain.evaluate.models import Scored, of_start
from xtrain.evaluate.processes import staged
from xtrain.evaluate.scores import Score, change, scores, shown, shown_change
from xtrain.evaluate.scoring import manager_for, score
from xtrain.model.start import RUN_FILE, model_folder, read_json_object, start_of

if TYPE_CHECKING:
    from accelerate import Accelerator

    from xtrain.planning.run import Run
    from xtrain.train.report import Reporter
    from xtrain.train.result import TrainResult

KEY = "eval.benchmarks"
START, END = "start", "end"  # the labels of the run's two scorings (TrainResult.benchmarks)


def scored_models(run: Run) -> list[Scored]:
    """The saved result (and with ``eval.at_start`` the start before it) as lm-eval loads them: the
    result with its record's chat decision and template keywords, the start prompted alike."""
    cfg, out = run.cfg, Path(run.cfg.run.output_dir)
    folder = model_folder(out)
    record = read_json_object(folder / RUN_FILE)
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    kwargs = data.get("chat_template_kwargs") if isinstance(data.get("chat_template_kwargs"), dict) else None
    chat = bool(record.get("chat"))
    end = of_start(start_of(str(folder)), out.name, chat=chat, chat_kwargs=kwargs, saved_in=str(out))
    if not cfg.eval.at_start:
        return [end]
    start = of_start(start_of(cfg.model.name_or_path), START, chat=False).like(end)
    return [start, end]


def at_end(run: Run, accelerator: Accelerator, result: TrainResult, rep: Reporter) -> TrainResult:
    """The benchmarks scored on every process; on the main one kept (``benchmarks/``, the result's
    ``benchmarks``) and said, one note a task and metric. Returns the result with them."""
    e = run.cfg.eval
    bench = resolve(split(e.benchmarks, KEY), KEY)
    manager = manager_for(bench)
    options = Options(e.limit, e.num_fewshot, e.batch_size, "auto")
    device = str(accelerator.device) if accelerator.num_processes > 1 else run.device
    if staged(run.plan, accelerator.num_processes):  # gloo with CUDA tensors: Windows
        stage_gathers_on_cpu()
    main = accelerator.is_main_process
    models = scored_models(run)
    found = []
    for model in models:
        started = time.perf_counter()
        rep.note(f"benchmarks: scoring {model.label} ({model.what}) on {bench.shown}")
        found.append(score(model, bench, options, device, manager, main))
        rep.note(f"benchmarks: {model.label} scored in {time.perf_counter() - started:.0f} s")
    accelerator.wait_for_everyone()
    if not main:
        return result
    rows = [scores(f) for f in found if f is not None]
    end, start = rows[-1], (rows[0] if len(rows) > 1 else None)
    kept = {**options.to_dict(), "processes": accelerator.num_processes}
    reference = (START, start) if start is not None else None
    last = models[-1]
    entry = saved.entry(
        last.label, last.what, list(bench.specs), kept, found[-1], end, reference, result.final_step
    )
    path = saved.write(Path(run.cfg.run.output_dir), entry)
    result.benchmarks = {
        "tasks": list(bench.specs), "step": result.final_step, END: [s.to_dict() for s in end],
        START: None if start is None else [s.to_dict() for s in start], "file": str(path),
    }  # fmt: skip
    for line in lines(end, start):
        rep.note(line)
    return result


def lines(end: list[Score], start: list[Score] | None) -> list[str]:
    """One line a task and metric: the result's score and, with a start, the change."""
    before = {s.key: s for s in start or []}
    out = []
    for s in end:
        was = before.get(s.key)
        tail = f" (start {shown(was)}, {shown_change(change(s, was))})" if was is not None else ""
        out.append(f"benchmark {s.task} {s.name}: {shown(s)}{tail}")
    return out
