"""The loop's rates as ``xtrain bench`` reads them: logging windows from ``train_result.json``,
the steady state after the first window, one run's figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Window:
    """One logging window of the loop: optimizer steps ``(first, last]``, its rates."""

    last_step: int
    steps: int
    samples_per_s: float
    tokens_per_s: float
    wall_time: float = 0.0  # when the loop logged it (time.time() of the logging process)


def steady_rates(windows: list[Window], global_batch: int, skip: int = 1) -> tuple[float, float, int]:
    """(samples/s, tokens/s, steps measured) over the windows after the first ``skip``: total
    samples (tokens) over total time, each window's time being its samples / its rate."""
    use = [w for w in windows[skip:] if w.samples_per_s > 0]
    if not use:
        return 0.0, 0.0, 0
    seconds = sum(w.steps * global_batch / w.samples_per_s for w in use)
    samples = sum(w.steps * global_batch for w in use)
    tokens = sum(w.tokens_per_s * w.steps * global_batch / w.samples_per_s for w in use)
    return samples / seconds, tokens / seconds, sum(w.steps for w in use)


def read_windows(output_dir: Path) -> list[Window]:
    """The loop's logging windows, as it recorded them in ``train_result.json`` (empty when
    there is none)."""
    path = output_dir / "train_result.json"
    if not path.is_file():
        return []
    recorded = json.loads(path.read_text(encoding="utf-8")).get("windows") or []
    return [
        Window(
            int(w["step"]),
            int(w["steps"]),
            w["samples"] / w["seconds"] if w["seconds"] > 0 else 0.0,
            w["tokens"] / w["seconds"] if w["seconds"] > 0 else 0.0,
            float(w["time"]),
        )
        for w in recorded
    ]


# -- results --------------------------------------------------------------------------------------------
@dataclass
class RunFigures:
    """One training run of the bench."""

    processes: int
    samples_per_s: float  # steady state (windows after the first)
    tokens_per_s: float
    steps: int
    measured_steps: int
    global_batch: int
    accumulation: int
    rate_source: str  # "windows" (steady state) | "session" (the loop's whole-session rate)
    session_samples_per_s: float  # the loop's own figure over every optimizer step
    session_tokens_per_s: float
    wall_s: float  # the whole run: start-up, training, final save
    backend: str | None = None
    mfu: float | None = None


def figures(result: dict[str, Any], processes: int, steps: int) -> RunFigures:
    """RunFigures from one run's train_result (+ windows): steady rates when there are at least
    two windows, else the whole-session rates."""
    gb = int(result["global_batch"])
    windows: list[Window] = result.get("windows") or []
    samples, tokens, measured = steady_rates(windows, gb) if len(windows) >= 2 else (0.0, 0.0, 0)
    source = "windows"
    if measured == 0:
        samples, tokens, measured, source = result["samples_per_s"], result["tokens_per_s"], steps, "session"
    return RunFigures(
        processes=processes,
        samples_per_s=samples,
        tokens_per_s=tokens,
        steps=steps,
        measured_steps=measured,
        global_batch=gb,
        accumulation=int(result["accumulation"]),
        rate_source=source,
        session_samples_per_s=float(result["samples_per_s"]),
        session_tokens_per_s=float(result["tokens_per_s"]),
        wall_s=float(result.get("wall_s", 0.0)),
        backend=(result.get("run_info") or {}).get("backend"),
    )
