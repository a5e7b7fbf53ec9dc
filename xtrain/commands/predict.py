"""`xtrain predict`: run a trained adapter or model on images, audio or text prompts."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from xtrain.commands.options import parse_int
from xtrain.errors import XtrainError


def predict(
    model: Path = typer.Argument(..., help="A run's output_dir, its adapter/ or best/, or a model folder."),
    inputs: list[str] = typer.Argument(
        None, help="Image or audio files, or folders of them (image-to-text, speech-to-text)."
    ),
    prompt: list[str] = typer.Option(None, "--prompt", "-p", help="A text prompt (causal-lm); repeatable."),
    max_new_tokens: str = typer.Option("128", "--max-new-tokens", help="Longest generated text (tokens)."),
    num_beams: str = typer.Option("1", "--num-beams", help="Beam width (1: greedy)."),
    output: Path = typer.Option(None, "--output", "-o", help="Also write the results as JSON lines here."),
) -> None:
    """Generate text with a trained result: images or audio -> text, or prompts -> continuations."""
    from xtrain import predict as lib
    from xtrain.train.quiet import quiet_libraries

    new_tokens = parse_int(max_new_tokens, "--max-new-tokens", 1, example="e.g. --max-new-tokens 64")
    beams = parse_int(num_beams, "--num-beams", 1, example="e.g. --num-beams 4")
    if not inputs and not prompt:
        raise XtrainError("nothing to predict", "pass image or audio files/folders, or --prompt TEXT")
    if inputs and prompt:
        raise XtrainError("pass images/audio or --prompt, not both")
    quiet_libraries()
    predictor = lib.load_predictor(model)
    if inputs and predictor.takes_audio:
        files = lib.image_files(list(inputs), lib.AUDIO_EXTENSIONS, "audio files")
        texts = lib.predict_audio(predictor, files, new_tokens, beams)
        rows = [{"input": str(f), "text": t} for f, t in zip(files, texts, strict=True)]
    elif inputs:
        files = lib.image_files(list(inputs))
        texts = lib.predict_images(predictor, files, new_tokens, beams)
        rows = [{"input": str(f), "text": t} for f, t in zip(files, texts, strict=True)]
    else:
        texts = lib.predict_prompts(predictor, list(prompt), new_tokens, beams)
        rows = [{"input": p, "text": t} for p, t in zip(prompt, texts, strict=True)]
    for row in rows:  # plain tab-separated lines (rich would expand the tab): easy to pipe
        typer.echo(f"{row['input']}\t{row['text']}")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
