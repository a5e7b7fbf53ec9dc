"""`xtrain chat RUN`: talk to a trained chat result (or a chat model folder) on the terminal.

Each line typed is a user turn; the conversation so far is rendered through the result's chat
template and answered as ``xtrain predict`` answers a prompt (the same loading, greedy or
sampled). ``/reset`` starts the conversation over, ``/exit``, Ctrl+D (Ctrl+Z then Enter in
PowerShell) or Ctrl+C at the prompt leave; Ctrl+C while it answers drops that turn.
"""

from __future__ import annotations

from pathlib import Path

import typer

from xtrain.commands.options import (
    max_new_tokens_option,
    num_beams_option,
    seed_option,
    temperature_option,
    top_p_option,
)
from xtrain.commands.predict import _request

PROMPT = "you> "
ANSWER = "bot> "
RESET, EXIT = "/reset", "/exit"


def chat(
    model: Path = typer.Argument(..., help="A run's output_dir, its adapter/ or best/, or a model folder."),
    system: str = typer.Option(None, "--system", help="A system turn first in every conversation."),
    max_new_tokens: int = max_new_tokens_option(),
    num_beams: int = num_beams_option(),
    temperature: float = temperature_option(),
    top_p: float = top_p_option(),
    seed: int = seed_option(),
) -> None:
    """Chat with a result trained on conversations, or a model with a chat template: each line
    you type is a user turn; /reset starts over, /exit or Ctrl+D leaves."""
    from xtrain import predict as lib
    from xtrain.console import make_console
    from xtrain.runtime.quiet import quiet_libraries

    options = {
        "max_new_tokens": max_new_tokens, "num_beams": num_beams, "batch_size": 1,
        "seed": seed, "temperature": temperature, "top_p": top_p,
    }  # fmt: skip
    request = _request(None, None, system, options)
    console = make_console()
    quiet_libraries()
    session = lib.load_chat(model, request)
    how = "the run's chat template"
    if session.templated:
        how = "its own chat template (a model xtrain did not train)"
    decoding = "sampled" if request.sampling else "greedy"
    console.print(
        f"chatting with {session.loaded.source} through {how}, {decoding}; "
        f"{RESET} starts over, {EXIT} or Ctrl+D leaves",
        soft_wrap=True,
        markup=False,
    )
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while True:
        try:
            line = input(PROMPT)
        except (EOFError, KeyboardInterrupt):  # Ctrl+D / Ctrl+Z, Ctrl+C at the prompt: leave
            typer.echo("")
            return
        text = line.strip()
        if text == EXIT:
            return
        if text == RESET:
            messages = list(start)
            typer.echo("(a new conversation)")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = session.reply(messages)
        except KeyboardInterrupt:  # stop this answer, keep the conversation before it
            messages.pop()
            typer.echo("\n(stopped; that turn is left out)")
            continue
        messages.append({"role": "assistant", "content": answer})
        typer.echo(ANSWER + answer)
