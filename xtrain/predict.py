"""Generate with a trained result: an adapter, a full model, or a run's output folder.

- image-to-text (``VisionEncoderDecoderModel``): images (files, or folders of images) -> text;
- speech-to-text (Whisper and other speech seq2seq models): audio files (or folders) -> transcripts;
- vision-language (Qwen2-VL-style ``AutoModelForImageTextToText``): an image and a question -> the
  answer, the user turn rendered by the processor's chat template as in training;
- causal-lm: text prompts -> their continuations; a run trained on chat conversations renders
  each prompt as a user turn with the chat template saved with it, as in training.

Other results (seq-cls classifiers, custom tasks) are refused: the task is read from what the run
saved (``xtrain_run.json`` next to the adapter, else the config in its checkpoints, else peft's
``task_type`` or the model's ``architectures``).

An adapter folder loads its base model from ``base_model_name_or_path`` (peft's own record) and the
processor/tokenizer saved next to the adapter. Library code: returns data, prints nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3")  # what soundfile reads
_OUTPUT_FOLDERS = ("adapter", "model", "merged", "best")  # what a run's output_dir holds, preferred first
GENERATIVE = ("causal-lm", "image-to-text", "speech-to-text", "vision-language")
# peft task types and model heads of results that do not generate text
_PEFT_TASKS = {"SEQ_CLS": "seq-cls", "TOKEN_CLS": "token-cls", "QUESTION_ANS": "question-answering"}
_HEADS = {
    "ForSequenceClassification": "seq-cls",
    "ForTokenClassification": "token-cls",
    "ForQuestionAnswering": "question-answering",
}


@dataclass
class RunTask:
    """What a result was trained for: ``task`` (None: not recorded) and chat conversations."""

    task: str | None
    chat: bool = False


@dataclass
class Predictor:
    model: Any
    tokenizer: Any
    image_processor: Any | None  # set for image-to-text models
    source: str  # the folder the weights came from
    feature_extractor: Any | None = None  # set for speech-to-text models
    processor: Any | None = None  # set for vision-language models (image processor + chat template)
    chat: bool = False  # a causal-lm trained on chat conversations: prompts become user turns

    @property
    def takes_audio(self) -> bool:
        return self.feature_extractor is not None

    @property
    def takes_questions(self) -> bool:
        """A vision-language model: images and a question about them."""
        return self.processor is not None

    @property
    def takes_images(self) -> bool:
        return self.image_processor is not None


def model_folder(path: str | Path) -> Path:
    """``path`` itself when it holds a model or an adapter, else the result inside a run folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise XtrainError(
            f"{folder} is not a folder", "pass a run's output_dir, its adapter/ or a model folder"
        )
    if (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return folder
    for name in _OUTPUT_FOLDERS:
        if (folder / name / "adapter_config.json").is_file() or (folder / name / "config.json").is_file():
            return folder / name
    raise XtrainError(
        f"{folder} holds no adapter or model",
        "pass a finished run's output_dir (with adapter/ or model/), or the adapter folder itself",
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _checkpoint_task(folder: Path) -> str | None:
    """The ``model.task`` of the config saved in the newest checkpoint of the run ``folder`` is in."""
    from xtrain.train.checkpoint.layout import STATE_FILE, list_checkpoints

    if folder.name not in _OUTPUT_FOLDERS:
        return None
    found = list_checkpoints(folder.parent)
    config = _read_json(found[-1][1] / STATE_FILE).get("config") if found else None
    task = (config or {}).get("model", {}).get("task") if isinstance(config, dict) else None
    return task if isinstance(task, str) else None


def _head_task(folder: Path) -> str | None:
    """A classifier's task from peft's ``task_type`` or a full model's ``architectures``."""
    peft_type = _read_json(folder / "adapter_config.json").get("task_type")
    if peft_type in _PEFT_TASKS:
        return _PEFT_TASKS[peft_type]
    for arch in _read_json(folder / "config.json").get("architectures") or []:
        for head, task in _HEADS.items():
            if str(arch).endswith(head):
                return task
    return None


def run_task(folder: Path) -> RunTask:
    """What the result in ``folder`` was trained for: the run's own record first (``RUN_FILE``,
    saved with the adapter), then its checkpoints' config, then the model's head."""
    from xtrain.train.result import RUN_FILE

    record = _read_json(folder / RUN_FILE)
    if isinstance(record.get("task"), str):
        return RunTask(record["task"], bool(record.get("chat")))
    return RunTask(_checkpoint_task(folder) or _head_task(folder))


def require_generative(folder: Path) -> RunTask:
    """The run's task, refused in one line when it does not generate text (seq-cls, custom)."""
    found = run_task(folder)
    if found.task is not None and found.task not in GENERATIVE:
        raise XtrainError(
            f"{folder} is a {found.task} result: xtrain predict generates text and cannot run it",
            f"predict runs {', '.join(GENERATIVE)} results; a run's eval metrics are in its "
            "train_result.json",
        )
    return found


def pick_device() -> str:
    """Where predict runs, for every task: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def load_predictor(path: str | Path) -> Predictor:
    from xtrain.train import models

    folder = model_folder(path)
    trained = require_generative(folder)
    adapter = (folder / "adapter_config.json").is_file()
    base = str(folder)
    if adapter:
        base = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))[
            "base_model_name_or_path"
        ]
        base = models.resolve_model(base) if base.startswith("builtin:") else base
    config = models.load_config(base, trust_remote_code=False)  # predict runs no hub code
    kind = config.model_type
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    )

    feature_extractor = processor = None
    if kind in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        from xtrain.train.tasks import speech_to_text

        feature_extractor, tokenizer, _ = speech_to_text.load_processors(str(folder), False)
        model = speech_to_text.load_model(base, "auto", False)
        speech_to_text.fix_special_tokens(model, tokenizer)
        image_processor = None
    elif kind == "vision-encoder-decoder":
        from transformers import VisionEncoderDecoderModel

        from xtrain.train.tasks.image_to_text import fix_special_tokens, load_processors

        image_processor, tokenizer, _ = load_processors(str(folder), False)
        model = VisionEncoderDecoderModel.from_pretrained(base, trust_remote_code=False)
        fix_special_tokens(model, tokenizer)
    elif kind in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:  # vision-language (Qwen2-VL, ...)
        from xtrain.train.tasks import vision_language

        processor = vision_language.load_processor(str(folder), False)  # saved with the adapter
        model = vision_language.load_model(base, "auto", False)  # the checkpoint's dtype on a GPU
        tokenizer, image_processor = processor.tokenizer, None
        vision_language.fix_generation(model, tokenizer)
    else:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=False)
        except ValueError:
            raise XtrainError(
                f"{base} is a {kind} model without a text generation head",
                "xtrain predict runs generative models (image-to-text, speech-to-text, "
                "vision-language, causal-lm)",
            ) from None
        image_processor, tokenizer = None, models.load_tokenizer(str(folder), False)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(folder))
    model.to(pick_device())
    model.eval()
    return Predictor(
        model=model,
        tokenizer=tokenizer,
        image_processor=image_processor,
        source=str(folder),
        feature_extractor=feature_extractor,
        processor=processor,
        chat=trained.chat and trained.task == "causal-lm",
    )


def image_files(
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


def predict_audio(
    predictor: Predictor, files: list[Path], max_new_tokens: int, num_beams: int, batch_size: int = 8
) -> list[str]:
    """Transcripts of audio files (mono, resampled to the model's rate, cut to its window)."""
    import torch

    from xtrain.train.tasks.audio_data import read_audio
    from xtrain.train.tasks.speech_to_text import cap_new_tokens, max_seconds

    fe = predictor.feature_extractor
    rate, window = int(fe.sampling_rate), max_seconds(None, fe)
    texts: list[str] = []
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        clips = [
            read_input(f, "audio file", lambda f=f: read_audio(str(f), None, 0, "", rate, window))
            for f in chunk
        ]
        features = fe(clips, sampling_rate=rate, return_tensors="pt")["input_features"]
        with torch.no_grad():
            ids = predictor.model.generate(
                **to_model({"input_features": features}, predictor.model),
                max_new_tokens=cap_new_tokens(predictor.model, max_new_tokens),
                num_beams=num_beams,
            )
        texts += [t.strip() for t in predictor.tokenizer.batch_decode(ids, skip_special_tokens=True)]
    return texts


def predict_images(
    predictor: Predictor, files: list[Path], max_new_tokens: int, num_beams: int, batch_size: int = 8
) -> list[str]:
    import torch

    from xtrain.train.tasks.image_data import open_image

    if predictor.takes_questions:
        raise XtrainError(
            f"{predictor.source} is a vision-language model: it answers a question about each image",
            "add the question with --question TEXT",
        )
    if not predictor.takes_images:
        raise XtrainError(
            f"{predictor.source} is a causal-lm model: it continues text, it reads no images",
            "give it text prompts with --prompt TEXT instead of images",
        )
    texts: list[str] = []
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        images = [read_input(f, "image", lambda f=f: open_image(str(f), None, 0, "")) for f in chunk]
        pixels = predictor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            ids = predictor.model.generate(
                **to_model({"pixel_values": pixels}, predictor.model),
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
            )
        texts += [t.strip() for t in predictor.tokenizer.batch_decode(ids, skip_special_tokens=True)]
    return texts


def chat_prompt(predictor: Predictor, prompt: str, system: str | None = None) -> tuple[str, int | None]:
    """(the text the model sees, the end-of-turn token to stop at) for a causal-lm prompt: a chat
    run's prompt as a user turn (``system`` first) rendered by its saved template with the
    generation prompt, as training rendered it (``chat_data``); a plain run's prompt as it is."""
    from xtrain.train.tasks import chat_data

    if not predictor.chat:
        if system is not None:
            raise XtrainError(
                f"{predictor.source} was not trained on chat conversations: it continues text as it is",
                "leave out --system",
            )
        return prompt, None
    template = chat_data.require_template(predictor.tokenizer, None, predictor.source)
    render = chat_data.renderer(predictor.tokenizer, template)
    text = render(chat_data.user_turn(prompt, system=system, text_only=True), True)
    return text, chat_data.end_of_turn(render, predictor.tokenizer)


def predict_prompts(
    predictor: Predictor,
    prompts: list[str],
    max_new_tokens: int,
    num_beams: int,
    system: str | None = None,
) -> list[str]:
    import torch

    if predictor.takes_questions:
        raise XtrainError(
            f"{predictor.source} is a vision-language model: it answers questions about images",
            "pass image files or folders with --question TEXT",
        )
    if predictor.takes_images or predictor.takes_audio:
        what = "images" if predictor.takes_images else "audio"
        raise XtrainError(
            f"{predictor.source} reads {what}", f"pass {what} files or folders instead of --prompt"
        )
    out = []
    tokenizer = predictor.tokenizer
    for prompt in prompts:  # one at a time: no left-padding subtleties, prompts are few
        text, stop = chat_prompt(predictor, prompt, system)
        # a rendered chat prompt holds its own special tokens, as in training (chat_data.encode)
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=not predictor.chat)
        eos = [t for t in (stop, tokenizer.eos_token_id) if t is not None]
        with torch.no_grad():
            ids = predictor.model.generate(
                **to_model(dict(enc), predictor.model),
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos or None,
            )
        new = ids[0, enc["input_ids"].shape[1] :]
        out.append(predictor.tokenizer.decode(new, skip_special_tokens=True).strip())
    return out


def predict_questions(
    predictor: Predictor,
    files: list[Path],
    questions: list[str],
    max_new_tokens: int,
    num_beams: int,
    system: str | None = None,
) -> list[tuple[Path, str, str]]:
    """(image, question, answer) for every question about every image (vision-language).

    The user turn (the image, then the question; ``system`` first when given) is rendered by the
    chat template saved with the adapter (``chat_data``, as in training, with the generation
    prompt) and expanded by the processor (``vision_chat.process_text``); the answer is what the
    model generates after the prompt, up to its end-of-turn token."""
    import torch

    from xtrain.train.tasks import chat_data
    from xtrain.train.tasks.image_data import open_image
    from xtrain.train.tasks.vision_chat import process_text

    if not predictor.takes_questions:
        raise XtrainError(
            f"{predictor.source} is not a vision-language model: it takes no question with its inputs",
            "pass images/audio or --prompt, not both",
        )
    if not questions or not all(q.strip() for q in questions):
        raise XtrainError(
            "a vision-language model answers a question about each image", "add --question TEXT"
        )
    processor, tokenizer = predictor.processor, predictor.tokenizer
    template = chat_data.require_template(processor, None, predictor.source)
    render = chat_data.renderer(processor, template)
    out = []
    for f in files:  # one at a time: no left-padding subtleties, inputs are few
        image = read_input(f, "image", lambda f=f: open_image(str(f), None, 0, ""))
        for question in questions:
            messages = chat_data.user_turn(question, images=1, system=system)
            prompt = render(messages, True)
            enc = process_text(processor, prompt, [image])
            enc = to_model(dict(enc), predictor.model)
            with torch.no_grad():
                ids = predictor.model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    num_beams=num_beams,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = ids[0, enc["input_ids"].shape[1] :]
            out.append((f, question, tokenizer.decode(new, skip_special_tokens=True).strip()))
    return out
