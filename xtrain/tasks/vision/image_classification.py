"""``image-classification``: images and a label (ViT, DeiT, ConvNeXt, Swin and other
``AutoModelForImageClassification`` checkpoints); metric: accuracy.

- Data: ``data.image_column`` (paths relative to the data file, or an ``Image`` feature; read
  lazily, converted to RGB: ``image_data``) and ``data.label_column`` (integers 0..n-1, or names
  mapped in sorted order, as seq-cls; a ``ClassLabel`` column names its integers).
- Model: a new classifier head of ``num_labels`` outputs with the label names
  (``id2label``/``label2id``) on the checkpoint's backbone (its old head is dropped).
- LoRA: the encoder's attention projections (query/key/value; q/k/v_proj; qkv), the classifier
  head trained whole and saved with the adapter (peft's ``modules_to_save``).
- ``xtrain predict RUN IMAGE...`` prints each image's label and its probability.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.data.labels import head_labels, label_key, labels_of
from xtrain.data.sources import undecoded_row
from xtrain.model import load as models
from xtrain.model import lora, lora_layers
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
from xtrain.tasks.predicting import (
    accuracy,
    file_examples,
    file_rows,
    image_limit,
    in_batches,
    load_file,
    media_examples,
    media_files,
    open_images,
    refuse_prompts,
    to_model,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import PeftModel
    from torch.nn import Module
    from transformers import PreTrainedModel

    from xtrain.config.schema import LoraConfig, TrainConfig
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run
    from xtrain.tasks.data_check import LabelMapping, Sample
    from xtrain.tasks.data_report import DataReport

NAME = "image-classification"
HEAD = "ForImageClassification"  # the architectures of a checkpoint whose head is trained
# the attention projections of ViT/DeiT/BEiT/Swin (query/key/value), CLIP/SigLIP-style (q/k/v_proj),
# DINOv2-with-registers/EVA-style fused (qkv); ConvNeXt has no attention: its Linear layers
ATTENTION = ("query", "key", "value", "q_proj", "k_proj", "v_proj", "qkv")
HEADS = ("classifier", "cls_classifier", "distillation_classifier", "head", "fc")


def check_model_type(source: str, trust_remote_code: bool) -> None:
    """Only image classification checkpoints: said before anything else is loaded."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    models.require_model_type(
        source,
        trust_remote_code,
        MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "an image classifier (ViT, DeiT, ConvNeXt, Swin)",
        "image-classification takes AutoModelForImageClassification checkpoints",
    )


def heads(model: Module) -> list[str]:
    """The classifier head(s): top-level modules of the model named like one (trained whole)."""
    return [name for name, _ in model.named_children() if name in HEADS]


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """A ViT-style encoder runs every patch and its class token ((224 / 16)^2 + 1 = 197); models
    without fixed patches (ConvNeXt, Swin's stages) get the default estimate."""
    config = model.config
    fixed = hasattr(config, "patch_size") and hasattr(config, "image_size")
    if not fixed or st.layer_count(model, "") == 0:
        return []
    prefix, positions = st.layers_owner(model), st.patches(config)
    return [st.from_config("encoder", model, prefix, config, positions, cfg, stem=st.patch_stem(config))]


def lora_plan(model: Module, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    return _plan(model, cfg.lora)


def _plan(model: Module, lora_cfg: LoraConfig) -> tuple[list[str], list[str]]:
    """(Linear layers that get adapters, modules trained whole): the encoder's attention (or
    ``lora.target_modules``), never the head, which is trained whole."""
    head = heads(model)
    layers = {q: leaf for q, leaf in lora_layers.linear_layers(model).items() if q.split(".")[0] not in head}
    names = lora_cfg.target_modules
    if lora_layers.is_all_linear(names):  # every Linear of the encoder (not its pooler); the head whole
        body = lora_layers.body_layers(model)
        return [q for q in layers if q in body], list(lora_cfg.modules_to_save or []) + head
    if isinstance(names, str):
        names = [n for n in ATTENTION if n in layers.values()] if names == "auto" else [names]
        if not names:
            names = lora_layers.find_target_modules(model)
    targets = [q for q, leaf in layers.items() if leaf in names or q in names]
    return targets, list(lora_cfg.modules_to_save or []) + head


def apply_lora(model: Module, lora_cfg: LoraConfig) -> PeftModel:
    targets, whole = _plan(model, lora_cfg)
    return lora.adapt(model, lora_cfg, targets, whole, "image encoder")


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    import transformers

    from xtrain.data import collate
    from xtrain.data.rows.images import ImageLabelCollator, ImageLabelRows
    from xtrain.tasks import common, data_check

    cfg = run.cfg
    d, m = cfg.data, cfg.model
    source = common.media_source(cfg, main_process_first, check_model_type)
    auto = transformers.AutoImageProcessor
    try:
        found = common.processor_source(cfg, source)
        image_processor = auto.from_pretrained(found, trust_remote_code=m.trust_remote_code)
    except Exception as e:
        raise models.load_error("image processor", source, Path(source).exists(), e) from None
    columns = {"data.image_column": d.image_column, "data.label_column": d.label_column}
    (train, train_name, train_dir), (eval_ds, eval_name, eval_dir) = common.image_datasets(
        cfg, main_process_first, columns
    )
    sources = (train_name, eval_name)
    found = labels_of(train, eval_ds, d.label_column, m.num_labels, sources)
    mapping, num_labels, id2label = found
    sets = [(train, train_name, "train"), (eval_ds, eval_name, "eval")]
    report = inspect(cfg, data_check.loaded_samples(cfg, sets), [], found)  # the data check
    names = id2label or {i: str(i) for i in range(num_labels)}

    def rows(ds: Dataset, folder: Path | None, name: str) -> ImageLabelRows:
        columns = (d.image_column, d.label_column)
        return ImageLabelRows(ds, columns, mapping, folder, name, max_pixels=d.max_image_pixels)

    model = common.load_seeded(
        run, TASK, source, **head_labels(num_labels, names), ignore_mismatched_sizes=True
    )
    workload = Workload(
        model=common.finish_model(model, cfg, TASK, apply_lora),
        train_dataset=rows(train, train_dir, train_name),
        collator=ImageLabelCollator(image_processor),
        eval_dataset=rows(eval_ds, eval_dir, eval_name) if eval_ds is not None else None,
        eval_batch=collate.seq_cls_eval_batch,
        reduce_metrics=collate.seq_cls_reduce,
        tokenizer=image_processor,  # saved with the adapter: predict prepares images the same way
        main_metric="accuracy",
        tokens_key=None,
        data_report=report,
    )
    workload.record = {"labels": [names[i] for i in range(num_labels)]}
    return workload


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    """No processor needed: the images are found and their labels held against the model's."""
    from xtrain.tasks import data_check

    samples, notes = data_check.first_samples(cfg, limit)
    return inspect(cfg, samples, notes)


def inspect(
    cfg: TrainConfig, samples: list[Sample], notes: list[str], found: LabelMapping | None = None
) -> DataReport:
    """Columns and image files as ``common.image_datasets`` checks them, the labels (``found``:
    the run's mapping) against the checkpoint's classes; the example: the first training row."""
    from xtrain.data.rows.images import check_image_files
    from xtrain.data.tokenize import require_columns
    from xtrain.tasks import data_check
    from xtrain.tasks.data_report import DataReport, Example

    d = cfg.data
    for s in samples:
        columns = {"data.image_column": d.image_column, "data.label_column": d.label_column}
        require_columns(s.ds, columns, s.name)
        check_image_files(s.ds, d.image_column, s.folder, s.name)
    classes = data_check.classes(cfg, samples, d.label_column, HEAD, new_head=True, found=found)
    report = DataReport(NAME, d.max_length, notes=notes + classes.notes)
    for s in samples:
        report.sources.append(s.check(labels=data_check.label_counts(s.ds, d.label_column)))
        if s.role == "train" and report.example is None:
            row = undecoded_row(s.ds, 0, d.image_column)
            image = data_check.image_line(row[d.image_column], s.folder)
            report.example = Example(s.name, 0, inputs=[image], label=classes.text(row[d.label_column]))
    return report


# ---------------------------------------------------------------------------------------------
# Predict: images -> label and probability


def load_for_predict(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, None, dict[str, Any]]:
    import transformers

    labels = record.get("labels")
    if not isinstance(labels, list) or not labels:  # a full model folder names its own labels
        config = models.load_config(base, trust_remote_code=False)
        labels = [config.id2label[i] for i in sorted(config.id2label)]
    extra = head_labels(len(labels), dict(enumerate(labels)))
    auto = transformers.AutoModelForImageClassification
    model = models.load_pretrained(auto, base, "auto", False, ignore_mismatched_sizes=True, **extra)
    image_processor = transformers.AutoImageProcessor.from_pretrained(str(folder), trust_remote_code=False)
    return model, None, {"image_processor": image_processor}


def answer(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """Each image's most probable label and its probability (softmax over the head)."""
    import torch

    id2label = getattr(loaded.model.config, "id2label", None) or {}
    processor = loaded.parts["image_processor"]
    pixels = processor(images=open_images(examples, image_limit(loaded)), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = loaded.model(**to_model({"pixel_values": pixels}, loaded.model)).logits.float()
    probs, ids = logits.softmax(dim=-1).max(dim=-1)
    return [
        {"output": str(id2label.get(i, i)), "probability": f"{p:.4f}"}
        for p, i in zip(probs.tolist(), ids.tolist(), strict=True)
    ]


def predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    """Each image's most probable label and its probability."""
    refuse_prompts(loaded, TASK, request)
    examples = file_examples(media_files(request.inputs))
    return file_rows(examples, in_batches(answer, loaded, examples, request))


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """A ``--data`` file read as training reads it: ``data.image_column`` (every file found
    before the model loads) and, where the file has it, ``data.label_column``: the reference, a
    label name (an integer label of a run whose labels have names is named as training named it)."""
    from xtrain.data.rows.images import check_image_files
    from xtrain.data.tokenize import require_columns

    d = cfg.data
    ds, source, folder = load_file(cfg, "image")
    require_columns(ds, {"data.image_column": d.image_column}, source)
    check_image_files(ds, d.image_column, folder, source)
    names = record.get("labels") if isinstance(record.get("labels"), list) else []
    refs: list[str | None] = [None] * len(ds)
    if d.label_column in ds.column_names:
        for i, value in enumerate(ds[d.label_column]):
            whole = isinstance(value, int) and not isinstance(value, bool)
            named = whole and 0 <= value < len(names)
            refs[i] = None if value is None else str(names[value]) if named else label_key(value)
    return media_examples(ds, d.image_column, folder, source, refs)


def _quickstart_inputs() -> list[str]:
    folder, row = builtin.first_eval_row("builtin:color-shapes")
    return [str(folder / row["image"])]


def _is_image_classifier(config: dict[str, Any]) -> bool:
    return any(str(a).endswith(HEAD) for a in config.get("architectures") or [])


TASK = Task(
    name=NAME,
    decodes_media=True,
    about="images and a label (ViT, DeiT, ConvNeXt, Swin); metric: accuracy",
    build=build,
    keys=frozenset({"model.num_labels", "data.image_column", "data.image_root", "data.label_column"}),
    model_class="AutoModelForImageClassification",
    stacks=stacks,
    lora_plan=lora_plan,
    resume_keys=("model.num_labels",),
    recognizes=_is_image_classifier,
    predicts=Predicts(
        takes="images",
        load=load_for_predict,
        run=predict,
        file=FileRows(rows="image paths (+ their label)", read=read_file, answer=answer, score=accuracy),
    ),
    check_data=check_data,
    quickstart=Quickstart(
        job="quickstart-image-classification.yaml",
        about="image classification",
        next_command="xtrain train examples/image-classification-shapes.yaml",
        headline=("accuracy", "accuracy", "share of images labelled right; 1 is perfect"),
        predict_args=_quickstart_inputs,
    ),
)
