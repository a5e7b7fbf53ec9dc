"""A GGUF file scored in llama.cpp itself: the export's cost in points.

PyPI's ``xllamacpp`` runs llama.cpp's own server in-process, and it listens on HTTP
(``Server.listening_address``, 127.0.0.1, a port the OS picks), so lm-eval's OpenAI-style models
call it as they would call any llama.cpp server: ``local-completions`` (``/v1/completions``, the
prompt as text, tokenized by llama.cpp) or, for a chat result, ``local-chat-completions``
(``/v1/chat/completions``: the messages rendered by the GGUF's own chat template in llama.cpp's
Jinja engine). No client of our own stands between lm-eval and llama.cpp.

Generation tasks only (``generate_until``: exact match, gsm8k, ifeval): llama.cpp's server
returns the log-probabilities of the tokens it generates, not of the prompt (it has no OpenAI
``echo``), so a multiple-choice task's loglikelihood cannot be read from it; such a task is refused
in one line before anything loads. llama.cpp serves one process: with several processes rank 0
scores the file while the others wait for the next model.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.evaluate import harness
from xtrain.evaluate.models import GGUF, Scored

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

    from xtrain.evaluate.benchmarks import Benchmarks
    from xtrain.evaluate.harness import Options

PACKAGE = "xllamacpp"
INSTALL = 'pip install "xllamacpp>=2026.10" (Linux x86_64 and Windows wheels; the export extra)'
MAGIC = b"GGUF"
MAX_CONTEXT = 4096  # tokens llama.cpp keeps per request: a benchmark prompt and its answer
GENERATION = "generate_until"


def _metadata(path: Path) -> dict[str, Any]:
    """The GGUF's context length and chat template (gguf's reader: memory-mapped, no weights read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    found: dict[str, Any] = {}
    for field in reader.fields.values():
        if field.name.endswith(".context_length") and field.data:
            found["context"] = int(field.parts[field.data[0]][0])
        elif field.name == "tokenizer.chat_template" and field.data:
            found["template"] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return found


def scored(path: Path, chat: bool | None) -> Scored:
    """A ``.gguf`` file as a column (one line for a file that is none, or without llama.cpp);
    ``chat``: through its chat template (default: when it carries one)."""
    from importlib import util

    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise XtrainError(
                f"{path} is a file but no GGUF model",
                "pass a run's output_dir, a model folder, a hub id or a .gguf file",
            )
    if util.find_spec(PACKAGE) is None:
        raise XtrainError(f"scoring {path.name} needs llama.cpp (xllamacpp), which is not installed", INSTALL)
    found = _metadata(path)
    templated = bool(found.get("template"))
    if chat and not templated:
        raise XtrainError(
            f"{path} carries no chat template: it cannot be prompted through one, as asked or as the "
            "other results are",
            "--no-chat-template scores every column on the plain prompts",
        )
    on = templated if chat is None else chat
    return Scored(path.stem, str(path.resolve()), chat=on, what="GGUF in llama.cpp", kind=GGUF)


def llama_server(path: Path, context: int, threads: int | None = None, prefill: bool = False) -> Any:
    """llama.cpp's own server on the GGUF file (``xllamacpp.Server``, in this process, listening on
    127.0.0.1): the file's own chat template in llama.cpp's Jinja engine, one request at a time, its
    log off. ``prefill``: an assistant turn that ends a request is continued (llama.cpp's default)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = context
    params.use_jinja = True
    params.warmup = False
    params.verbosity = -1
    params.prefill_assistant = prefill
    params.n_parallel = 1
    params.cpuparams.n_threads = threads or max(1, min(8, (os.cpu_count() or 2) // 2))
    return xllamacpp.Server(params)


def check_tasks(bench: Benchmarks, manager: TaskManager) -> None:
    """Every task a generation task (see the module's docstring), else one line naming one that is not."""
    built = manager.load(list(bench.specs))["tasks"]
    for name, task in built.items():
        kind = getattr(task, "OUTPUT_TYPE", None)
        if kind != GENERATION:
            raise XtrainError(
                f"task {name} is {kind}: llama.cpp's server gives no log-probabilities of a prompt, so a "
                "GGUF file is scored on generation tasks only",
                "score the GGUF on generate_until tasks (exact match, gsm8k, ifeval), or leave it out",
            )


def score(
    model: Scored, bench: Benchmarks, options: Options, manager: TaskManager, main: bool = True
) -> dict[str, Any] | None:
    """lm-eval's results of the GGUF on ``bench`` through llama.cpp's server, on the main process
    (None elsewhere: llama.cpp serves one process)."""
    if not main:
        return None
    path = Path(model.pretrained)
    context = min(int(_metadata(path).get("context") or MAX_CONTEXT), MAX_CONTEXT)
    server = llama_server(path, context)
    route = "/v1/chat/completions" if model.chat else "/v1/completions"
    args = {
        "base_url": server.listening_address + route, "model": model.label, "tokenizer_backend": None,
        "tokenized_requests": False, "max_length": context, "num_concurrent": 1, "max_retries": 1,
        "timeout": 3600,
    }  # fmt: skip
    name = "local-chat-completions" if model.chat else "local-completions"
    one = dataclasses.replace(options, batch_size=1)  # one prompt a request, as llama.cpp's server takes them
    try:
        return harness.run(name, args, list(bench.specs), manager, one, device=None, chat=model.chat)
    finally:
        del server  # llama.cpp stops with its last reference
