"""What the tasks' ``predict`` hooks share: input files, one-line unreadable inputs, batches onto
the model. Library code: returns data, prints nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3")  # what soundfile reads


def media_files(
    inputs: list[str], extensions: tuple[str, ...] = IMAGE_EXTENSIONS, what: str = "images"
) -> list[Path]:
    """Files as given; folders expanded to their images (or clips: ``extensions``), sorted by name."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.suffix.lower() in extensions)
        elif p.is_file():
            out.append(p)
        else:
            raise XtrainError(f"input {item} not found", f"pass files or folders of {what}")
    if not out:
        raise XtrainError(f"no {what} found in the inputs", f"{what} end in {', '.join(extensions)}")
    return out


def read_input(path: Path, what: str, read: Callable[[], Any]) -> Any:
    """``read()`` of one input file; a file it cannot read is one line naming that file (the
    readers' own wording is about rows of a data set)."""
    try:
        return read()
    except XtrainError as e:
        reason = e.message.split("): ", 1)[1] if "): " in e.message else "not found"
        raise XtrainError(
            f"input {path} is not a readable {what}: {reason}",
            "fix or replace that file, or leave it out of the inputs",
        ) from None


def to_model(batch: dict[str, Any], model: Any) -> dict[str, Any]:
    """Tensors onto the model's device; floating ones (pixels, audio features) in its dtype."""
    import torch

    dtype = getattr(model, "dtype", None)
    return {
        k: v.to(model.device, dtype=dtype if v.is_floating_point() and dtype else None)
        if torch.is_tensor(v)
        else v
        for k, v in batch.items()
    }


def refuse_prompts(loaded: Any, task: Any, request: Any) -> None:
    """A ``task`` that reads files (images, audio: ``task.predicts.takes``) got
    ``--prompt``/``--question`` or ``--system``."""
    source, takes = loaded.source, task.predicts.takes
    if request.prompts:
        raise XtrainError(
            f"{source} is a {task.name} model: it reads {takes}, not --prompt/--question",
            f"pass {takes} instead",
        )
    if request.system is not None:
        raise XtrainError(
            "--system is for vision-language models and causal-lm runs trained on chat conversations",
            "leave it out for this model",
        )


def file_rows(files: list[Path], texts: list[str]) -> list[dict[str, str]]:
    return [{"input": str(f), "text": t} for f, t in zip(files, texts, strict=True)]


def generate_batches(
    loaded: Any,
    files: list[Path],
    batch_of: Callable[[list[Path]], dict[str, Any]],
    request: Any,
    batch_size: int = 8,
    **generate: Any,
) -> list[str]:
    """Generated texts for ``files``, ``batch_size`` at a time: ``batch_of(chunk)`` makes the
    model's inputs, greedy or beam search as the request says."""
    import torch

    new_tokens = generate.pop("max_new_tokens", request.max_new_tokens)
    texts: list[str] = []
    for start in range(0, len(files), batch_size):
        batch = batch_of(files[start : start + batch_size])
        with torch.no_grad():
            ids = loaded.model.generate(
                **to_model(batch, loaded.model),
                max_new_tokens=new_tokens,
                num_beams=request.num_beams,
                **generate,
            )
        texts += [t.strip() for t in loaded.tokenizer.batch_decode(ids, skip_special_tokens=True)]
    return texts
