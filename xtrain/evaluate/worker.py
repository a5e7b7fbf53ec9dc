"""``python -m xtrain.evaluate.worker FOLDER``: one process of ``xtrain eval``, started on every
planned process by xtrain's launcher (``launch.launcher.launch``: in the command's own process for
one process on the CPU or the first GPU; spawned workers on Windows; accelerate's launcher
elsewhere). It reads the ``Job`` in FOLDER, joins the launch's group (``processes.joined``) and
scores each model in turn; rank 0 writes each model's lm-eval results into FOLDER and says on
stderr which model it scores. A mistake is one line (rank 0's), reported to the launcher
(``runtime.report``) with its exit code."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from xtrain.errors import XtrainError
from xtrain.evaluate import processes
from xtrain.evaluate.scoring import META, Job, manager_for, result_file, score
from xtrain.planning.context import LaunchContext
from xtrain.runtime import lifetime, report

MODULE = "xtrain.evaluate.worker"


def run_job(folder: Path, context: LaunchContext) -> None:
    """Every model of the job in ``folder`` scored in this process's share; rank 0 writes them."""
    import json
    import threading

    from tqdm import tqdm

    from xtrain.runtime.quiet import quiet_libraries

    quiet_libraries()  # bitsandbytes' and transformers' notes, as in training
    # lm-eval's bars: a lock of this process (tqdm's default, a multiprocessing lock, is a
    # semaphore a rank ending at once leaves to the resource tracker's "leaked" warning)
    tqdm.set_lock(threading.RLock())
    job = Job.read(folder)
    manager = manager_for(job.benchmarks)
    with processes.joined(context, context.sent_plan) as device:
        if context.is_main:
            (folder / META).write_text(json.dumps({"processes": context.world_size}), encoding="utf-8")
        for i, model in enumerate(job.models):
            started = time.perf_counter()
            if context.is_main:
                say(f"scoring {model.label} ({model.what}) on {job.benchmarks.shown}")
            found = score(model, job.benchmarks, job.options, device, manager, context.is_main)
            if context.is_main and found is not None:
                result_file(folder, i).write_text(json.dumps(found), encoding="utf-8")
                say(f"{model.label}: {time.perf_counter() - started:.0f} s")


def say(line: str) -> None:
    sys.stderr.write(f"xtrain eval: {line}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        context = LaunchContext.from_env()
    except XtrainError as e:
        sys.stderr.write(f"error: {e.one_line()}\n")
        return e.exit_code
    lifetime.watch_parent(context)  # a killed launcher takes this worker with it
    try:
        if len(args) != 1 or not Path(args[0]).is_dir():
            raise XtrainError(f"usage: python -m {MODULE} FOLDER (a job folder xtrain eval wrote)")
        run_job(Path(args[0]), context)
    except XtrainError as e:
        if context.is_main:
            sys.stderr.write(f"error: {e.one_line()}\n")
            sys.stderr.flush()
        report.record(e, context.rank, context.is_main)
        return e.exit_code
    return 0


if __name__ == "__main__":
    code = main()
    if LaunchContext.from_env().distributed:
        lifetime.end_rank(code)
    sys.exit(code)
