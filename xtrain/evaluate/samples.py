"""What each model answered, row by row (``xtrain eval --samples DIR``): lm-eval's logged samples
(``simple_evaluate(log_samples=True)``) as rows of the shape ``xtrain predict --data`` writes
(``input``, ``output``, ``reference``, and the row's metrics), one JSON-lines file a model, so a
base and its results can be read side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from xtrain import atomic

KEY = "samples"  # where lm-eval keeps them in its results


def take(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """lm-eval's samples, removed from ``results`` (the rest stays small: the table, the saved
    JSON); ``{}`` when it logged none."""
    found = results.pop(KEY, None)
    return found if isinstance(found, dict) else {}


def _output(sample: dict[str, Any]) -> Any:
    """The model's answer: the generated text (generate_until), or the choice it scored highest
    (loglikelihood: each request one choice, its filtered response ``[log-likelihood, greedy]``)."""
    responses = sample.get("filtered_resps") or []
    arguments = sample.get("arguments") or []
    if len(responses) == 1 and isinstance(responses[0], str):
        return responses[0]
    scored = [r[0] if isinstance(r, list) and r else r for r in responses]
    if len(scored) == len(arguments) > 0 and all(isinstance(s, (int, float)) for s in scored):
        best = max(range(len(scored)), key=lambda i: scored[i])
        args = arguments[best]
        return args[1] if isinstance(args, list) and len(args) > 1 else best
    return responses


def _input(sample: dict[str, Any]) -> Any:
    """The prompt the model saw (the first request's context, chat template and few-shot applied)."""
    arguments = sample.get("arguments") or []
    first = arguments[0] if arguments else None
    return first[0] if isinstance(first, list) and first else first


def rows(samples: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every task's samples as rows: task, doc_id, input, output, reference, and each metric."""
    out = []
    for task, found in samples.items():
        for sample in found:
            metrics = {m: sample.get(m) for m in sample.get("metrics") or []}
            row = {"task": task, "doc_id": sample.get("doc_id"), "input": _input(sample)}
            out.append({**row, "output": _output(sample), "reference": sample.get("target"), **metrics})
    return out


def write(folder: Path, label: str, found: list[dict[str, Any]]) -> Path:
    """``found`` as ``folder/<label>.jsonl`` (the label made a safe file name)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:80] or "model"
    text = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in found)
    return atomic.write_text(folder / f"{name}.jsonl", text)
