"""The report's sample answers: the same eval inputs answered before training (the evaluation at
step 0) and after (the last one), beside their reference, from the run's ``eval_samples.json``;
GRPO's episodes with each tool call, its result and the rewards; the quickstart's answers to its
eval prompts by the model it started from and the adapter (``answers.json``). Several runs
evaluated on the same inputs (a chain's stages) answer side by side in one table. The step-0
answers are named for the model that gave them: the base model, or the chain's stage the run
started from (``start: sft (step 0)``), never "base model" for a stage's start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xtrain.report.html import Raw, join, note, section, table, tag, value
from xtrain.report.runs import RunView, same_folder
from xtrain.trained import OUTPUT_FOLDERS

BASE = "base model"

SHOWN = 8  # samples shown per table


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _sample(found: dict[str, Any]) -> dict[str, Any]:
    """A sample as the run saved it (``Prediction`` as a dict), its parts of the expected types
    only (a file edited by hand shows what it still holds)."""
    labels = found.get("labels")
    given = found.get("details")
    details: dict[str, Any] = {}
    if isinstance(given, dict):
        if _number(given.get("reward")):
            details["reward"] = given["reward"]
        rewards = given.get("rewards")
        details["rewards"] = (
            {str(k): v for k, v in rewards.items() if _number(v)} if isinstance(rewards, dict) else {}
        )
        if isinstance(given.get("calls"), list):  # an episode: its calls, then its answer
            details["calls"] = [c for c in given["calls"] if isinstance(c, dict)]
            details["answer"] = str(given.get("answer", ""))
    return {
        "reference": str(found.get("reference", "")),
        "prediction": str(found.get("prediction", "")),
        "labels": [str(x) for x in labels] if isinstance(labels, list) and len(labels) == 2 else None,
        "details": details if "reward" in details or "calls" in details else {},
    }


def _samples(evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    found = evaluation.get("samples")
    return [_sample(s) for s in found if isinstance(s, dict)][:SHOWN] if isinstance(found, list) else []


def _ends(run: RunView) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(its evaluation at step 0, its last) among its saved samples."""
    found = [e for e in run.samples if _samples(e)]
    if not found:
        return None, None
    first = found[0] if found[0].get("step") == 0 else None
    last = found[-1] if found[-1] is not first else None
    return first, last


def started_from(run: RunView, runs: list[RunView]) -> str:
    """What answered at its step 0: the base model, or the result it started from (the last entry
    of its lineage), named as the report names that run where it is on the page, else by its
    folder: ``start: sft``."""
    if not run.lineage:
        return BASE
    entry = run.lineage[-1]
    source = str(entry.get("source") or "")
    shown = next((r.name for r in runs if r is not run and source and same_folder(source, r.folder)), None)
    folder = Path(source)
    folder = folder.parent if folder.name in OUTPUT_FOLDERS else folder  # its run, not its adapter/
    return f"start: {shown or folder.name or entry.get('task') or 'a trained result'}"


def _labels(sample: dict[str, Any]) -> tuple[str, str]:
    labels = sample["labels"] or ("reference", "prediction")
    return labels[0], labels[1]


def _answer(sample: dict[str, Any] | None) -> Raw:
    """A sample's answer: GRPO's completion with its reward (and an episode's calls), else the text."""
    if sample is None:
        return Raw("-")
    details = sample["details"]
    if not details:
        return tag("span", sample.get("prediction", ""))
    text = (
        details.get("answer")
        if "calls" in details
        else str(sample.get("prediction", "")).rsplit("  [reward", 1)[0]
    )
    parts: list[Any] = []
    for call in details.get("calls") or []:
        args = call.get("arguments")
        args = json.dumps(args, ensure_ascii=False) if isinstance(args, (dict, list)) else args
        result = call.get("result")
        ran = f" -> {result}" if result is not None else " (not run)"
        parts.append(tag("div", join([tag("code", f"{call.get('name', '?')} {args}"), ran]), class_="call"))
    parts.append(tag("div", text))
    per_fn = details["rewards"]
    shown = ", ".join(f"{k} {value(v, 2)}" for k, v in per_fn.items())
    parts.append(
        tag(
            "div",
            f"reward {value(details.get('reward'), 2)}" + (f" ({shown})" if shown else ""),
            class_="reward",
        )
    )
    return join(parts)


def _one(run: RunView, runs: list[RunView]) -> list[Any]:
    first, last = _ends(run)
    if last is None and first is None:
        return []
    base, trained = _samples(first or {}), _samples(last or {})
    inputs, answers = _labels((trained or base)[0])
    head = [
        inputs,
        f"{started_from(run, runs)} (step 0)" if first else None,
        f"trained (step {last['step']})" if last else None,
    ]
    rows = []
    for i in range(max(len(base), len(trained))):
        b = base[i] if i < len(base) else None
        t = trained[i] if i < len(trained) else None
        row = [(t or b or {}).get("reference", "")]
        row += [_answer(b)] if first else []
        row += [_answer(t)] if last else []
        rows.append(row)
    what = f"{answers}s of its evaluations"
    return [
        tag("p", f"{run.name}: {what}"),
        table([h for h in head if h is not None], rows, class_="samples"),
    ]


def _answers(run: RunView) -> list[Any]:
    """The quickstart's before/after answers (its own comparison over the eval prompts)."""
    found = run.answers or {}
    given = found.get("rows")
    rows = [r for r in given if isinstance(r, dict)][:SHOWN] if isinstance(given, list) else []
    if not rows:
        return []
    start = found.get("start") if isinstance(found.get("start"), str) else BASE  # (older files: none)
    head = ["prompt", start, "trained", "reference"]
    table_rows = [
        [r.get("prompt", ""), r.get("base", ""), r.get("trained", ""), r.get("reference", "-")] for r in rows
    ]
    metrics = found.get("metrics") if isinstance(found.get("metrics"), dict) else {}
    lines = [
        f"{k.replace('_', ' ')}: {value(v.get('base'), 2)} -> {value(v.get('trained'), 2)} "
        f"({start} -> trained)"
        for k, v in metrics.items()
        if isinstance(v, dict)
    ]
    return [
        tag("p", f"{run.name}: its eval prompts answered greedily"),
        table(head, table_rows, class_="samples"),
        *(tag("p", line) for line in lines),
    ]


def _side_by_side(runs: list[RunView]) -> list[Any] | None:
    """One table when every run's last evaluation answered the same inputs (a chain's stages):
    the first run's step-0 answers, then each run's last."""
    lasts = [_ends(r)[1] for r in runs]
    if len(runs) < 2 or any(last is None for last in lasts):
        return None
    samples = [_samples(last or {}) for last in lasts]
    refs = [[s.get("reference") for s in found] for found in samples]
    if any(r != refs[0] for r in refs[1:]):
        return None
    first = _ends(runs[0])[0]
    base = _samples(first) if first else []
    inputs, _ = _labels(samples[0][0])
    started = f"{started_from(runs[0], runs)} (step 0)"
    head = [inputs, *([started] if base else []), *(f"{r.name} (step {r.steps})" for r in runs)]
    rows = []
    for i, ref in enumerate(refs[0]):
        row = [ref, *([_answer(base[i] if i < len(base) else None)] if base else [])]
        rows.append(row + [_answer(found[i]) for found in samples])
    return [
        tag("p", "The runs answered the same eval inputs: side by side."),
        table(head, rows, class_="samples"),
    ]


def samples(runs: list[RunView]) -> Raw:
    """Sample answers before and after, per run or side by side."""
    parts: list[Any] = _side_by_side(runs) or [p for r in runs for p in _one(r, runs)]
    parts += [p for r in runs for p in _answers(r)]
    if not parts:
        parts.append(
            note(
                "No sample answers were saved: this task's evaluation does not generate "
                "(`xtrain predict RUN --data FILE` answers a data file's prompts with the trained result)."
            )
        )
    return section("samples", "Sample answers", *parts)
