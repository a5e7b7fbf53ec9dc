"""Export: a finished run as GGUF files (each type chosen) or an Ollama model, through the
pipeline ``xtrain export`` runs, in a process of its own that outlives the page (``jobs.py``),
with the llama.cpp check's table when it ends: each file's cost against the merged model and the
run's eval prompts answered by the merged model and by each file.

An export lives in the run's ``exports/`` folder: ``NAME/`` (what the pipeline writes: the GGUF,
the Modelfile, the merged model), ``NAME.job.json`` (the process started, when), ``NAME.log`` and
``NAME.json`` (the answer). Where it stands is read from those files, as a run's status is.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.export.gguf import TYPES
from xtrain.model.start import read_json_object
from xtrain.studio.launching import detached
from xtrain.studio.runs import Launch, last_error, status

EXPORTS = "exports"


def start(run: Path, types: list[str], ollama: bool) -> str:
    """The export started, detached; returns its name."""
    if status(run).state != "finished":
        raise XtrainError(f"{run.name} has no result yet", "export it once it has finished")
    chosen = [t for t in dict.fromkeys(types) if t]
    unknown = [t for t in chosen if t not in TYPES]
    if not chosen or unknown:
        raise XtrainError(f"GGUF types {', '.join(unknown) or '(none)'}", f"choose among {', '.join(TYPES)}")
    if ollama and len(chosen) > 1:
        raise XtrainError("an Ollama model takes one GGUF type", "choose one type for Ollama")
    folder = run / EXPORTS
    folder.mkdir(exist_ok=True)
    name = ("ollama-" if ollama else "gguf-") + "-".join(chosen) + time.strftime("-%Y%m%d-%H%M%S")
    argv = [sys.executable, "-m", "xtrain.studio.jobs", "export", str(run), str(folder / name)]
    argv += [
        str(folder / f"{name}.json"),
        *(f"--type={t}" for t in chosen),
        *(["--ollama"] if ollama else []),
    ]
    began = time.time()
    pid = detached(argv, folder / f"{name}.log", run)
    atomic.write_text(folder / f"{name}.job.json", Launch(pid, began, argv, ["."], f"{name}.log").to_json())
    return name


def exports(run: Path) -> list[dict[str, Any]]:
    """The run's exports, newest first: each one's state and, once it ended, its answer."""
    found = []
    for job in sorted((run / EXPORTS).glob("*.job.json"), reverse=True):
        name = job.name.removesuffix(".job.json")
        record = Launch.read_file(job)
        answer = read_json_object(run / EXPORTS / f"{name}.json")
        if answer:
            state = "done" if answer.get("ok") else "failed"
        elif record is not None and record.alive():
            state = "running"
        else:
            state = "failed"
            answer = {"error": last_error(run / EXPORTS / f"{name}.log")}
        found.append({"name": name, "state": state, "answer": answer, "log": f"{EXPORTS}/{name}.log"})
    return found
