"""The vision-language task's processor: the checkpoint's ``AutoProcessor`` (image processor +
tokenizer + chat template), rebuilt without its video half where torchvision is missing, and
Qwen2-VL-style image-area bounds (``data.min_pixels``/``data.max_pixels``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.model import load as models
from xtrain.model.start import start_of
from xtrain.tasks.contract import MainProcessFirst

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase, ProcessorMixin
    from transformers.image_processing_utils import BaseImageProcessor

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render

_IMAGE_ONLY: dict[type, type] = {}


def image_only_processor(
    base: type,
    image_processor: BaseImageProcessor,
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None,
) -> ProcessorMixin:
    """``base`` (e.g. ``Qwen2VLProcessor``) without its video processor: the same text and image
    handling, for machines without torchvision (which the video processor needs). Pickles by
    rebuilding (spawned DataLoader workers)."""
    cls = _IMAGE_ONLY.get(base)
    if cls is None:

        def __init__(
            self: Any,
            image_processor: BaseImageProcessor | None = None,
            tokenizer: PreTrainedTokenizerBase | None = None,
            chat_template: str | None = None,
        ):
            base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template)

        def __reduce__(self: Any) -> tuple[Any, ...]:
            return (image_only_processor, (base, self.image_processor, self.tokenizer, self.chat_template))

        # the base's name: save_pretrained records it as the processor class, loadable anywhere
        cls = type(base.__name__, (base,), {"__init__": __init__, "__reduce__": __reduce__})
        _IMAGE_ONLY[base] = cls
    return cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)


def _processor_class(source: str) -> str | None:
    from transformers.utils import cached_file

    for name in ("processor_config.json", "preprocessor_config.json"):
        with contextlib.suppress(Exception):
            path = cached_file(source, name, _raise_exceptions_for_missing_entries=False)
            if path:
                found = json.loads(Path(path).read_text(encoding="utf-8")).get("processor_class")
                if found:
                    return found
    return None


def load_processor(source: str, trust_remote_code: bool) -> ProcessorMixin:
    """The checkpoint's ``AutoProcessor`` (image processor + tokenizer + chat template)."""
    import transformers

    local = Path(source).exists()
    error: Exception | None = None
    processor: ProcessorMixin | None = None
    try:
        processor = transformers.AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)
    except ImportError as e:  # e.g. "Qwen2VLVideoProcessor requires the Torchvision library"
        error = e
    except OSError as e:
        # "Can't load video processor": a processor saved by the image-only build (an adapter
        # folder, trained without torchvision) has no video half to load: build it the same way
        if "video processor" not in str(e):
            raise models.load_error("processor", source, local, e) from None
        error = e
    except Exception as e:
        raise models.load_error("processor", source, local, e) from None
    if processor is None:
        name = _processor_class(source)
        base = getattr(transformers, name, None) if name else None
        if base is None:
            raise models.load_error("processor", source, local, error or ValueError("no processor"))
        tokenizer = models.load_tokenizer(source, trust_remote_code)
        try:
            auto = transformers.AutoImageProcessor
            images = auto.from_pretrained(source, trust_remote_code=trust_remote_code)
        except Exception as e:
            raise models.load_error("image processor", source, local, e) from None
        processor = image_only_processor(base, images, tokenizer, tokenizer.chat_template)
    if getattr(processor, "image_processor", None) is None or getattr(processor, "tokenizer", None) is None:
        raise XtrainError(
            f"{source} has no image processor + tokenizer pair (AutoProcessor: {type(processor).__name__})",
            "vision-language takes checkpoints with a multimodal processor (Qwen2-VL, LLaVA, SmolVLM)",
        )
    tokenizer = processor.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "right"  # the collator pads prompts for generation itself
    return processor


def max_pixels(cfg: TrainConfig) -> int | None:
    """The largest image area the processor makes: ``data.max_pixels``, else the checkpoint's
    image processor's (``max_pixels`` or ``size.longest_edge``) where it is on this machine (a
    built-in, a folder, the hub cache: nothing is downloaded); None when unknown."""
    if cfg.data.max_pixels:
        return cfg.data.max_pixels
    start = start_of(cfg.model.name_or_path)
    name = start.tokenizer or start.base  # a trained result's processor, saved with it
    try:
        folder = builtin.ensure_builtin_model(name) if builtin.is_builtin(name) else None
        from transformers.utils import cached_file

        path = cached_file(str(folder or name), "preprocessor_config.json", local_files_only=True,
                           _raise_exceptions_for_missing_entries=False)  # fmt: skip
        found = json.loads(Path(path).read_text(encoding="utf-8")) if path else {}
    except Exception:  # noqa: BLE001 - advisory: the estimate falls back to data.max_length
        return None
    size = found.get("size") if isinstance(found.get("size"), dict) else {}
    value = found.get("max_pixels") or size.get("longest_edge")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def set_pixel_bounds(
    image_processor: BaseImageProcessor, min_pixels: int | None, max_pixels: int | None
) -> None:
    """``data.min_pixels``/``data.max_pixels`` on a Qwen2-VL-style image processor (which resizes
    each image to an area within ``size.shortest_edge``..``size.longest_edge`` pixels)."""
    if min_pixels is None and max_pixels is None:
        return
    size = getattr(image_processor, "size", None)
    edges = {
        k: size.get(k) if isinstance(size, dict) else getattr(size, k, None)
        for k in ("shortest_edge", "longest_edge")
    }
    if None in edges.values() or not hasattr(image_processor, "merge_size"):
        raise XtrainError(
            f"data.min_pixels/max_pixels need a Qwen2-VL-style image processor that bounds the image "
            f"area; {type(image_processor).__name__} resizes to {size}",
            "leave data.min_pixels and data.max_pixels unset for this model",
        )
    current = edges
    low = min_pixels if min_pixels is not None else current["shortest_edge"]
    high = max_pixels if max_pixels is not None else current["longest_edge"]
    if low > high:
        raise XtrainError(
            f"the image area bounds are {low}..{high} pixels: the minimum is above the maximum",
            "set data.min_pixels <= data.max_pixels",
        )
    if isinstance(size, dict):
        image_processor.size = {**size, "shortest_edge": low, "longest_edge": high}
    else:  # transformers 5: a SizeDict dataclass
        import dataclasses

        image_processor.size = dataclasses.replace(size, shortest_edge=low, longest_edge=high)
    for name, value in (("min_pixels", low), ("max_pixels", high)):  # older processors read these
        if hasattr(image_processor, name):
            setattr(image_processor, name, value)


NAME = "vision-language"


def check_model_type(source: str, trust_remote_code: bool) -> PretrainedConfig:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return models.require_model_type(
        source,
        trust_remote_code,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        "a vision-language one (Qwen2-VL, LLaVA, SmolVLM)",
        "vision-language takes AutoModelForImageTextToText checkpoints",
    )


def processor_and_render(
    cfg: TrainConfig, main_process_first: MainProcessFirst
) -> tuple[str, ProcessorMixin, Render]:
    """(the model's folder or hub id, its processor with ``data.min_pixels``/``max_pixels``, the
    renderer of its chat template or ``data.chat_template``)."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks import common

    d = cfg.data
    source = common.media_source(cfg, main_process_first, check_model_type)
    processor = load_processor(common.processor_source(cfg, source), cfg.model.trust_remote_code)
    set_pixel_bounds(processor.image_processor, d.min_pixels, d.max_pixels)
    template = chat_data.require_template(processor, chat_data.load_template(d.chat_template), source)
    if d.chat_template is not None:
        processor.chat_template = template  # saved with the adapter: predict renders the same way
    return source, processor, chat_data.renderer(processor, template, d.chat_template)
