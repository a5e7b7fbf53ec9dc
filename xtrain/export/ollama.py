"""The Ollama Modelfile of an exported GGUF: ``FROM`` the file, the run's chat template as Ollama's
Go template, the stop tokens, the system prompt, sampling defaults; and the ``ollama create`` line
for the user's shell. Ollama itself is not run here: the template is written from the turn
format (``templates.derive``) that was checked against the Jinja template training rendered with,
and ``render`` below mirrors the Go template, so the export's check compares the two.

Ollama's template data: ``.System`` (the system prompt: the Modelfile's SYSTEM or the request's
system messages), ``.Messages`` (every message, system ones too, each ``.Role`` and
``.Content``). The template is one line without ``{{-`` trimming, because trimming would eat the
newlines that are part of the turns (``<|im_end|>\\n``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from xtrain.errors import XtrainError
from xtrain.export import ollama_tools
from xtrain.export.templates import TurnFormat
from xtrain.shell import join_commands, quote

MODELFILE = "Modelfile"


@dataclass(frozen=True)
class OllamaTurns:
    """The turn format as Ollama sees it: the bos text taken off the front when the GGUF adds bos
    itself (``add_bos_token``), so the model does not see it twice."""

    format: TurnFormat
    bos_text: str  # "" when nothing was taken off
    tools: str | None = None  # templates.tool_family: the tool format the Go template carries

    def render(self, system: str | None, messages: list[dict[str, Any]]) -> str:
        """What the Go template renders for ``system`` and ``messages`` (a prompt: it ends with
        the generation prompt after a user turn), without the bos llama.cpp adds."""
        f = self.format
        parts = []
        if system and f.system_prefix is not None:
            parts.append(_strip(f.system_prefix, self.bos_text) + system + f.system_suffix)
        else:
            parts.append(_strip(f.plain_head, self.bos_text))
        for k, m in enumerate(messages):
            last = k == len(messages) - 1
            if m["role"] == "user":
                parts.append(f.user[0] + m["content"] + f.user[1] + (f.generation if last else ""))
            elif m["role"] == "assistant":
                parts.append(f.assistant[0] + m["content"] + ("" if last else f.assistant[1]))
        return "".join(parts)


def _strip(text: str, bos: str) -> str:
    return text[len(bos) :] if bos and text.startswith(bos) else text


def ollama_turns(
    found: TurnFormat, bos_text: str | None, add_bos: bool, tools: str | None = None
) -> OllamaTurns:
    head = found.plain_head
    taken = bos_text if add_bos and bos_text and head.startswith(bos_text) else ""
    return OllamaTurns(found, taken, tools)


def _literal(text: str) -> str:
    """Template text as Go template source: ``{{`` would open an action."""
    return text.replace("{{", '{{ "{{" }}')


def go_template(turns: OllamaTurns) -> str:
    """The Go template, one line, mirroring ``OllamaTurns.render``; with ``turns.tools`` also the
    family's tool branches (``ollama_tools``), which leave the text without tools unchanged."""
    f, lit = turns.format, _literal
    head = lit(_strip(f.plain_head, turns.bos_text))
    system = None
    if f.system_prefix is not None:
        system = lit(_strip(f.system_prefix, turns.bos_text)) + "{{ .System }}" + lit(f.system_suffix)
        start = f"{{{{ if .System }}}}{system}{{{{ else }}}}{head}{{{{ end }}}}"
    else:
        start = head
    parts = ollama_tools.parts(f, turns.tools, start)
    user = (
        parts.user_before
        + lit(f.user[0])
        + parts.user_head
        + "{{ .Content }}"
        + lit(f.user[1])
        + "{{ if $last }}"
        + lit(f.generation)
        + "{{ end }}"
    )
    assistant = lit(f.assistant[0]) + "{{ .Content }}{{ if not $last }}" + lit(f.assistant[1]) + "{{ end }}"
    if parts.calls:
        assistant = f"{{{{ if .ToolCalls }}}}{parts.calls}{{{{ else }}}}{assistant}{{{{ end }}}}"
    tool = f'{{{{ else if eq .Role "tool" }}}}{parts.result}' if parts.result else ""
    return (
        parts.start
        + parts.before
        + "{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}"
        + parts.each
        + f'{{{{ if eq .Role "user" }}}}{user}{{{{ else if eq .Role "assistant" }}}}{assistant}'
        + f"{tool}{{{{ end }}}}"
        + parts.after_each
        + "{{ end }}"
        + parts.end
    )


def tools_note(template: str | None) -> str:
    """The one line when the Modelfile's template carries no tools (``ollama run`` with tools would
    send the model none of them)."""
    if template and "tools" in template:
        return (
            "the Modelfile's template carries no tools: the run's chat template is not one of the tool "
            "formats written for Ollama (Qwen, Llama 3.1/3.2, Mistral); the GGUF keeps it whole"
        )
    return "the Modelfile's template carries no tools: the run's chat template renders none"


@dataclass
class Modelfile:
    gguf_name: str
    template: str | None  # None: a plain (non-chat) run: the prompt as it is
    stops: list[str] = field(default_factory=list)
    system: str | None = None
    parameters: dict[str, float | int] = field(default_factory=dict)

    def text(self) -> str:
        lines = [f"FROM ./{self.gguf_name}", ""]
        template = self.template if self.template is not None else "{{ .Prompt }}"
        for name, value in (("TEMPLATE", template), ("SYSTEM", self.system)):
            if value is None:
                continue
            if '"""' in value:
                raise XtrainError(
                    f'the {name.lower()} holds """, which a Modelfile cannot quote',
                    "use the GGUF file directly (LM Studio, llama.cpp read its template)",
                )
            lines.append(f'{name} """{value}"""')
        for stop in self.stops:
            lines.append(f"PARAMETER stop {json.dumps(stop, ensure_ascii=False)}")
        for name, value in self.parameters.items():
            lines.append(f"PARAMETER {name} {value}")
        return "\n".join(lines) + "\n"


# transformers' GenerationConfig name -> Ollama's PARAMETER name
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repeat_penalty",
}


def sampling(generation_config: dict[str, Any] | None) -> dict[str, float | int]:
    """Sampling defaults: the base model's ``generation_config.json`` where it samples (what its
    authors set), else greedy, as ``xtrain predict`` decodes by default."""
    found = generation_config or {}
    if not found.get("do_sample"):
        return {"temperature": 0}
    out: dict[str, float | int] = {}
    for key, name in _SAMPLING.items():
        value = found.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def create_lines(name: str, folder: str) -> dict[str, str]:
    """``ollama create`` for PowerShell and bash, run from the export folder."""
    return {
        shell: join_commands(
            [f"cd {quote(shell, folder)}", f"ollama create {quote(shell, name)} -f {MODELFILE}"]
        )
        for shell in ("powershell", "bash")
    }


def model_name(text: str) -> str:
    """An Ollama model name from a folder name: lower case letters, digits, ``-``, ``_``, ``.``."""
    import re

    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return name or "xtrain-model"
