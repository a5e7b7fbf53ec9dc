"""One written GGUF file checked and measured, the merged model already freed (one model in memory
at a time):

1. every tensor read back by the ``gguf`` package's reader exactly as written (``parity.written``);
2. the file read back by transformers (``parity.load_gguf``): its logits against the merged
   model's (the cost, ``parity.Cost``), and its answers to the run's eval prompts where llama.cpp
   is not installed;
3. in llama.cpp itself when ``xllamacpp`` is installed (``llamacpp.Runtime``): the chat template
   rendered by llama.cpp's Jinja engine and tokenized by its tokenizer, equal to training's
   rendering and tokens for the probe conversations (with tools, a call and its result where the
   template renders tools); a template llama.cpp cannot run is refused naming the construct; then
   the eval prompts answered. Without it, the template is rendered with Jinja2, and the check says so.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from xtrain.data.rows import chat as chat_data
from xtrain.export import answers, gguf, llamacpp, parity
from xtrain.export.parity import Check, ParityError

if TYPE_CHECKING:
    from pathlib import Path

    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

    from xtrain.data.rows.chat import Render
    from xtrain.export.source import Source

PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PROBE_CALL = {  # an id of 9 letters and digits: Mistral's template wants it
    "id": "call00001",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "paris"}},
}
# (messages, add_generation_prompt): tools offered; a call, its result and the answer after it
TOOL_PROBES = (
    ([{"role": "user", "content": "Weather in Paris?"}], True),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
            {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Thanks"},
        ],
        True,
    ),
)
_DATE = "date_string"  # Llama 3.1's template variable, which llama.cpp sets to today's date
RUNTIME_CONTEXT = 4096  # llama.cpp's context for the checks (the model's own when shorter)


Probe = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool]  # messages, tools, generation


def probes(render: Render, template: str) -> list[Probe]:
    """(messages, tools, add_generation_prompt) the template is checked on: ``parity``'s probes,
    and where it renders tools the ``TOOL_PROBES`` (its system turn dropped where it has none)."""
    from xtrain.data import templates

    out: list[Probe] = [(c, None, True) for c in parity.probe_conversations(render)]
    if not templates.renders_tools(template):
        return out
    system = any(c[0]["role"] == "system" for c, _, _ in out)
    for messages, generation in TOOL_PROBES:
        turns = messages if system else [m for m in messages if m["role"] != "system"]
        out.append((turns, PROBE_TOOLS, generation))
    return out


def _training(render: Render, messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
    with_tools = getattr(render, "with_tools", None)
    return (with_tools(tools) if tools and with_tools else render)(messages, generation)


def template_in_llamacpp(
    llama: llamacpp.Runtime, render: Render, template: str, tokenizer: PreTrainedTokenizerBase,
    add_bos: bool, where: str,
) -> Check:  # fmt: skip
    """The file's template rendered by llama.cpp (with the bos it adds in front, when the file adds
    one) and tokenized by it, against training's rendering and tokens; a ``ParityError`` at the
    first difference, or naming what llama.cpp cannot run."""
    cases = probes(render, template)
    bos = tokenizer.bos_token if add_bos and tokenizer.bos_token else ""
    dated = _DATE in template and hasattr(render, "kwargs")
    if dated:  # llama.cpp gives Llama 3's templates today's date (training: the template's default)
        render = chat_data.renderer(
            render.owner, render.template, render.setting, {**render.kwargs, _DATE: time.strftime("%d %b %Y")}
        )
    for messages, tools, generation in cases:
        expected = _training(render, messages, tools, generation)
        try:
            got = llama.render(messages, tools, generation)
        except llamacpp.Refused as e:
            raise ParityError(
                f"llama.cpp cannot run the chat template in {where}: {llamacpp.unsupported(str(e))}",
                "nothing was written; write that part of data.chat_template with what llama.cpp's Jinja "
                "implements (docs/export.md#llamacpp lists what it lacks), train or export again",
            ) from None
        parity.same_text("template", f"{where} (llama.cpp)", [expected], [bos + got])
        ids = tokenizer(expected, add_special_tokens=False)["input_ids"]
        found = llama.tokenize(got)
        if found != ids:
            pairs = enumerate(zip(ids, found, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(ids), len(found)))
            raise ParityError(
                f"llama.cpp tokenizes the prompt of {where} differently from training at token {at}: "
                f"{found[at : at + 5]} instead of {ids[at : at + 5]}",
                "nothing was written; report it with the model's name: the file's tokenizer is wrong",
            )
    tools = sum(t is not None for _, t, _ in cases)
    with_tools = f", {tools} with tools, a call and its result" if tools else ""
    date = " (llama.cpp writes today's date into the template's date_string)" if dated else ""
    return Check(
        "template",
        f"{where}: {len(cases)} conversations{with_tools} render and tokenize in llama.cpp "
        f"(xllamacpp {llamacpp.version()}) as in training{date}",
    )


def template_in_jinja2(render: Render, stored: str, tokenizer: PreTrainedTokenizerBase, where: str) -> Check:
    """Without llama.cpp: the file's template rendered by Jinja2 (transformers'), as before."""
    again = chat_data.renderer(tokenizer, stored, None, getattr(render, "kwargs", None))
    cases = probes(render, stored)
    expected = [_training(render, m, t, g) for m, t, g in cases]
    got = [_training(again, m, t, g) for m, t, g in cases]
    check = parity.same_text("template", where, expected, got)
    check.detail += f" (Jinja2; llama.cpp itself checks it once xllamacpp is installed: {llamacpp.INSTALL})"
    return check


def check_file(
    path: Path, kind: str, written: list[gguf.Written], src: Source, tokenizer: PreTrainedTokenizerBase,
    render: Render | None, add_bos: bool, reference: list[Tensor], prompt_ids: list[list[int]],
    prompts: answers.Prompts | None, context: int,
) -> tuple[list[Check], parity.Cost]:  # fmt: skip
    """The steps of the module docstring for one file; its answers go into ``prompts.files``."""
    checks = parity.written(written, gguf.read_tensors(path), path.name)
    loaded = parity.load_gguf(path, kind)
    got = parity.logits_float32(loaded, prompt_ids)
    runtime = f"llama.cpp {llamacpp.version()}" if llamacpp.installed() else "transformers' GGUF reader"
    if prompts is not None and not llamacpp.installed():
        with parity.float32_forward(loaded):
            prompts.files[kind] = answers.with_model(loaded, tokenizer, src, prompts)
    del loaded
    gc.collect()
    stored = parity.gguf_template(path) or ""
    if llamacpp.installed():
        with llamacpp.Runtime(path, min(context, RUNTIME_CONTEXT)) as llama:
            if render is not None:
                checks.append(template_in_llamacpp(llama, render, stored, tokenizer, add_bos, path.name))
            if prompts is not None:
                prompts.files[kind] = answers.with_llamacpp(llama, prompts)
    elif render is not None:
        checks.append(template_in_jinja2(render, stored, tokenizer, path.name))
    cost = parity.Cost(kind, parity.difference(reference, got), runtime=runtime)
    if prompts is not None:
        cost.answered, cost.changed = len(prompts.examples), prompts.changed(kind)
    return checks, cost
