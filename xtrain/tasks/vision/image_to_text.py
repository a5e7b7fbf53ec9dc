"""``image-to-text``: a ``VisionEncoderDecoderModel`` (TrOCR, ViT-GPT2, Donut-style) learns to
write the text of an image; evaluated by generating (CER, WER, eval loss).

- Model: a local folder, a hub id or ``builtin:tiny-trocr``; the image processor and tokenizer
  from ``AutoProcessor`` when the checkpoint has one, else ``AutoImageProcessor`` +
  ``AutoTokenizer``. ``decoder_start_token_id`` / ``pad_token_id`` / ``eos_token_id`` are filled
  in when the checkpoint leaves them out (training fails, or generation never starts, without).
- LoRA: ``lora.apply_to`` (both | encoder | decoder) picks the half that gets adapters; the
  auto targets are the attention projections of each half (ViT/DeiT/BEiT/Swin encoders;
  TrOCR, GPT-2, BERT/RoBERTa, mBART decoders). ``lora.enabled: false`` trains everything.
- Data: see ``xtrain.data.rows.images`` (paths relative to the data file, ``imagefolder`` with
  metadata, ``Image`` features; read lazily, converted to RGB).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.data.sources import undecoded_row
from xtrain.model import load as models
from xtrain.model import lora, lora_layers
from xtrain.tasks import contract
from xtrain.tasks import stacks as st
from xtrain.tasks.contract import (
    Example,
    FileRows,
    Loaded,
    MainProcessFirst,
    PredictRequest,
    Predicts,
    Quickstart,
    Task,
    Workload,
)
from xtrain.tasks.data_report import DataReport
from xtrain.tasks.predicting import (
    error_rates,
    file_examples,
    file_rows,
    generate_texts,
    image_limit,
    in_batches,
    load_file,
    media_examples,
    media_files,
    open_images,
    references,
    refuse_prompts,
)

if TYPE_CHECKING:
    from types import SimpleNamespace

    from datasets import Dataset
    from peft import PeftModel
    from torch.nn import Module
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
    from transformers.image_processing_utils import BaseImageProcessor

    from xtrain.config.schema import LoraConfig, TrainConfig
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run
    from xtrain.tasks.data_check import Sample

NAME = "image-to-text"

_QKV = ("query", "key", "value", "q_proj", "k_proj", "v_proj")  # both spellings across transformers versions
_QKVO = ("q_proj", "k_proj", "v_proj", "out_proj")
# model_type -> the attention projections LoRA adapts (those present in the model are kept).
ENCODER_TARGETS: dict[str, tuple[str, ...]] = {
    t: _QKV for t in ("vit", "deit", "beit", "swin", "swinv2", "donut-swin", "dinov2", "convnext")
}
DECODER_TARGETS: dict[str, tuple[str, ...]] = {
    "trocr": _QKVO,
    "gpt2": ("c_attn", "q_attn"),  # self-attention q/k/v, and cross-attention k/v + q
    "bert": _QKV,
    "roberta": _QKV,
    "xlm-roberta": _QKV,
    "electra": _QKV,
    "mbart": _QKVO,
    "bart": _QKVO,
}
PARTS = {"both": ("encoder", "decoder"), "encoder": ("encoder",), "decoder": ("decoder",)}


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The image encoder runs all its patches (TrOCR-base: (384 / 16)^2 + 1 = 577), the decoder the
    text's tokens, reading every patch in each layer's cross-attention."""
    enc, dec = model.config.encoder, model.config.decoder
    positions = st.patches(enc)
    encoder = st.from_config("encoder", model, "encoder", enc, positions, cfg, stem=st.patch_stem(enc))
    width = encoder.hidden
    decoder = st.from_config("decoder", model, "decoder", dec, cfg.data.max_length, cfg, cross=positions,
                             cross_hidden=width, embeds=True, text=True)  # fmt: skip
    return [encoder, decoder]


def load_processors(
    source: str, trust_remote_code: bool
) -> tuple[BaseImageProcessor, PreTrainedTokenizerBase, ProcessorMixin | models.ProcessorFiles]:
    """(image processor, tokenizer, what to save with the adapter)."""
    return models.load_processors(source, trust_remote_code, "image_processor")


def check_model_type(source: str, trust_remote_code: bool) -> None:
    """Only vision encoder-decoder checkpoints (loaded as VisionEncoderDecoderModel, remote code or not)."""
    models.require_model_type(
        source,
        trust_remote_code,
        ("vision-encoder-decoder",),
        "a vision encoder-decoder (TrOCR, ViT-GPT2, Donut)",
        "image-to-text takes VisionEncoderDecoderModel checkpoints; other models need a custom task",
        remote_ok=False,
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def fix_special_tokens(model: Module, tokenizer: PreTrainedTokenizerBase) -> None:
    """Decoder start, pad and eos ids on the model config and the generation config, taken from
    the checkpoint where set, else from the tokenizer (TrOCR and GPT-2 checkpoints often lack them)."""
    config, decoder, gen = model.config, model.config.decoder, model.generation_config
    start = _first(
        getattr(config, "decoder_start_token_id", None),
        getattr(gen, "decoder_start_token_id", None),
        getattr(decoder, "decoder_start_token_id", None),
        tokenizer.bos_token_id,
        tokenizer.cls_token_id,
        tokenizer.eos_token_id,
    )
    pad = _first(
        getattr(config, "pad_token_id", None), getattr(decoder, "pad_token_id", None), tokenizer.pad_token_id
    )
    eos = _first(
        getattr(config, "eos_token_id", None),
        getattr(decoder, "eos_token_id", None),
        tokenizer.eos_token_id,
        tokenizer.sep_token_id,
    )
    from xtrain.tasks.common import set_decoder_tokens

    vocab = ("decoder", getattr(decoder, "vocab_size", None))
    set_decoder_tokens(model, tokenizer, start, pad, vocab, eos_token_id=eos)


def _auto_names(part: Module, table: dict[str, tuple[str, ...]]) -> list[str]:
    model_type = getattr(getattr(part, "config", None), "model_type", None)
    leaves = set(lora_layers.linear_layers(part).values())
    names = [n for n in table.get(model_type or "", ()) if n in leaves]
    return names or lora_layers.find_target_modules(part)


def target_pattern(model: Module, lora_cfg: LoraConfig) -> str:
    """A peft ``target_modules`` regex (full match on module names) for the chosen halves."""
    explicit = lora_cfg.target_modules
    if lora_layers.is_all_linear(explicit):  # every Linear of the chosen halves but the heads and the pooler
        parts = PARTS[lora_cfg.apply_to]
        body = lora_layers.body_layers(model)
        return lora_layers.exact_pattern([q for q in body if q.split(".")[0] in parts])
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    alternatives = []
    for part in PARTS[lora_cfg.apply_to]:
        if isinstance(explicit, list):
            names = explicit
        else:
            names = _auto_names(
                getattr(model, part), ENCODER_TARGETS if part == "encoder" else DECODER_TARGETS
            )
        alternatives.append(rf"{part}\..*\.(?:{'|'.join(re.escape(n) for n in names)})")
    return "^(?:" + "|".join(alternatives) + ")$"


def apply_lora(model: Module, lora_cfg: LoraConfig) -> PeftModel:
    where = lora_cfg.apply_to if lora_cfg.apply_to != "both" else "encoder or decoder"
    return lora.apply_lora_matching(model, lora_cfg, target_pattern(model, lora_cfg), where)


def full_fine_tune(model: Module, cfg: TrainConfig) -> None:
    """Everything trains but the encoder's pooler, which the decoder never reads."""
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith("encoder.pooler."))


def decoder_positions(config: PretrainedConfig | SimpleNamespace) -> tuple[str, int | None]:
    """Labels and generated text go through the decoder: its position table is the limit."""
    return "decoder", getattr(getattr(config, "decoder", None), "max_position_embeddings", None)


def lora_plan(model: Module, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    whole = list(cfg.lora.modules_to_save or [])
    return lora_layers.layers_matching(model, target_pattern(model, cfg.lora)), whole


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.data.rows.images import ImageTextCollator, ImageTextRows
    from xtrain.tasks import common, data_check

    cfg = run.cfg
    d = cfg.data
    source = common.media_source(cfg, main_process_first, check_model_type)
    found = common.processor_source(cfg, source)
    image_processor, tokenizer, saver = load_processors(found, cfg.model.trust_remote_code)
    columns = {"data.image_column": d.image_column, "data.text_column": d.text_column}
    (train, train_name, train_dir), (eval_ds, eval_name, eval_dir) = common.image_datasets(
        cfg, main_process_first, columns
    )
    sets = [(train, train_name, "train"), (eval_ds, eval_name, "eval")]
    report = inspect(cfg, tokenizer, data_check.loaded_samples(cfg, sets), [])  # the data check

    def rows(ds: Dataset, folder: Path | None, name: str) -> ImageTextRows:
        return ImageTextRows(ds, d.image_column, d.text_column, folder, name, max_pixels=d.max_image_pixels)

    train_rows = rows(train, train_dir, train_name)
    eval_rows = rows(eval_ds, eval_dir, eval_name) if eval_ds is not None else None

    model = common.load_media_model(run, TASK, source)
    fix_special_tokens(model, tokenizer)
    pooler = getattr(model.encoder, "pooler", None)
    if pooler is not None:  # unused by the decoder: frozen, or DDP waits for its gradients
        pooler.requires_grad_(False)
    return Workload(
        model=common.finish_model(model, cfg, TASK, apply_lora),
        train_dataset=train_rows,
        collator=ImageTextCollator(image_processor, tokenizer, d.max_length),
        eval_dataset=eval_rows,
        tokenizer=saver,
        main_metric="cer",
        tokens_key=None,
        evaluate=common.generation_eval(cfg, tokenizer),
        data_report=report,
    )


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    from xtrain.tasks import common, data_check

    def tokenizer() -> PreTrainedTokenizerBase:
        source = common.media_source(cfg, contextlib.nullcontext, check_model_type)
        return load_processors(source, cfg.model.trust_remote_code)[1]

    samples, notes = data_check.first_samples(cfg, limit)
    return inspect(cfg, data_check.loaded_or_note(cfg, notes, tokenizer), samples, notes)


def inspect(
    cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], notes: list[str]
) -> DataReport:
    """Columns and image files as ``common.image_datasets`` checks them, the texts as the run's
    collator labels them (``ImageTextCollator.labels``: every token trained)."""
    from xtrain.data.rows.images import ImageTextCollator, check_image_files
    from xtrain.data.tokenize import require_columns
    from xtrain.tasks import data_check

    d = cfg.data
    report = DataReport(NAME, d.max_length, notes=notes)
    for s in samples:
        require_columns(s.ds, {"data.image_column": d.image_column, "data.text_column": d.text_column},
                             s.name)  # fmt: skip
        check_image_files(s.ds, d.image_column, s.folder, s.name)
        check = s.check()
        report.sources.append(check)
        if tokenizer is None:
            continue
        texts = ["" if t is None else str(t) for t in s.ds[d.text_column]]
        whole = ImageTextCollator(None, tokenizer, data_check.NO_CUT).labels(texts)
        check.lengths = [len(ids) for ids in whole]
        check.truncated = sum(n > d.max_length for n in check.lengths)
        if s.role == "train" and report.example is None:
            labels = ImageTextCollator(None, tokenizer, d.max_length).labels(texts[:1])[0]
            cell = undecoded_row(s.ds, 0, d.image_column)[d.image_column]
            image = data_check.image_line(cell, s.folder)
            report.example = data_check.example_of(s, 0, tokenizer, labels, labels, inputs=[image])
            report.example.note = "the decoder writes these tokens (all trained) after its start token"
    return report


# ---------------------------------------------------------------------------------------------
# Predict: images -> text


def load_for_predict(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    from transformers import VisionEncoderDecoderModel

    image_processor, tokenizer, _ = load_processors(str(folder), False)
    base_load = record.get(contract.BASE_LOAD, {})  # a quantized run's base: in 4/8 bits
    model = VisionEncoderDecoderModel.from_pretrained(base, trust_remote_code=False, **base_load)
    fix_special_tokens(model, tokenizer)
    return model, tokenizer, {"image_processor": image_processor}


def answer(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """The text of a batch of images (a data file's rows or input files)."""
    processor = loaded.parts["image_processor"]
    pixels = processor(images=open_images(examples, image_limit(loaded)), return_tensors="pt")["pixel_values"]
    return generate_texts(loaded, {"pixel_values": pixels}, request)


def predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    refuse_prompts(loaded, TASK, request)
    examples = file_examples(media_files(request.inputs))
    return file_rows(examples, in_batches(answer, loaded, examples, request))


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """A ``--data`` file read as training reads it: ``data.image_column`` (paths relative to the
    file, or an Image feature; every file found before the model loads) and, where the file has
    it, ``data.text_column``: the reference."""
    from xtrain.data.rows.images import check_image_files
    from xtrain.data.tokenize import require_columns

    d = cfg.data
    ds, source, folder = load_file(cfg, "image")
    require_columns(ds, {"data.image_column": d.image_column}, source)
    check_image_files(ds, d.image_column, folder, source)
    refs = references(ds, d.text_column, source, "data.text_column")
    return media_examples(ds, d.image_column, folder, source, refs)


def _quickstart_inputs() -> list[str]:
    folder, row = builtin.first_eval_row("builtin:ocr-lines")
    return [str(folder / row["image"])]


TASK = Task(
    name=NAME,
    decodes_media=True,
    about="images and their text (TrOCR, ViT-GPT2); metric: CER/WER by generation",
    build=build,
    aliases=("ocr",),
    keys=frozenset(
        {
            "model.chunked_loss",
            "data.image_column",
            "data.image_root",
            "data.text_column",
            "model.quantization",
            "lora.apply_to",
            "generation.max_new_tokens",
            "generation.num_beams",
            "generation.sample_predictions",
        }
    ),
    token_loss="decoder",
    model_class="VisionEncoderDecoderModel",
    lora_plan=lora_plan,
    full_fine_tune=full_fine_tune,
    positions=decoder_positions,
    stacks=stacks,
    generation_prompt=lambda cfg: 1,  # generate starts from the decoder start token
    resume_keys=("lora.apply_to",),
    recognizes=lambda config: config.get("model_type") == "vision-encoder-decoder",
    predicts=Predicts(
        takes="images",
        load=load_for_predict,
        run=predict,
        file=FileRows(rows="image paths (+ their text)", read=read_file, answer=answer, score=error_rates),
    ),
    check_data=check_data,
    quickstart=Quickstart(
        job="quickstart-image-to-text.yaml",
        about="OCR",
        next_command="xtrain train examples/image-to-text-ocr.yaml",
        headline=("cer", "CER", "share of characters wrong; 0 is perfect"),
        predict_args=_quickstart_inputs,
    ),
)
