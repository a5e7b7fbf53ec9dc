"""The tool branches of the Ollama Go template (``ollama.go_template``), one per tool format that
``templates.tool_family`` knows, written from the families' Jinja templates (the shipped ones in
xtrain/data/templates): where the tool schemas go, how an assistant turn's calls are written, how a
``tool`` result turn reads. Every branch sits behind ``.Tools`` / ``.ToolCalls`` / role ``tool``,
so a conversation without tools renders the text the export checks against training's.

Ollama's data for tools: ``.Tools`` (each ``.Function.Name`` / ``.Description`` / ``.Parameters``;
``json`` renders one as compact JSON), each message's ``.ToolCalls`` (``.Function.Name``,
``.Function.Arguments``) and ``tool`` role messages. Go's ``json`` writes compact JSON where the
Jinja templates write Python's ``", "`` / ``": "`` spacing (Llama 3: ``indent=4``): the schemas and
arguments the model reads under Ollama differ from training's by that whitespace only.
"""

from __future__ import annotations

from dataclasses import dataclass

from xtrain.export.templates import TurnFormat


@dataclass(frozen=True)
class Parts:
    """Go template source put around and into the turns of ``go_template``; "" where none."""

    start: str  # the head: the system turn, or its tools variant
    before: str = ""  # before the range over .Messages: variables
    each: str = ""  # at the start of every message
    user_before: str = ""  # before a user turn's prefix
    user_head: str = ""  # after a user turn's prefix, before its content
    calls: str = ""  # an assistant turn with .ToolCalls, whole
    result: str = ""  # a tool turn, whole
    after_each: str = ""  # at the end of every message
    end: str = ""  # after the range


_QWEN_INTRO = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
_LLAMA_SYSTEM = "<|start_header_id|>system<|end_header_id|>\n\n"
_LLAMA_INTRO = (
    "Given the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
    "value}.Do not use variables.\n\n"
)


def parts(f: TurnFormat, family: str | None, start: str) -> Parts:
    """The tool branches of ``family`` (``templates.tool_family``; none for None) around the turns
    ``f``, ``start`` being the head without tools."""
    maker = _FAMILIES.get(family or "")
    return maker(f, start) if maker else Parts(start)


def _qwen(f: TurnFormat, start: str) -> Parts:
    prefix = f.system_prefix if f.system_prefix is not None else "<|im_start|>system\n"
    head, suffix = f.plain_head, f.system_suffix
    # the template's own system prompt when none is given (Qwen2.5's "You are Qwen, ...")
    default = head[len(prefix) : len(head) - len(suffix)] if head.startswith(prefix) and suffix else ""
    tools = (
        prefix + "{{ if .System }}{{ .System }}{{ else }}" + default + "{{ end }}"
        + _QWEN_INTRO + "{{ range .Tools }}\n{{ json . }}{{ end }}" + _QWEN_OUTRO
    )  # fmt: skip
    open_, close = f.assistant[0].rstrip("\n"), f.assistant[1]
    calls = (
        open_ + "{{ if .Content }}\n{{ .Content }}{{ end }}{{ range .ToolCalls }}\n<tool_call>\n"
        '{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}\n</tool_call>'
        "{{ end }}" + close
    )
    user = f.user[0].rstrip("\n")  # results of consecutive tool turns share one user turn
    return Parts(
        start=f"{{{{ if .Tools }}}}{tools}{{{{ else }}}}{start}{{{{ end }}}}",
        before='{{ $prev := "" }}',
        each=f'{{{{ if and (eq $prev "tool") (ne .Role "tool") }}}}{f.user[1]}{{{{ end }}}}',
        calls=calls,
        result=f'{{{{ if ne $prev "tool" }}}}{user}{{{{ end }}}}'
        + "\n<tool_response>\n{{ .Content }}\n</tool_response>",
        after_each="{{ $prev = .Role }}",
        end=f'{{{{ if eq $prev "tool" }}}}{f.user[1]}{f.generation}{{{{ end }}}}',
    )


def _llama3(f: TurnFormat, start: str) -> Parts:
    tools_start = start.replace(_LLAMA_SYSTEM, _LLAMA_SYSTEM + "Environment: ipython\n")
    calls = (
        f.assistant[0] + '{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": '
        "{{ json .Function.Arguments }}}{{ end }}" + f.assistant[1]
    )
    return Parts(
        start=f"{{{{ if .Tools }}}}{tools_start}{{{{ else }}}}{start}{{{{ end }}}}",
        before="{{ $first := true }}",
        # the schemas open the first user turn, as Llama's template puts them (tools_in_user_message)
        user_head=f"{{{{ if and $.Tools $first }}}}{_LLAMA_INTRO}{{{{ range $.Tools }}}}{{{{ json . }}}}\n\n"
        "{{ end }}{{ end }}",
        calls=calls,
        # Llama's template writes a result with tojson (a string is iterable there): quoted, escaped
        result="<|start_header_id|>ipython<|end_header_id|>\n\n{{ json .Content }}<|eot_id|>"
        f"{{{{ if $last }}}}{f.generation}{{{{ end }}}}",
        after_each='{{ if eq .Role "user" }}{{ $first = false }}{{ end }}',
    )


def _mistral(f: TurnFormat, start: str) -> Parts:
    # the call ids (.ID, .ToolCallID) reach Ollama's templates from Ollama 0.12.10
    return Parts(
        start=start,
        before='{{ $lastUser := -1 }}{{ range $k, $m := .Messages }}{{ if eq $m.Role "user" }}'
        "{{ $lastUser = $k }}{{ end }}{{ end }}",
        # the schemas go before the last user turn, as Mistral v0.3's template puts them
        user_before="{{ if and $.Tools (eq $i $lastUser) }}[AVAILABLE_TOOLS] [{{ range $k, $t := $.Tools }}"
        "{{ if $k }}, {{ end }}{{ json $t }}{{ end }}][/AVAILABLE_TOOLS]{{ end }}",
        calls="[TOOL_CALLS] [{{ range $k, $c := .ToolCalls }}{{ if $k }}, {{ end }}"
        '{"name": "{{ $c.Function.Name }}", "arguments": {{ json $c.Function.Arguments }}, '
        '"id": "{{ $c.ID }}"}'
        "{{ end }}]" + f.assistant[1],
        result='[TOOL_RESULTS] {"content": {{ .Content }}, "call_id": "{{ .ToolCallID }}"}[/TOOL_RESULTS]',
    )


def _xtrain(f: TurnFormat, start: str) -> Parts:
    """The built-in ``builtin:tiny-agent``'s short format (xtrain/builtin/agents.py): one system line
    ``tools: name(arg, ...)``, ``<tool_call>`` JSON right after the assistant text, results as
    ``tool`` turns."""
    tools = (
        '<|im_start|>system\ntools:{{ range .Tools }} {{ .Function.Name }}({{ $sep := "" }}'
        '{{ range $k, $_ := .Function.Parameters.Properties }}{{ $sep }}{{ $k }}{{ $sep = ", " }}{{ end }})'
        "{{ end }}<|im_end|>\n"
    )
    return Parts(
        start=f"{{{{ if .Tools }}}}{tools}{{{{ else }}}}{start}{{{{ end }}}}",
        calls=f.assistant[0] + "{{ .Content }}{{ range .ToolCalls }}<tool_call>"
        '{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}</tool_call>{{ end }}'
        + f.assistant[1],
        result="<|im_start|>tool\n{{ .Content }}"
        + f"{f.user[1]}{{{{ if $last }}}}{f.generation}{{{{ end }}}}",
    )


_FAMILIES = {"qwen": _qwen, "llama3": _llama3, "mistral": _mistral, "xtrain": _xtrain}
