"""`xtrain predict`: run a trained adapter or model on images, audio, images + a question
(vision-language) or text prompts."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from xtrain.commands.options import parse_int
from xtrain.errors import XtrainError


def check_output(output: Path) -> None:
    """``--output`` names a new file: nothing of the user's is overwritten."""
    if output.exists():
        raise XtrainError(
            f"--output {output} already exists and would be overwritten",
            "give another file name, or delete that file first",
        )


def predict(
    model: Path = typer.Argument(..., help="A run's output_dir, its adapter/ or best/, or a model folder."),
    inputs: list[str] = typer.Argument(
        None,
        help="Image or audio files, or folders of them (the tasks that read images or audio).",
    ),
    prompt: list[str] = typer.Option(
        None,
        "--prompt",
        "-p",
        "--question",
        "-q",
        help="A text prompt (causal-lm), or a question about every image (vision-language); repeatable.",
    ),
    system: str = typer.Option(
        None,
        "--system",
        help="A system turn before the question (vision-language, or a causal-lm chat run; as in training).",
    ),
    max_new_tokens: str = typer.Option("128", "--max-new-tokens", help="Longest generated text (tokens)."),
    num_beams: str = typer.Option("1", "--num-beams", help="Beam width (1: greedy)."),
    output: Path = typer.Option(None, "--output", "-o", help="Also write the results as JSON lines here."),
) -> None:
    """Run a trained result: images or audio -> text, images + a question -> the answer,
    prompts -> continuations, images -> a label and its probability."""
    from xtrain import predict as lib
    from xtrain.train.quiet import quiet_libraries
    from xtrain.train.tasks.contract import PredictRequest

    new_tokens = parse_int(max_new_tokens, "--max-new-tokens", 1, example="e.g. --max-new-tokens 64")
    beams = parse_int(num_beams, "--num-beams", 1, example="e.g. --num-beams 4")
    if not inputs and not prompt:
        raise XtrainError(
            "nothing to predict",
            "pass image or audio files/folders, --prompt TEXT, or images with --question TEXT",
        )
    for item in inputs or []:  # before the (slow) model load
        if not Path(item).expanduser().exists():
            raise XtrainError(f"input {item} not found", "pass files or folders of images or audio")
    if output is not None:
        check_output(output)
    quiet_libraries()
    request = PredictRequest(list(inputs or []), list(prompt or []), system, new_tokens, beams)
    rows = lib.predict(model, request)
    for row in rows:  # plain tab-separated lines (rich would expand the tab): easy to pipe
        typer.echo("\t".join(row.values()))  # input, (question,) text (, probability)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
