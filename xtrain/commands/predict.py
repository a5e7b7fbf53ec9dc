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
        help="Image or audio files, or folders of them (image-to-text, speech-to-text, vision-language).",
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
    """Generate text with a trained result: images or audio -> text, images + a question -> the
    answer, or prompts -> continuations."""
    from xtrain import predict as lib
    from xtrain.train.quiet import quiet_libraries

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
    predictor = lib.load_predictor(model)
    if system is not None and not (predictor.takes_questions or predictor.chat):
        raise XtrainError(
            "--system is for vision-language models and causal-lm runs trained on chat conversations",
            "leave it out for this model",
        )
    if predictor.takes_questions:  # vision-language: images and a question about them
        if not inputs:
            raise XtrainError(
                f"{predictor.source} is a vision-language model: it answers a question about an image",
                "pass image files or folders with --question TEXT",
            )
        files = lib.image_files(list(inputs))
        answers = lib.predict_questions(predictor, files, list(prompt or []), new_tokens, beams, system)
        rows = [{"input": str(f), "prompt": q, "text": a} for f, q, a in answers]
    elif inputs and prompt:
        raise XtrainError(
            f"{predictor.source} takes images/audio or --prompt, not both",
            "questions about images go to vision-language models",
        )
    elif inputs and predictor.takes_audio:
        files = lib.image_files(list(inputs), lib.AUDIO_EXTENSIONS, "audio files")
        texts = lib.predict_audio(predictor, files, new_tokens, beams)
        rows = [{"input": str(f), "text": t} for f, t in zip(files, texts, strict=True)]
    elif inputs:
        files = lib.image_files(list(inputs))
        texts = lib.predict_images(predictor, files, new_tokens, beams)
        rows = [{"input": str(f), "text": t} for f, t in zip(files, texts, strict=True)]
    else:
        texts = lib.predict_prompts(predictor, list(prompt), new_tokens, beams, system)
        rows = [{"input": p, "text": t} for p, t in zip(prompt, texts, strict=True)]
    for row in rows:  # plain tab-separated lines (rich would expand the tab): easy to pipe
        typer.echo("\t".join(row.values()))  # input, (question,) text
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
