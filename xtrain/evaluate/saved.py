"""Benchmark scores kept in a run's folder: ``benchmarks/<time>-<label>.json``, one file per
scoring (``xtrain eval``, or the run's own ``eval.benchmarks`` at its end), each holding lm-eval's
whole results JSON (``lm_eval``) beside the compact rows (``scores``) and the reference they are
compared with (``reference``: the base of ``xtrain eval``, the run's start for ``eval.benchmarks``).
``xtrain report`` reads them back (``latest``: the newest score of each task and metric)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from xtrain import atomic, structured
from xtrain.evaluate.scores import Score, rows_of

FOLDER = "benchmarks"
MARK = "xtrain_benchmarks"  # the key that says a file is one of these (its format's version)


def entry(
    label: str,
    what: str,
    tasks: list[str],
    options: dict[str, Any],
    results: dict[str, Any],
    scores: list[Score],
    reference: tuple[str, list[Score]] | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """One scoring as it is saved: the model (``label``, ``what``), the tasks and options, the rows
    and the reference's, the run's step (in-run scoring), and lm-eval's results as they came."""
    return {
        MARK: 1,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "model": {"label": label, "what": what},
        "step": step,
        "tasks": list(tasks),
        "options": options,
        "scores": [s.to_dict() for s in scores],
        "reference": None
        if reference is None
        else {"label": reference[0], "scores": [s.to_dict() for s in reference[1]]},
        "lm_eval": results,
    }


def write(run: Path, found: dict[str, Any]) -> Path:
    """``found`` into ``run/benchmarks/`` under a new name (earlier scorings are kept)."""
    folder = run / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", str(found["model"]["label"])).strip("-")[:60] or "model"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{stamp}-{label}.json"
    n = 2
    while path.exists():
        path, n = folder / f"{stamp}-{label}-{n}.json", n + 1
    return atomic.write_text(path, json.dumps(found, indent=1, ensure_ascii=False))


def read_all(run: Path) -> list[dict[str, Any]]:
    """The run's scorings, oldest first (a file that is not one of ours is left out)."""
    folder = run / FOLDER
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = structured.load_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get(MARK):
            found.append(data)
    return found


def latest(entries: list[dict[str, Any]]) -> tuple[list[Score], list[Score], str | None]:
    """(the newest score of each task and metric, the newest reference score of each, the newest
    reference's label) over ``entries``, oldest first."""
    scores: dict[tuple[str, str, str], Score] = {}
    reference: dict[tuple[str, str, str], Score] = {}
    label = None
    for found in entries:
        for s in rows_of(found.get("scores")):
            scores[s.key] = s
        ref = found.get("reference")
        if isinstance(ref, dict):
            for s in rows_of(ref.get("scores")):
                reference[s.key] = s
            label = str(ref.get("label")) if ref.get("label") else label
    return list(scores.values()), list(reference.values()), label
