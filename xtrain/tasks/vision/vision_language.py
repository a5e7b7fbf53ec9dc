"""``vision-language``: a decoder-only vision-language model (Qwen2-VL, Qwen2.5-VL, and other
``AutoModelForImageTextToText`` checkpoints with the same processor contract) learns from image +
text conversations; evaluated by eval loss and by generating answers (normalised exact match).

- Model: a local folder, a hub id or ``builtin:tiny-qwen2-vl``, with its ``AutoProcessor``. Where
  the processor cannot be built because its video half needs torchvision (Qwen2-VL's), the same
  processor class is built without the video half from the checkpoint's image processor and
  tokenizer. ``data.min_pixels``/``data.max_pixels`` bound the image area (Qwen2-VL-style
  processors: fewer pixels, fewer image tokens, less memory).
- Data: ``messages`` conversations (``xtrain.data.rows.chat``), images as paths relative to
  the data file (or ``data.image_root``) or from ``data.images_column``; also LLaMA-Factory / LLaVA
  rows (``<image>`` placeholders, sharegpt turns) and flat image + question + answer rows
  (``vision_rows``); the processor's chat template renders them; only the
  assistant's tokens carry loss (``xtrain.data.rows.vision_chat``); checked before the run by
  ``check`` (the data check).
- LoRA: the language model's attention and MLP projections (``lora.target_modules: auto``) with
  the vision tower frozen; ``lora.projector`` also trains the projector/merger whole (saved with
  the adapter through peft's ``modules_to_save``), ``lora.vision_blocks`` adds adapters to the
  vision tower's blocks. Full fine-tune (``lora.enabled: false``) trains all but the vision tower
  (``model.freeze_vision``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.errors import XtrainError, shown
from xtrain.model import load as models
from xtrain.model import lora, lora_layers
from xtrain.tasks import contract, prompt_predict
from xtrain.tasks import stacks as st
from xtrain.tasks.contract import (
    FileRows,
    MainProcessFirst,
    Predicts,
    Quickstart,
    SequenceEntry,
    Task,
    Workload,
)
from xtrain.tasks.predicting import exact_match
from xtrain.tasks.vision import check as vision_check
from xtrain.tasks.vision.processor import NAME, load_processor, max_pixels, processor_and_render

if TYPE_CHECKING:
    from peft import PeftModel
    from torch.nn import Module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.config.schema import LoraConfig, TrainConfig
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run

LANGUAGE_MODEL = ("language_model", "text_model")  # Qwen2-VL, LLaVA / Idefics3, SmolVLM
VISION_TOWER = ("visual", "vision_tower", "vision_model")
PROJECTOR = ("merger", "multi_modal_projector", "connector", "mm_projector")
# The language model's attention and MLP projections (Qwen2, Llama, Mistral, Gemma, SmolLM).
LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------------------------------------
# Model


def find_part(model: Module, names: tuple[str, ...], within: str | None = None) -> str | None:
    """The qualified name of the outermost module whose own name is one of ``names``."""
    found = [
        q
        for q, _ in model.named_modules()
        if q.rsplit(".", 1)[-1] in names and (within is None or q.startswith(within + "."))
    ]
    return min(found, key=lambda q: q.count("."), default=None)


def _under(name: str, prefix: str | None) -> bool:
    return prefix is not None and (name == prefix or name.startswith(prefix + "."))


def parts(model: Module) -> tuple[str, str | None, str | None]:
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


def lora_targets(model: Module, lora_cfg: LoraConfig) -> list[str]:
    """Qualified names of the Linear layers that get adapters."""
    language, vision, projector = parts(model)
    layers = lora_layers.linear_layers(model)
    explicit = lora_cfg.target_modules
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    in_language = {q: leaf for q, leaf in layers.items() if _under(q, language)}
    if lora_layers.is_all_linear(lora_cfg.target_modules):  # every Linear of the language model, no head
        body = lora_layers.body_layers(model)
        in_language = {q: leaf for q, leaf in in_language.items() if q in body}
        names = set(in_language.values())
    elif isinstance(explicit, list):
        names = set(explicit)
    else:
        names = {leaf for leaf in in_language.values() if leaf in LANGUAGE_TARGETS}
        if not names:
            names = set(lora_layers.find_target_modules(_module(model, language)))
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
            f"lora.target_modules {shown(lora_cfg.target_modules)} matched no layer of the language model",
            f"Linear layers it has: {available}",
        )
    return targets


def _module(model: Module, name: str) -> Module:
    return model.get_submodule(name)


def apply_lora(model: Module, lora_cfg: LoraConfig) -> PeftModel:
    save = list(lora_cfg.modules_to_save or [])
    if lora_cfg.projector:
        projector = parts(model)[2]
        if projector is None:
            raise XtrainError(
                f"lora.projector: cannot find the projector inside {type(model).__name__}",
                "set lora.projector=false, or name it in lora.modules_to_save",
            )
        save.append(projector)
    return lora.adapt(model, lora_cfg, lora_targets(model, lora_cfg), save, "language model")


def full_fine_tune(model: Module, cfg: TrainConfig) -> None:
    """Everything trains, but the vision tower (not its projector) with ``model.freeze_vision``."""
    _, vision, projector = parts(model)
    for name, p in model.named_parameters():
        frozen = cfg.model.freeze_vision and _under(name, vision) and not _under(name, projector)
        p.requires_grad_(not frozen)


def lora_plan(model: Module, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    whole = list(cfg.lora.modules_to_save or [])
    projector = parts(model)[2] if cfg.lora.projector else None
    return lora_targets(model, cfg.lora), whole + ([projector] if projector else [])


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The vision tower runs an image's patches (Qwen2-VL: ``data.max_pixels``, else the
    processor's, in patches of 14 x 14, at most 2 x 2 a text position; fixed-size towers such as
    LLaVA's CLIP: (image / patch)^2 + 1), its merger the merged patches, and the language model
    ``data.max_length`` positions, image tokens included (the collator cuts there). One image a
    sample."""
    language, vision, projector = parts(model)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config.text_config
    lm = st.from_config("language model", model, language, text, cfg.data.max_length, cfg, embeds=True,
                        follows=True, text=True)  # fmt: skip
    vc = getattr(config, "vision_config", None)
    if vision is None or vc is None:
        return [lm]
    merge = st.first(vc, "spatial_merge_size") or 1
    width = st.first(vc, "embed_dim", "hidden_size") or 0
    patch = st.first(vc, "patch_size") or 14
    if hasattr(vc, "image_size") and not hasattr(vc, "spatial_merge_size"):
        patches = st.patches(vc)  # a fixed-size tower
    else:
        pixels = max_pixels(cfg)
        cap = merge * merge * cfg.data.max_length  # more would not fit data.max_length
        patches = min(pixels // (patch * patch), cap) if pixels else cap
    # a trained patch embedding keeps its input: channels x frames x patch area a patch
    channels = st.first(vc, "in_channels", "in_chans", "num_channels") or 3
    stem = channels * (st.first(vc, "temporal_patch_size") or 1) * patch * patch
    found = [st.from_config("vision tower", model, vision, vc, patches, cfg, hidden=width, stem=stem)]
    if projector is not None:  # Qwen2-VL's merger: a norm, then an MLP over 2 x 2 patches at a time
        merged = width * merge * merge
        found.append(st.Stack("projector", patches // (merge * merge), 1, merged, merged, 1,
                              module=projector, mlp_only=True, follows=True))  # fmt: skip
    return [*found, lm]


def fix_generation(model: Module, tokenizer: PreTrainedTokenizerBase) -> None:
    gen = model.generation_config
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id


# ---------------------------------------------------------------------------------------------
# Data


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.data.rows import vision_rows
    from xtrain.data.rows.vision_chat import ANSWER_KEY, GEN_PREFIX, VisionChatCollator
    from xtrain.tasks import common, data_check

    cfg = run.cfg
    d = cfg.data
    source, processor, render = processor_and_render(cfg, main_process_first)
    with main_process_first():
        train, eval_ds, train_name, eval_name = common.raw_datasets(cfg)
        train_dir, eval_dir = common.media_dirs(cfg, "image")
    sets = [(train, train_name, "train"), (eval_ds, eval_name, "eval")]
    first = data_check.loaded_samples(cfg, sets)
    report = vision_check.inspect(cfg, (processor, render), first, [])  # the data check: first rows first
    tokenizer = processor.tokenizer
    with main_process_first():  # the first process encodes (datasets' cache), the others read it
        train_rows = vision_rows.rows(
            train, cfg, train_name, train_dir, render, tokenizer, with_prompts=False
        )
        eval_rows = None
        if eval_ds is not None:
            eval_rows = vision_rows.rows(eval_ds, cfg, eval_name, eval_dir, render, tokenizer, True, "eval")

    model = common.load_media_model(run, TASK, source)
    fix_generation(model, tokenizer)
    return Workload(
        model=common.finish_model(model, cfg, TASK, apply_lora),
        train_dataset=train_rows,
        collator=VisionChatCollator(processor, d.max_length, common.pad_multiple(run.device)),
        eval_dataset=eval_rows,
        tokenizer=processor,
        main_metric="exact_match",
        tokens_key="attention_mask",
        evaluate=common.generation_eval(
            cfg,
            tokenizer,
            normalize=True,
            prompt_prefix=GEN_PREFIX,
            answer_key=ANSWER_KEY,
            error_rates=False,
            exact_match=True,
        ),
        data_report=report,
    )


def validate(cfg: TrainConfig) -> None:
    from xtrain.data.rows.vision_rows import VISION_FORMATS

    d = cfg.data
    if d.row_format not in VISION_FORMATS:
        raise XtrainError(
            f"data.row_format={d.row_format} is not a vision-language row format",
            f"use one of {', '.join(VISION_FORMATS)} (docs/vision-language.md#data)",
        )
    if d.prompt_column is not None and d.row_format not in ("auto", "prompt_response"):
        raise XtrainError(
            f"data.prompt_column is for image + question + answer rows, and data.row_format={d.row_format}",
            "leave data.prompt_column unset, or set data.row_format=prompt_response",
        )
    if d.min_pixels is not None and d.max_pixels is not None and d.min_pixels > d.max_pixels:
        raise XtrainError(
            f"data.min_pixels={d.min_pixels} is above data.max_pixels={d.max_pixels}",
            "set data.min_pixels <= data.max_pixels",
        )


def _image_text_to_text(model_type: str | None) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def quickstart_inputs(data: str = "builtin:shapes-vqa", turns: str = "messages") -> list[str]:
    """``xtrain predict``'s arguments for a built-in job: the image and question of the first
    user turn of ``data``'s first eval row (its conversation under ``turns``)."""
    folder, row = builtin.first_eval_row(data)
    parts_ = row[turns][0]["content"]
    image = next(p["image"] for p in parts_ if p["type"] == "image")
    return [str(folder / image), "--question", next(p["text"] for p in parts_ if p["type"] == "text")]


# ---------------------------------------------------------------------------------------------
# Predict: an image and a question -> the answer


def load_for_predict(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    from transformers import AutoModelForImageTextToText

    processor = load_processor(str(folder), False)  # saved with the adapter
    base_load = record.get(contract.BASE_LOAD, {})  # a quantized run's base: in 4/8 bits
    model = models.load_pretrained(AutoModelForImageTextToText, base, "auto", False, **base_load)
    fix_generation(model, processor.tokenizer)
    return model, processor.tokenizer, {"processor": processor}


TASK = Task(
    name=NAME,
    decodes_media=True,
    about="image + text conversations (Qwen2-VL); metric: exact match of generated answers",
    build=build,
    aliases=("vlm", "image-text-to-text"),
    keys=frozenset(
        {
            "model.chunked_loss",
            "model.quantization",
            "data.row_format",
            "data.messages_column",
            "data.images_column",
            "data.image_column",
            "data.image_root",
            "data.prompt_column",
            "data.response_column",
            "data.role_tag",
            "data.content_tag",
            "data.user_tag",
            "data.assistant_tag",
            "data.system_tag",
            "data.chat_template",
            "data.min_pixels",
            "data.max_pixels",
            "data.group_by_length",
            "lora.projector",
            "lora.vision_blocks",
            "model.freeze_vision",
            "generation.max_new_tokens",
            "generation.num_beams",
            "generation.sample_predictions",
        }
    ),
    validate=validate,
    token_loss="next-token",
    # parallel.sequence: the images merged and the M-RoPE positions computed on the whole row on
    # every process, the rows cut at the language model's entry (xtrain/model/sequence_entry.py)
    sequence_parallel=True,
    sequence_entry=SequenceEntry(decoder=lambda model: parts(model)[0], families=("qwen2_vl", "qwen2_5_vl")),
    curves=(contract.Curve("exact match (normalised answers)", eval=("exact_match",)),),
    model_class="AutoModelForImageTextToText",
    lora_plan=lora_plan,
    full_fine_tune=full_fine_tune,
    unquantized=VISION_TOWER + PROJECTOR,  # 4/8 bits for the language model only
    image_tokens=True,
    stacks=stacks,
    # the eval prompt: the conversation up to the answer, image tokens included, within data.max_length
    generation_prompt=lambda cfg: cfg.data.max_length,
    resume_keys=("lora.projector", "lora.vision_blocks", "model.freeze_vision"),
    recognizes=lambda config: _image_text_to_text(config.get("model_type")),
    predicts=Predicts(
        takes="images with --question TEXT",
        load=load_for_predict,
        run=prompt_predict.vision_predict,
        file=FileRows(
            rows="image + text conversations (messages), as the run trained",
            read=prompt_predict.read_vision_file,
            answer=prompt_predict.vision_answer,
            score=exact_match,
        ),
        samples=True,
    ),
    check_data=vision_check.check_data,
    quickstart=Quickstart(
        job="quickstart-vision-language.yaml",
        about="questions about images",
        next_command="xtrain train examples/vision-language-qwen2-vl.yaml",
        headline=("exact_match", "exact match", "share of answers right; 1 is perfect"),
        predict_args=quickstart_inputs,
    ),
)
