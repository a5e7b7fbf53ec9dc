"""The run's chat template as turns: the text around each role's message, found by rendering the
Jinja template itself on a few marked conversations, then checked by rendering real ones both
ways. Ollama's Modelfile template is written from it (``ollama.py``), so a model served by Ollama
sees the same text training rendered; a template whose turns do not fit this shape (one that
moves the system prompt into a user turn, or renders a turn differently by position) is found
here and refused, rather than exported with a template that changed.

A ``TurnFormat`` renders a conversation as::

    system present:  system_prefix + SYSTEM + system_suffix      (prefix holds any leading text)
    no system:       plain_head                                    (e.g. a default system block)
    each turn:       prefix[role] + CONTENT + suffix[role]         (user and assistant)
    generation:      + generation prompt
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Render = Callable[[list[dict[str, Any]], bool], str]  # (messages, add_generation_prompt) -> text

_S, _U1, _A1, _U2, _A2 = "QXSYSTEMQX", "QXUSERONEQX", "QXANSWERONEQX", "QXUSERTWOQX", "QXANSWERTWOQX"


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


@dataclass(frozen=True)
class TurnFormat:
    plain_head: str
    system_prefix: str | None  # None: the template has no system turn
    system_suffix: str
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The conversation as the template renders it (string contents)."""
        out = []
        turns = list(messages)
        if turns and turns[0]["role"] == "system":
            assert self.system_prefix is not None
            out.append(self.system_prefix + turns.pop(0)["content"] + self.system_suffix)
        else:
            out.append(self.plain_head)
        for m in turns:
            prefix, suffix = self.user if m["role"] == "user" else self.assistant
            out.append(prefix + m["content"] + suffix)
        if add_generation_prompt:
            out.append(self.generation)
        return "".join(out)


def _after(text: str, prefix: str) -> str | None:
    return text[len(prefix) :] if text.startswith(prefix) else None


def _before(text: str, suffix: str) -> str | None:
    return text[: len(text) - len(suffix)] if text.endswith(suffix) else None


def _safe(render: Render, messages: list[dict[str, Any]], generation: bool) -> str | None:
    try:
        return render(messages, generation)
    except Exception:  # the template's raise_exception (no system role, roles must alternate)
        return None


def _system(render: Render, plain_head: str, user_pre: str) -> tuple[str | None, str]:
    """(prefix, suffix) around a system message; (None, "") when the template has none."""
    text = _safe(render, [_msg("system", _S), _msg("user", _U1), _msg("assistant", _A1)], False)
    if text is None or _S not in text or _U1 not in text:
        return None, ""
    at = text.index(_S)
    between = text[at + len(_S) : text.index(_U1)]
    suffix = _before(between, user_pre)
    return (text[:at], suffix) if suffix is not None else (None, "")


def derive(render: Render) -> TurnFormat | None:
    """The turn format of the template behind ``render``; None when its turns are not of that shape."""
    one = _safe(render, [_msg("user", _U1)], False)
    one_gen = _safe(render, [_msg("user", _U1)], True)
    four = _safe(
        render, [_msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2), _msg("assistant", _A2)], False
    )
    if one is None or one_gen is None or four is None or not all(m in four for m in (_U1, _A1, _U2, _A2)):
        return None
    generation = _after(one_gen, one)
    user_suffix = one[one.index(_U1) + len(_U1) :] if _U1 in one else None
    a1, u2, a2 = four.index(_A1), four.index(_U2), four.index(_A2)
    assistant_suffix = four[a2 + len(_A2) :]
    user_prefix = _after(four[a1 + len(_A1) : u2], assistant_suffix)
    between = four[four.index(_U1) + len(_U1) : a1]
    if generation is None or user_suffix is None or user_prefix is None:
        return None
    assistant_prefix = _after(between, user_suffix)
    plain_head = _before(four[: four.index(_U1)], user_prefix)
    if assistant_prefix is None or plain_head is None:
        return None
    system_prefix, system_suffix = _system(render, plain_head, user_prefix)
    found = TurnFormat(
        plain_head, system_prefix, system_suffix, (user_prefix, user_suffix),
        (assistant_prefix, assistant_suffix), generation,
    )  # fmt: skip
    return found if agrees(found, render) else None


# real conversations of every shape the format claims to cover: the check of ``derive``
_CHECKS = (
    ([_msg("user", "Hello there")], True),
    ([_msg("user", "What is 2+2?"), _msg("assistant", "4"), _msg("user", "And 3+3?")], True),
    ([_msg("user", "Hi"), _msg("assistant", "Hello! How can I help?")], False),
)


def agrees(found: TurnFormat, render: Render, conversations: Any = ()) -> bool:
    """Whether ``found`` renders these conversations (and its own checks) as ``render`` does."""
    checks = list(_CHECKS) + list(conversations)
    if found.system_prefix is not None:
        checks += [([_msg("system", "You answer briefly."), *c], g) for c, g in _CHECKS]
    for messages, generation in checks:
        expected = _safe(render, messages, generation)
        if expected is None or found.render(messages, generation) != expected:
            return False
    return True


# The tool formats Ollama's template can carry, known by the marks of the run's Jinja template (the
# shipped ones in xtrain/data/templates and the families' own): Qwen's (Hermes-style) ``<tool_call>``
# JSON in ChatML, Llama 3.1/3.2's JSON calls and ``ipython`` results, Mistral v0.3's ``[TOOL_CALLS]``,
# and the built-in agent model's own short format.
_TOOL_MARKS = {
    "qwen": ("<|im_start|>", "<tool_call>", "<tool_response>"),
    "llama3": ("<|start_header_id|>", "ipython", '"parameters": '),
    "mistral": ("[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]"),
    "xtrain": ("<|im_start|>system\\ntools:", "<tool_call>", "<|im_start|>tool\\n"),  # builtin:tiny-agent
}
# the turn text each family's tool branch is written around: a format that differs is not that family
_TOOL_TURNS = {
    "qwen": (("<|im_start|>user\n", "<|im_end|>\n"), ("<|im_start|>assistant\n", "<|im_end|>\n")),
    "llama3": (
        ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
        ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    ),
    "mistral": (("[INST] ", "[/INST]"), (" ", None)),  # None: the eos text, whatever it is
    "xtrain": (("<|im_start|>user\n", "<|im_end|>\n"), ("<|im_start|>assistant\n", "<|im_end|>\n")),
}


def tool_family(template: str | None, found: TurnFormat) -> str | None:
    """The tool format of the Jinja ``template`` whose turns are ``found``: ``qwen``, ``llama3``,
    ``mistral``, or None (no tools in it, or a format Ollama's template is not written for here)."""
    if not template or "tools" not in template:
        return None
    for family, marks in _TOOL_MARKS.items():
        if all(m in template for m in marks):
            user, assistant = _TOOL_TURNS[family]
            end = assistant[1] if assistant[1] is not None else found.assistant[1]
            if (found.user, found.assistant) == (user, (assistant[0], end)):
                return family
    return None
