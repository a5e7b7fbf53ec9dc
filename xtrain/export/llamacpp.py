"""llama.cpp itself, in-process: PyPI's ``xllamacpp`` (prebuilt llama.cpp wheels, Linux x86_64 and
Windows) runs llama.cpp's own OpenAI-style server on a GGUF file, so the export checks its file
where users run it: the chat template rendered by llama.cpp's Jinja engine and tokenized by its
tokenizer (``render``, ``tokenize``: the server's ``/apply-template`` and ``/tokenize`` routes,
on 127.0.0.1), and greedy answers, tool calls parsed by llama.cpp's own parser for the
template (``chat``).

Optional: without the package the export checks the template with Jinja2 and answers with
transformers' GGUF reader, and says so (``installed``). Library code: nothing printed (the
server's own log is off: ``verbosity -1``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata, util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

PACKAGE = "xllamacpp"
INSTALL = 'pip install "xllamacpp>=2026.10"'  # Linux x86_64 and Windows wheels (the export extra)
Tools = list[dict[str, Any]] | None  # OpenAI-style function schemas
TIMEOUT_S = 600  # one request to the in-process server (a 7B model's answer on a CPU: seconds)


def installed() -> bool:
    return util.find_spec(PACKAGE) is not None


def version() -> str | None:
    """The installed xllamacpp's version (its llama.cpp build), or None."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


class Refused(Exception):
    """llama.cpp refused a request: its own message (a template it cannot run names the construct)."""


@dataclass
class Reply:
    """One greedy answer: the text and the tool calls llama.cpp's parser found (``{"name",
    "arguments": dict}``; arguments it could not read as JSON stay a string)."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)


def _arguments(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conversations as training renders them (a call's ``arguments`` a dict) in the OpenAI form a
    client sends llama.cpp (``arguments`` a JSON string; llama.cpp reads it back into an object
    for the template, as transformers' templates get it)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_openai_call(c) for c in calls]}
        out.append(m)
    return out


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments", {}), ensure_ascii=False)
    return {**call, "type": call.get("type", "function"), "function": function}


class Runtime:
    """A GGUF file loaded by llama.cpp (``with Runtime(path) as llama: ...``). ``prefill``: an
    assistant turn that ends a request is continued, as llama.cpp's server does by default;
    without it such a conversation renders as it is (the template check)."""

    def __init__(self, path: Path, context: int = 2048, threads: int | None = None, prefill: bool = False):
        from xtrain.evaluate.gguf import llama_server  # the one set of llama.cpp's server settings

        self._server: Any = llama_server(path, context, threads, prefill)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server = None  # the server stops when its last reference goes

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self._server.listening_address + route,
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as e:
            raise Refused(_message(e.read())) from None

    def render(self, messages: list[dict[str, Any]], tools: Tools = None, generation: bool = True) -> str:
        """The prompt text llama.cpp makes of a conversation (its bos token, when the file adds one,
        left off: the tokenizer adds it)."""
        body: dict[str, Any] = {"messages": openai_messages(messages), "add_generation_prompt": generation}
        if tools:
            body["tools"] = tools
        return self._post("/apply-template", body)["prompt"]

    def tokenize(self, text: str) -> list[int]:
        """``text``'s tokens as llama.cpp feeds a chat prompt to the model (special tokens parsed,
        bos/eos added as the file says)."""
        found = self._post("/tokenize", {"content": text, "add_special": True, "parse_special": True})
        return [int(t) for t in found["tokens"]]

    def chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, max_tokens: int = 32, choice: str = "auto"
    ) -> Reply:
        """The greedy answer to a conversation (``tools``: the schemas it may call; ``choice``: the
        request's ``tool_choice``, ``required`` holds the answer to a call by llama.cpp's grammar)."""
        body: dict[str, Any] = {
            "messages": openai_messages(messages), "max_tokens": max_tokens, "temperature": 0,
        }  # fmt: skip
        if tools:
            body.update(tools=tools, tool_choice=choice)
        try:
            found = self._server.handle_chat_completions(body)
        except (ValueError, RuntimeError) as e:  # a template it cannot run; output its parser cannot read
            raise Refused(str(e)) from None
        if "error" in found:
            raise Refused(_message(json.dumps(found).encode()))
        message = found["choices"][0]["message"]
        calls = [
            {"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
            for c in message.get("tool_calls") or []
        ]
        return Reply((message.get("content") or "").strip(), calls)

    def complete(self, prompt: str, max_tokens: int = 32) -> str:
        """The greedy continuation of a plain text (bos added as the file says)."""
        try:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            found = self._server.handle_completions(body)
        except ValueError as e:
            raise Refused(str(e)) from None
        if "error" in found:
            raise Refused(_message(json.dumps(found).encode()))
        return found["choices"][0]["text"].strip()


def _message(raw: bytes) -> str:
    try:
        found = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
    error = found.get("error", found) if isinstance(found, dict) else found
    return str(error.get("message", error) if isinstance(error, dict) else error)


def unsupported(message: str) -> str:
    """The template construct llama.cpp's error names, in one line: its error and the source
    excerpt it points at (``Unknown (built-in) filter 'list' for type Object at `... | list |
    join(', ')) ...```)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    error = next((line.removeprefix("Error: ") for line in lines if line.startswith("Error:")), None)
    source = next((line for line in lines if line.startswith("...")), None)
    if error is None:
        return " ".join(lines)
    return f"{error} at `{source.strip('. ')}`" if source else error
