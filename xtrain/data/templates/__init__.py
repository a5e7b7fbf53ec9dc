"""Chat templates shipped with xtrain, named by ``data.chat_template`` (as LLaMA-Factory's
``template``): each one the model family's own Jinja text, as its public ``tokenizer_config.json``
carries it (tools, tool calls, tool results and reasoning where the family has them), so a base
model without a template, or a tokenizer whose template is not the one to train, renders the
turns its family's chat models were trained on.

- ``chatml``: plain ChatML (``<|im_start|>role ... <|im_end|>``), the generic form (transformers'
  former default), no tools;
- ``qwen2.5``: Qwen2.5-7B-Instruct (tools in the system turn, ``<tool_call>`` JSON, ``<tool_response>``);
- ``qwen3``: Qwen3 (the above with ``<think>`` reasoning; ``enable_thinking: false`` through
  ``data.chat_template_kwargs`` closes the reasoning in the generation prompt);
- ``llama3.1``, ``llama3.2``: Llama 3.1 / 3.2 Instruct (tools in the first user turn, a call as
  ``{"name", "parameters"}`` JSON, results as ``ipython`` turns; one call per turn);
- ``mistral``: Mistral-7B-Instruct-v0.3's v3 template (``[AVAILABLE_TOOLS]``, ``[TOOL_CALLS]``,
  ``[TOOL_RESULTS]``; call ids of 9 letters and digits);
- ``smollm2``: SmolLM2-Instruct (ChatML with its default system prompt, no tools).

Each file opens with a Jinja comment (``{#- ... -#}``) naming the model and revision the text is
from and the copies it was checked against (byte for byte: llama.cpp's, huggingface.js', Ollama's);
:func:`named` drops it, so what renders (and what export writes) is the published text unchanged.
The file itself stays a valid template (the comment renders nothing), for
``data.chat_template: path/to/file.jinja``.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_HEADER_END = "-#}\n"  # the end of the source comment each shipped file opens with
NAMES = ("chatml", "qwen2.5", "qwen3", "llama3.1", "llama3.2", "mistral", "smollm2")
# other spellings of the same template (LLaMA-Factory's template names among them)
ALIASES = {
    "qwen": "qwen2.5",
    "qwen2": "qwen2.5",
    "qwen25": "qwen2.5",
    "llama3": "llama3.1",
    "llama-3": "llama3.1",
    "llama31": "llama3.1",
    "llama32": "llama3.2",
    "mistral-v0.3": "mistral",
    "smollm": "smollm2",
}


def canonical(name: str) -> str | None:
    """The shipped template ``name`` means (its own name or a spelling), or None."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in NAMES else None


def named(name: str) -> str | None:
    """The text of the shipped template ``name`` means (its source comment dropped), or None when
    it names none."""
    found = canonical(name)
    return without_header(file_text(found)) if found else None


def file_text(name: str) -> str:
    """A shipped file as it is, its source comment included (``name`` one of NAMES)."""
    return (_HERE / f"{name}.jinja").read_text(encoding="utf-8")


def without_header(text: str) -> str:
    """``text`` less the ``{#- ... -#}`` comment it opens with, if it opens with one."""
    return text.split(_HEADER_END, 1)[1] if text.startswith("{#-") and _HEADER_END in text else text


def renders_tools(template: str) -> bool:
    """Whether a template reads the ``tools`` it is given (its source names them); one that does
    not would drop a row's tool schemas without a word."""
    return "tools" in template


def renders_calls(template: str) -> bool:
    """Whether a template renders an assistant turn's ``tool_calls`` (else the call is dropped)."""
    return "tool_calls" in template
