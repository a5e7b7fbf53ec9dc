"""Option parsing shared by the commands: a bad value is one clear line, not a usage box."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer

from xtrain.errors import XtrainError


def parse_gpus(text: str | None) -> list[int] | None:
    """``"0,1"`` -> [0, 1]; None or "all" -> None (every visible GPU)."""
    if text is None or text.strip().lower() == "all":
        return None
    if not re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", text):
        raise XtrainError(f"--gpus {text!r} is not a list of GPU ids", "e.g. --gpus 0,1 (or --gpus all)")
    return [int(x) for x in text.split(",")]


def whole(flag: str, example: str = "") -> Callable[[str], int]:
    """typer's ``parser`` of an integer option: ``--help`` shows ``<int>``, and a value that is
    no whole number is one line (the XtrainError leaves typer for the CLI's edge), not a usage
    box. The option's range is checked where its value is used (``parse_int``)."""

    def parse(text: str) -> int:
        value = parse_int(text, flag, example=example)
        assert value is not None
        return value

    return parse


def number(flag: str, example: str = "") -> Callable[[str], float]:
    """``whole`` for a number option (``--temperature``): ``<float>`` in ``--help``."""

    def parse(text: str) -> float:
        value = parse_float(text, flag, example=example)
        assert value is not None
        return value

    return parse


def parse_int(
    text: str | int | None, flag: str, low: int | None = None, high: int | None = None, example: str = ""
) -> int | None:
    """An integer option, checked here so a bad value is one line, not a usage box. ``low`` and
    ``high``: the range of an option that is no setting (``--steps``); a setting's range
    (``--processes``, ``--port``) is checked where it is resolved (``Overrides.check``). An int
    (typer's, through ``whole``) has its range checked only."""
    if text is None:
        return None
    try:
        value = text if isinstance(text, int) else int(text.strip())
    except ValueError:
        raise XtrainError(f"{flag} needs a whole number, got {text!r}", example or None) from None
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"between {low} and {high}"
        raise XtrainError(f"{flag} must be {span}, got {value}", example or None)
    return value


def parse_float(
    text: str | float | None,
    flag: str,
    low: float | None = None,
    high: float | None = None,
    example: str = "",
) -> float | None:
    """A number option (``--temperature``), checked here so a bad value is one line."""
    if text is None:
        return None
    try:
        value = float(text) if isinstance(text, (int, float)) else float(text.strip())
    except ValueError:
        raise XtrainError(f"{flag} needs a number, got {text!r}", example or None) from None
    if value != value or (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            span = f"between {low:g} and {high:g}"
        else:
            span = f"at least {low:g}" if low is not None else f"at most {high:g}"
        given = text.strip() if isinstance(text, str) else f"{value:g}"
        raise XtrainError(f"{flag} must be {span}, got {given}", example or None)
    return value


# The generation options of `xtrain predict` and `xtrain chat`: one spelling, parser and default
# (each a fresh typer declaration: a command's parameter default)


def max_new_tokens_option() -> Any:
    return typer.Option(
        128, "--max-new-tokens", parser=whole("--max-new-tokens"), help="Longest generated text (tokens)."
    )


def num_beams_option() -> Any:
    return typer.Option(1, "--num-beams", parser=whole("--num-beams"), help="Beam width (1: greedy).")


def temperature_option(tasks: str = "") -> Any:
    """``tasks``: the results that sample, where the command runs others too."""
    return typer.Option(
        None,
        "--temperature",
        parser=number("--temperature"),
        help=f"Sample at this temperature ({f'{tasks}; ' if tasks else ''}0 or unset: greedy).",
    )


def top_p_option() -> Any:
    return typer.Option(
        None,
        "--top-p",
        parser=number("--top-p"),
        help="Sample from the fewest tokens holding this share of the probability.",
    )


def seed_option() -> Any:
    return typer.Option(
        None, "--seed", parser=whole("--seed"), help="Seed of the sampling: the same seed, the same samples."
    )
