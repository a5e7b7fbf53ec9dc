"""The run's eval prompts answered greedily by the merged model (xtrain's own answers, as ``xtrain
predict --data`` gives them: the run's row readers, its template, ``text_answer``) and by each
GGUF file: by llama.cpp itself when it is installed (``llamacpp.Runtime``: the file's own template
and, for agent rows, llama.cpp's tool-call parser), else by transformers' reading of the file.
What the export shows next to each other, and the prompts whose answer a file changes
(``parity.Cost``). Library code: nothing printed.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin, predict, tasks
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from xtrain.export.llamacpp import Runtime
    from xtrain.export.source import Source
    from xtrain.tasks.contract import Example

ANSWERED = 8  # eval prompts answered by default (``xtrain export --eval-prompts``)
ANSWER_TOKENS = 32  # the longest answer generated (greedy stops at the end of turn first)


@dataclass
class Prompts:
    """The eval prompts the export answers: the rows, what the merged model answered, and each
    file's answers (``--type`` -> answers, in the rows' order)."""

    examples: list[Example]
    chat: bool
    source: str  # the eval file, for the notes
    merged: list[str] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)

    def changed(self, kind: str) -> int:
        return sum(a != b for a, b in zip(self.merged, self.files[kind], strict=True))

    def references(self) -> list[str | None]:
        return [e.reference for e in self.examples]

    def inputs(self) -> list[str]:
        return [str(e.shown.get("input", "")) for e in self.examples]


def eval_file(src: Source) -> Path | None:
    """The run's eval data as a file (a built-in set's eval split), or None where the record names
    none that is a file here (no eval set, a hub id, a folder)."""
    data = src.record.get("data") or {}
    found = data.get("eval")
    found = found[0] if isinstance(found, list) and found else found
    if not isinstance(found, str):
        return None
    if builtin.is_builtin(found):
        return builtin.builtin_data_file(found, "eval")
    path = Path(found).expanduser()
    return path if path.is_file() else None


def eval_prompts(src: Source, count: int) -> tuple[Prompts | None, str | None]:
    """(the first ``count`` prompts of the run's eval data, None) or (None, why there are none)."""
    if count <= 0:
        return None, None
    predicts = tasks.get(src.task).predicts if src.task in tasks.all_tasks() else None
    if src.task is not None and (predicts is None or predicts.file is None):
        # (a task whose rows are not prompts to answer: no xtrain predict --data reader)
        return None, f"no eval prompts answered: a {src.task} run's eval rows are not prompts to answer"
    file = eval_file(src)
    if file is None:
        return None, "no eval prompts answered: the run's record names no eval file on this machine"
    try:
        _, examples = predict.read_examples(src.folder, file)
    except XtrainError as e:
        return None, f"no eval prompts answered: {e.message}"
    return Prompts(examples[:count], src.chat, str(file)), None


def with_model(model: Module, tokenizer: PreTrainedTokenizerBase, src: Source, prompts: Prompts) -> list[str]:
    """Greedy answers of a transformers model (the merged one, or the GGUF file read back), as
    ``xtrain predict --data`` answers: a call shown parsed, else the text."""
    from xtrain.tasks.contract import Loaded, PredictRequest
    from xtrain.tasks.predicting import in_batches
    from xtrain.tasks.prompt_predict import text_answer

    known = tasks.get(src.task).predicts if src.task in tasks.all_tasks() else None
    answer = functools.partial(text_answer, tools=known.tool_use if known is not None else None)
    parts = {"chat": prompts.chat, "data": src.record.get("data") or {}}
    loaded = Loaded(model, tokenizer, str(src.folder), parts)
    request = PredictRequest([], [], max_new_tokens=ANSWER_TOKENS, batch_size=8)
    outputs = in_batches(answer, loaded, prompts.examples, request)
    return [o.get("call") or o["output"] for o in outputs]


def with_llamacpp(llama: Runtime, prompts: Prompts) -> list[str]:
    """Greedy answers of the GGUF file in llama.cpp: a chat run's turns (and an agent row's tools)
    through the file's own template, a call as llama.cpp's parser returns it; a plain run's text
    continued as it is."""
    from xtrain.data.rows.chat import Conversation
    from xtrain.tasks.text import tool_calls

    out = []
    for e in prompts.examples:
        if not prompts.chat:
            out.append(llama.complete(str(e.feed), ANSWER_TOKENS))
            continue
        conv = e.feed if isinstance(e.feed, Conversation) else Conversation(list(e.feed))
        reply = llama.chat(conv.messages, conv.tools, ANSWER_TOKENS)
        readable = all(isinstance(c["arguments"], dict) for c in reply.calls)
        if reply.calls and readable:
            out.append(tool_calls.shown(reply.calls))
        elif reply.calls:  # arguments llama.cpp could not read as JSON: as it returned them
            out.append("; ".join(f"{c['name']} {json.dumps(c['arguments'])}" for c in reply.calls))
        else:
            out.append(reply.content)
    return out


def _clip(text: Any, width: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(prompts: Prompts, shown: int) -> list[list[str]]:
    """The first ``shown`` rows of the answers side by side: prompt, xtrain, each file, reference."""
    from xtrain.tasks.text import tool_calls

    rows = []
    for i in range(min(shown, len(prompts.examples))):
        cells = [prompts.inputs()[i], prompts.merged[i], *(a[i] for a in prompts.files.values())]
        reference = prompts.references()[i]
        if reference and tool_calls.is_reference(reference):  # a call list: shown as the answers are
            reference = tool_calls.shown(json.loads(reference))
        cells.append(reference or "-")
        rows.append([_clip(c) for c in cells])
    return rows
