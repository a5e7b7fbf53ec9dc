"""``vision-language``: a decoder-only vision-language model (Qwen2-VL, Qwen2.5-VL, and other
``AutoModelForImageTextToText`` checkpoints with the same processor contract) learns from image +
text conversations; evaluated by eval loss and by generating answers (normalised exact match).

- Model: a local folder, a hub id or ``builtin:tiny-qwen2-vl``, with its ``AutoProcessor``. Where
  the processor cannot be built because its video half needs torchvision (Qwen2-VL's), the same
  processor class is built without the video half from the checkpoint's image processor and
  tokenizer. ``data.min_pixels``/``data.max_pixels`` bound the image area (Qwen2-VL-style
  processors: fewer pixels, fewer image tokens, less memory).
- Data: ``messages`` conversations (``xtrain.train.tasks.chat_data``), images as paths relative to
  the data file or from ``data.images_column``; the processor's chat template renders them; only
  the assistant's tokens carry loss (``xtrain.train.tasks.vision_chat``).
- LoRA: the language model's attention and MLP projections (``lora.target_modules: auto``) with
  the vision tower frozen; ``lora.projector`` also trains the projector/merger whole (saved with
  the adapter through peft's ``modules_to_save``), ``lora.vision_blocks`` adds adapters to the
  vision tower's blocks. Full fine-tune (``lora.enabled: false``) trains all but the vision tower
  (``model.freeze_vision``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train import lora, models
from xtrain.train.config import TrainConfig
from xtrain.train.generation import GenerationEval
from xtrain.train.tasks import chat_data
from xtrain.train.tasks.image_data import resolve_path, undecoded
from xtrain.train.tasks.image_to_text import base_dir
from xtrain.train.tasks.vision_chat import ANSWER_KEY, GEN_PREFIX, VisionChatCollator, VisionChatRows
from xtrain.train.workload import Workload

LANGUAGE_MODEL = ("language_model", "text_model")  # Qwen2-VL, LLaVA / Idefics3, SmolVLM
VISION_TOWER = ("visual", "vision_tower", "vision_model")
PROJECTOR = ("merger", "multi_modal_projector", "connector", "mm_projector")
# The language model's attention and MLP projections (Qwen2, Llama, Mistral, Gemma, SmolLM).
LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------------------------------------
# Processor


_IMAGE_ONLY: dict[type, type] = {}


def image_only_processor(base: type, image_processor: Any, tokenizer: Any, chat_template: str | None) -> Any:
    """``base`` (e.g. ``Qwen2VLProcessor``) without its video processor: the same text and image
    handling, for machines without torchvision (which the video processor needs). Pickles by
    rebuilding (spawned DataLoader workers)."""
    cls = _IMAGE_ONLY.get(base)
    if cls is None:

        def __init__(
            self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None
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


def load_processor(source: str, trust_remote_code: bool) -> Any:
    """The checkpoint's ``AutoProcessor`` (image processor + tokenizer + chat template)."""
    import transformers

    local = Path(source).exists()
    error: Exception | None = None
    processor: Any = None
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


def set_pixel_bounds(image_processor: Any, min_pixels: int | None, max_pixels: int | None) -> None:
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


# ---------------------------------------------------------------------------------------------
# Model


def check_model_type(source: str, trust_remote_code: bool) -> Any:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return models.require_model_type(
        source,
        trust_remote_code,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        "a vision-language one (Qwen2-VL, LLaVA, SmolVLM)",
        "vision-language takes AutoModelForImageTextToText checkpoints",
    )


def load_model(source: str, dtype: str, trust_remote_code: bool) -> Any:
    from transformers import AutoModelForImageTextToText

    return models.load_pretrained(AutoModelForImageTextToText, source, dtype, trust_remote_code)


def find_part(model: Any, names: tuple[str, ...], within: str | None = None) -> str | None:
    """The qualified name of the outermost module whose own name is one of ``names``."""
    found = [
        q
        for q, _ in model.named_modules()
        if q.rsplit(".", 1)[-1] in names and (within is None or q.startswith(within + "."))
    ]
    return min(found, key=lambda q: q.count("."), default=None)


def _under(name: str, prefix: str | None) -> bool:
    return prefix is not None and (name == prefix or name.startswith(prefix + "."))


def parts(model: Any) -> tuple[str, str | None, str | None]:
    """(language model, vision tower, projector) module names."""
    language = find_part(model, LANGUAGE_MODEL)
    if language is None:
        raise XtrainError(
            f"cannot find the language model inside {type(model).__name__}",
            "set lora.target_modules to the module names to adapt",
        )
    vision = find_part(model, VISION_TOWER)
    projector = find_part(model, PROJECTOR)
    return language, vision, projector


def lora_targets(model: Any, lora_cfg: Any) -> list[str]:
    """Qualified names of the Linear layers that get adapters."""
    language, vision, projector = parts(model)
    layers = lora.linear_layers(model)
    explicit = lora_cfg.target_modules
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    in_language = {q: leaf for q, leaf in layers.items() if _under(q, language)}
    if isinstance(explicit, list):
        names = set(explicit)
    else:
        names = {leaf for leaf in in_language.values() if leaf in LANGUAGE_TARGETS}
        if not names:
            names = set(lora.find_target_modules(_module(model, language)))
    targets = [q for q, leaf in in_language.items() if leaf in names]
    if lora_cfg.vision_blocks:
        if vision is None:
            raise XtrainError(
                f"lora.vision_blocks: cannot find the vision tower inside {type(model).__name__}",
                "set lora.vision_blocks=false",
            )
        targets += [q for q in layers if _under(q, vision) and not _under(q, projector)]
    if not targets:
        available = ", ".join(sorted(set(in_language.values()))[:16])
        raise XtrainError(
            f"lora.target_modules {lora_cfg.target_modules} matched no layer of the language model",
            f"Linear layers it has: {available}",
        )
    return targets


def _module(model: Any, name: str) -> Any:
    return model.get_submodule(name)


def apply_lora(model: Any, lora_cfg: Any) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model

    save = list(lora_cfg.modules_to_save or [])
    if lora_cfg.projector:
        projector = parts(model)[2]
        if projector is None:
            raise XtrainError(
                f"lora.projector: cannot find the projector inside {type(model).__name__}",
                "set lora.projector=false, or name it in lora.modules_to_save",
            )
        save.append(projector)
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=lora_targets(model, lora_cfg),
        modules_to_save=save or None,
    )
    peft_model = get_peft_model(model, config)
    for p in peft_model.parameters():  # trained weights stay float32 (see lora.apply_lora)
        if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.float()
    return peft_model


def full_fine_tune(model: Any, freeze_vision: bool) -> None:
    """Everything trains, but the vision tower (not its projector) when ``freeze_vision``."""
    _, vision, projector = parts(model)
    for name, p in model.named_parameters():
        frozen = freeze_vision and _under(name, vision) and not _under(name, projector)
        p.requires_grad_(not frozen)


def fix_generation(model: Any, tokenizer: Any) -> None:
    gen = model.generation_config
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id


def check_length(model: Any, max_length: int) -> None:
    text = getattr(model.config, "text_config", model.config)
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and 0 < limit < max_length:
        raise XtrainError(
            f"data.max_length={max_length} is above the model's limit of {limit} positions",
            f"set data.max_length={limit} or less",
        )


# ---------------------------------------------------------------------------------------------
# Data


def conversations(
    ds: Any,
    cfg: TrainConfig,
    name: str,
    folder: Path | None,
    render: chat_data.Render,
    tokenizer: Any,
    with_prompts: bool,
) -> VisionChatRows:
    """Every row checked and rendered (one line naming the first bad row), its images found."""
    d = cfg.data
    ds = undecoded(ds, d.images_column)
    messages = chat_data.messages_column_of(ds, d.messages_column, name)
    images = ds[d.images_column] if d.images_column in ds.column_names else [None] * len(ds)
    encoded, refs, rows = [], [], []
    for row, (cell, extra) in enumerate(zip(messages, images, strict=True)):
        where = f"row {row} of {name}"
        conv = chat_data.parse_conversation(cell, row, name, extra, allow_images=True)
        for ref in conv.images:
            if isinstance(ref, str) and not resolve_path(ref, folder).is_file():
                raise chat_data.BadConversation(f"image {resolve_path(ref, folder)} ({where}) not found")
        enc = chat_data.encode(render, tokenizer, conv, where)
        if all(t == -100 for t in enc.labels[: d.max_length][1:]):
            continue  # every answer lies past data.max_length (the causal-lm rule: dropped)
        encoded.append(enc)
        refs.append(conv.images)
        rows.append(row)
    if not encoded:
        raise XtrainError(
            f"no conversation of {name} has an assistant answer within data.max_length={d.max_length}",
            "raise data.max_length",
        )
    return VisionChatRows(encoded, refs, rows, folder, name, with_prompts=with_prompts)


def build_vision_language(cfg: TrainConfig, main_process_first: Any = contextlib.nullcontext) -> Workload:
    from xtrain.train.tasks.common import raw_datasets

    d, m = cfg.data, cfg.model
    with main_process_first():  # a built-in model is written once, by the first process
        source = models.resolve_model(m.name_or_path)
    check_model_type(source, m.trust_remote_code)
    processor = load_processor(source, m.trust_remote_code)
    set_pixel_bounds(processor.image_processor, d.min_pixels, d.max_pixels)
    template = chat_data.require_template(processor, chat_data.load_template(d.chat_template), source)
    render = chat_data.renderer(processor, template)
    if d.chat_template is not None:
        processor.chat_template = template  # saved with the adapter: predict renders the same way
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        train_dir = base_dir(d.train or "", "train")
        eval_dir = base_dir(d.eval, "eval") if d.eval else train_dir
    tokenizer = processor.tokenizer
    train_rows = conversations(train, cfg, train_name, train_dir, render, tokenizer, with_prompts=False)
    eval_rows = None
    if eval_ds is not None:
        eval_rows = conversations(eval_ds, cfg, eval_name, eval_dir, render, tokenizer, with_prompts=True)

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = load_model(source, m.dtype, m.trust_remote_code)
    check_length(model, d.max_length)
    fix_generation(model, tokenizer)
    if m.gradient_checkpointing:
        lora.enable_gradient_checkpointing(model, cfg.lora.enabled)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    else:
        full_fine_tune(model, m.freeze_vision)
    g = cfg.generation
    import torch

    return Workload(
        model=model,
        train_dataset=train_rows,
        collator=VisionChatCollator(processor, d.max_length, 8 if torch.cuda.is_available() else None),
        eval_dataset=eval_rows,
        tokenizer=processor,
        main_metric="exact_match",
        tokens_key="attention_mask",
        evaluate=GenerationEval(
            tokenizer=tokenizer,
            max_new_tokens=g.max_new_tokens,
            num_beams=g.num_beams,
            sample_predictions=g.sample_predictions,
            normalize=True,
            prompt_prefix=GEN_PREFIX,
            answer_key=ANSWER_KEY,
            error_rates=False,
            exact_match=True,
        ),
    )
