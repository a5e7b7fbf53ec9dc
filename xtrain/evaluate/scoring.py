"""Models scored on benchmarks in this process (one rank of the launch, or the only process):
``score`` runs one ``Scored`` model through lm-eval (its HF model, a quantized run's base loaded as
training loaded it; a GGUF file through llama.cpp's server), ``Job`` is what ``xtrain eval`` sends
every process (the models in order, the benchmarks, the options), written as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.evaluate import harness
from xtrain.evaluate.benchmarks import Benchmarks
from xtrain.evaluate.harness import Options
from xtrain.evaluate.models import GGUF, Scored

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

JOB = "job.json"
META = "processes.json"  # rank 0: {"processes": the world size lm-eval scored in}


@dataclass(frozen=True)
class Job:
    """The models to score, in order, on ``benchmarks`` with ``options``."""

    models: tuple[Scored, ...]
    benchmarks: Benchmarks
    options: Options

    def write(self, folder: Path) -> Path:
        path = folder / JOB
        data = {
            "models": [m.to_dict() for m in self.models],
            "benchmarks": self.benchmarks.to_dict(),
            "options": self.options.to_dict(),
        }
        path.write_text(json.dumps(data), encoding="utf-8")
        return path

    @classmethod
    def read(cls, folder: Path) -> Job:
        data = json.loads((folder / JOB).read_text(encoding="utf-8"))
        models = tuple(Scored.from_dict(m) for m in data["models"])
        return cls(models, Benchmarks.from_dict(data["benchmarks"]), Options.from_dict(data["options"]))


def result_file(folder: Path, index: int) -> Path:
    """Where rank 0 writes the ``index``-th model's results (lm-eval's JSON)."""
    return folder / f"results-{index}.json"


_MANAGERS: dict[tuple[tuple[str, ...], bool], TaskManager] = {}


def manager_for(bench: Benchmarks) -> TaskManager:
    """lm-eval's task index for ``bench``, made once per process (``xtrain eval``'s checks and
    its worker in the same process share it: reading lm-eval's own tasks takes seconds)."""
    key = (bench.include, bench.defaults)
    if key not in _MANAGERS:
        _MANAGERS[key] = harness.task_manager(list(bench.include), bench.defaults)
    return _MANAGERS[key]


def score(
    model: Scored, bench: Benchmarks, options: Options, device: str, manager: TaskManager, main: bool = True
) -> dict[str, Any] | None:
    """lm-eval's results of ``model`` on ``bench`` (the ``main`` process; None on the others)."""
    if model.kind == GGUF:
        from xtrain.evaluate import gguf

        return gguf.score(model, bench, options, manager, main)
    args = model.model_args(options.dtype)
    if model.quantization is not None:
        import torch

        from xtrain.model import quantization

        found = quantization.predict_kwargs(model.quantization, torch.device(device))
        if "quantization_config" in found:
            args["quantization_config"] = found["quantization_config"]
    return harness.run("hf", args, list(bench.specs), manager, options, device=device, chat=model.chat)
