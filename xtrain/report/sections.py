"""The report's sections of facts, one function each (the curves are ``page.py``'s, the samples
``samples.py``'s): the chain a run continues, how it ran (its plan), its data check, its
evaluations before and after, its benchmark scores. Several runs are columns side by side.
Everything from a run is escaped (``html.py``)."""

from __future__ import annotations

from typing import Any

from xtrain.evaluate import saved
from xtrain.evaluate.scores import Score, change, shown, shown_change
from xtrain.evaluate.scores import table as score_table
from xtrain.planning.batch import batch_line
from xtrain.report.html import Raw, join, note, section, table, tag, value
from xtrain.report.runs import RunView
from xtrain.report.svg import number
from xtrain.tasks.data_report import DataReport

CHAINED = "These runs are the stages of one chain, in order: their curves follow each other."
NO_EVAL = "No evaluation: no eval data (data.eval), or none yet."
LINEAGE_HEAD = ["stage", "task", "mode", "from", "adapter sha256"]


def lineage(runs: list[RunView], chained: bool) -> Raw:
    """Where each run started: a chain's stages, oldest first (``xtrain_run.json``'s lineage)."""
    parts: list[Any] = [note(CHAINED)] if chained else []
    for run in runs:
        if not run.lineage:
            said = join([tag("b", run.name), ": trained from its base model ", tag("code", run.model)])
            parts.append(tag("p", said))
            continue
        keys = ("task", "mode", "source")
        rows = [
            [i + 1, *(e.get(k, "-") for k in keys), str(e.get("adapter_sha256", "-"))[:16]]
            for i, e in enumerate(run.lineage)
        ]
        rows.append([len(rows) + 1, run.task, "this run", str(run.folder), "-"])
        base = run.record.get("base") or next((e["base"] for e in run.lineage if e.get("base")), None)
        head = join([tag("b", run.name), f": stage {len(rows)} of a chain", f" on {base}" if base else ""])
        parts += [tag("p", head), table(LINEAGE_HEAD, rows)]
    return section("lineage", "Lineage", *parts)


def _sequence(run: RunView) -> int:
    """parallel.sequence as the run ran it (its run_info; 1: off)."""
    return int((run.result.get("run_info") or {}).get("sequence_parallel") or 1)


def _batch(run: RunView) -> str:
    world, acc = int(run.figure("world_size", 1)), int(run.figure("accumulation", 1))
    batch, split = int(run.figure("global_batch")), _sequence(run)
    per_device = int(run.figure("per_device")) or batch // max(1, world // split * acc)
    return batch_line(batch, per_device, world, acc, split).removeprefix("global batch ")


def _method(run: RunView) -> str:
    """LoRA's settings and the layers it adapted (what ``auto`` picked, as the run recorded them:
    ``run_info.lora_targets``), or a full fine-tune."""
    if not run.setting("lora", "enabled", True):
        return "full fine-tune"
    targets = run.setting("lora", "target_modules")
    shown = ", ".join(map(str, targets)) if isinstance(targets, list) else targets
    info = run.result.get("run_info") or {}
    adapted, layers = info.get("lora_targets"), info.get("lora_layers")
    if isinstance(adapted, list) and adapted and isinstance(layers, int):  # (older runs: not recorded)
        picked = f"{', '.join(map(str, adapted))} ({layers} layer{'s' * (layers != 1)})"
        shown = f"{picked}, lora.target_modules={shown}" if shown else picked
    r, alpha = run.setting("lora", "r", "?"), run.setting("lora", "alpha", "?")
    return f"LoRA r={r}, alpha={alpha}" + (f" on {shown}" if shown else "")


def _steps(run: RunView) -> str:
    total = int(run.figure("total_steps"))
    if not run.finished:
        return f"{run.steps} of {total} (not finished: its newest checkpoint)"
    early = run.result.get("stopped_early")
    return f"{run.steps} of {total}" + (f" ({early.get('reason')})" if isinstance(early, dict) else "")


def _optimizer(run: RunView) -> str:
    lr, schedule = run.setting("optim", "lr"), run.setting("optim", "schedule")
    warmup = run.setting("optim", "warmup_steps") or 0
    rate = number(lr) if isinstance(lr, (int, float)) else "?"
    return f"lr {rate}, {schedule or '?'} schedule, {warmup} warmup steps"


def _machine(run: RunView) -> str:
    info = run.result.get("run_info") or {}
    if not info:
        return "- (in train_result.json at its end)"
    world = int(run.figure("world_size", 1))
    backend = f" over {info['backend']}" if info.get("backend") else ""
    processes = f"{world} process{'es' * (world != 1)}{backend}"
    split = _sequence(run)
    if split > 1:  # parallel.sequence: how each sequence was split (docs/long-context.md)
        mode, inner = info.get("sequence_mode", "?"), info.get("sequence_attention", "?")
        processes += f", each sequence split across {split} ({mode} attention around {inner})"
    return f"{info.get('device', '?')} on {info.get('plan_os', '?')}, {processes}"


def _precision(run: RunView) -> str:
    found = (run.result.get("run_info") or {}).get("precision")
    return "fp32 (no mixed precision)" if found == "no" else str(found or "-")


def _memory(run: RunView) -> str:
    info = run.result.get("run_info") or {}
    peak, estimate = info.get("peak_mem_mib"), info.get("memory_estimate_gib")
    if not isinstance(peak, (int, float)):
        return "- (measured on CUDA)"
    return f"{peak:.0f} MiB peak" + (f", {estimate:.2f} GiB estimated" if isinstance(estimate, float) else "")


def _data(run: RunView) -> str:
    train, evals = run.setting("data", "train"), run.setting("data", "eval")
    length = run.setting("data", "max_length", "?")
    return f"train {train or '?'}" + (f", eval {evals}" if evals else "") + f", max_length {length}"


def _throughput(run: RunView) -> str:
    if not run.finished:
        return "-"
    return f"{run.figure('samples_per_s'):.1f} samples/s, {run.figure('tokens_per_s'):.0f} tokens/s"


def _outputs(run: RunView) -> Raw:
    found = run.result.get("outputs") or {}
    shown = [tag("div", join([tag("b", k), " ", tag("code", v)])) for k, v in sorted(found.items())]
    return join(shown) if shown else Raw("-")


PLAN_ROWS = (
    ("task", lambda r: r.task),
    ("model", lambda r: r.model),
    ("method", _method),
    ("machine", _machine),
    ("precision", _precision),
    ("batch", _batch),
    ("optimizer", _optimizer),
    ("steps", _steps),
    ("data", _data),
    ("throughput", _throughput),
    ("memory", _memory),
    ("resumed from", lambda r: r.result.get("resumed_from") or "-"),
    ("fp16 updates dropped", lambda r: int(r.figure("skipped_steps"))),
    ("outputs", _outputs),
)


def plan(runs: list[RunView]) -> Raw:
    """How each run ran: machine, precision, the batch split, its settings and outputs."""
    rows = [[what, *(get(r) for r in runs)] for what, get in PLAN_ROWS]
    return section("plan", "Plan", table(["", *(r.name for r in runs)], rows, class_="plan"))


def _example(report: DataReport) -> Raw:
    """The example as the model gets it, its trained tokens marked."""
    ex = report.example
    if ex is None:
        return Raw("")
    shown = []
    for p in ex.pieces:
        shown.append(tag("mark", p.text) if p.trained else p.text)
        if p.more:  # a special token the model gets many times over (an image's patches)
            shown.append(tag("span", f"[... {p.more} more ...]", class_="dim"))
    head = f"Example, {ex.where()}: {ex.tokens} tokens, {ex.trained} with loss (marked)"
    parts = [tag("p", head), *(tag("p", line, class_="dim") for line in ex.inputs)]
    parts.append(tag("pre", join(shown), class_="example"))
    if ex.label is not None:
        parts.append(tag("p", join(["label: ", tag("mark", ex.label)])))
    return join(parts)


def _check(run: RunView) -> list[Any]:
    if run.data_check is None:
        return [note("No data check was saved with this run (a custom task, or a run older than reports).")]
    try:
        report = DataReport.from_dict(run.data_check)
    except (TypeError, ValueError, AttributeError) as e:
        return [note(f"its data_check.json could not be read ({e})")]
    return data_report(report)


def data_report(report: DataReport) -> list[Raw]:
    """A data check (a run's, or the studio's dry run): its sources, the notes, one example with
    its trained tokens marked."""
    rows = [
        [s.role, s.source, s.rows(), s.row_format or "-", "; ".join(s.facts(report.max_length)) or "-"]
        for s in report.sources
    ]
    notes = [tag("p", n, class_="warn" if n.startswith("warning") else "dim") for n in report.notes]
    return [table(["", "source", "rows", "format", "found"], rows), *notes, _example(report)]


def data_check(runs: list[RunView]) -> Raw:
    """Each run's data check on the rows it loaded: its sources, their lengths and cuts, the
    notes, one example with its trained tokens marked."""
    return section("data", "Data check", *(p for run in runs for p in [tag("h3", run.name), *_check(run)]))


def before_after(run: RunView) -> tuple[dict[str, Any], dict[str, Any]]:
    """Its evaluation at step 0 (when it ran one) and its last."""
    history = run.history.eval_history
    before = next((h for h in history if h.get("step") == 0), {})
    after = run.result.get("eval_metrics") or (history[-1] if history else {})
    return before, after


def _change(before: Any, after: Any) -> str:
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return f"{after - before:+.4f}"
    return "-"


def _every(run: RunView) -> Raw:
    """Every evaluation of the run, folded."""
    history = run.history.eval_history
    names = list(dict.fromkeys(k for h in history for k in h if k != "step"))
    rows = [[h.get("step"), *(value(h.get(n)) for n in names)] for h in history]
    summary = tag("summary", f"every evaluation of {run.name} ({len(history)})")
    return tag("details", join([summary, table(["step", *names], rows)]))


def evaluation(runs: list[RunView]) -> Raw:
    """The eval metrics before training (an evaluation at step 0) and after, per run; and every
    evaluation in a folded table."""
    pairs = [before_after(r) for r in runs]
    keys = list(dict.fromkeys(k for b, a in pairs for k in (*b, *a) if k != "step"))
    if not keys:  # (no eval data, or a run before its first evaluation)
        return section("evaluation", "Evaluation", note(NO_EVAL))
    if len(runs) == 1:
        ((b, a),) = pairs
        head = ["metric", "before (step 0)", f"after (step {runs[0].steps})", "change"]
        rows = [[k, value(b.get(k)), value(a.get(k)), _change(b.get(k), a.get(k))] for k in keys]
    else:
        head = ["metric", *(f"{r.name}: before -> after" for r in runs)]
        rows = [[k, *(f"{value(b.get(k))} -> {value(a.get(k))}" for b, a in pairs)] for k in keys]
    parts: list[Any] = [table(head, rows, class_="metrics")]
    if not any(b for b, _ in pairs):
        parts.append(note("No evaluation at step 0: run.eval_at_start=true gives the 'before'."))
    return section("evaluation", "Evaluation", *parts, *(_every(r) for r in runs))


NO_BENCHMARKS = (
    "No benchmarks: eval.benchmarks in the config scores the result at the end of a run, "
    "xtrain eval RUN --tasks ... at any time (lm-evaluation-harness)."
)


def benchmark_columns(runs: list[RunView]) -> tuple[list[str], list[list[Score]]]:
    """(labels, scores) of the benchmarks table: the first run's reference (its start, or the base
    ``xtrain eval`` scored beside it) when it has one, then each run's newest score of each task
    and metric (``evaluate.saved``: its ``benchmarks/`` files)."""
    labels: list[str] = []
    columns: list[list[Score]] = []
    for i, run in enumerate(runs):
        scores, reference, label = saved.latest(saved.read_all(run.folder))
        if i == 0 and reference:
            labels.append(f"{label or 'reference'} (before {run.name})")
            columns.append(reference)
        labels.append(run.name)
        columns.append(scores)
    return labels, columns


def benchmarks(runs: list[RunView], chained: bool) -> Raw:
    """Each run's benchmark scores (lm-eval's, with their standard errors) side by side, a chain's
    stages in order, and each one's change against the first column."""
    labels, columns = benchmark_columns(runs)
    if not any(columns):
        return section("benchmarks", "Benchmarks", note(NO_BENCHMARKS))
    head = ["task", "metric", labels[0], *(x for label in labels[1:] for x in (label, "change"))]
    rows = []
    for (task, _, _), found in score_table(columns):
        name = next(s for s in found if s is not None).name
        cells: list[Any] = [task, name, shown(found[0])]
        for s in found[1:]:
            cells += [shown(s), shown_change(change(s, found[0]))]
        rows.append(cells)
    said = "The stages of the chain, in order; " if chained and len(runs) > 1 else ""
    text = f"{said}± the standard error lm-eval reports; change: against {labels[0]}."
    return section("benchmarks", "Benchmarks", table(head, rows, class_="metrics"), note(text))
