"""Steps every built-in task shares: tokenizer and raw data loading, the seeded model load, the
pad collator, the model's finishing touches (position limit, gradient checkpointing, LoRA or the
task's full fine-tune), and the one sequence of the media tasks (``media_source``,
``finish_media_model``, ``generation_eval``). Imported by the tasks' hooks, never at their import."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.config.schema import TrainConfig
from xtrain.data import collate, mixing
from xtrain.data.encoded import Encoding, encode
from xtrain.data.rows.formats import text_names
from xtrain.data.rows.images import check_image_files
from xtrain.data.sources import load_source
from xtrain.data.tokenize import TOKENIZE_VERSION, require_columns, tokenizer_fingerprint
from xtrain.errors import XtrainError
from xtrain.model import attention, chain, lora, quantization
from xtrain.model import load as models
from xtrain.model.start import start_of
from xtrain.tasks import model_checks
from xtrain.tasks.contract import EvalBatchFn, MainProcessFirst, ReduceFn, Task, Workload
from xtrain.tasks.generation import GenerationEval

if TYPE_CHECKING:
    from collections.abc import Mapping

    from datasets import Dataset
    from peft import PeftModel
    from torch.nn import Module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.config.schema import LoraConfig
    from xtrain.model.load import ModelClass
    from xtrain.planning.run import Run


def model_source(cfg: TrainConfig) -> str:
    """The folder or hub id the model's weights load from: ``model.name_or_path``'s base (a trained
    result's, ``model.start``), a built-in written once, by the first caller."""
    return models.resolve_model(start_of(cfg.model.name_or_path).base)


def processor_source(cfg: TrainConfig, source: str) -> str:
    """Where the tokenizer or processor loads from: a trained result's own folder (saved with the
    chat template it trained with), else the model's ``source``."""
    return start_of(cfg.model.name_or_path).tokenizer or source


def prepare_tokenizer(
    cfg: TrainConfig, main_process_first: MainProcessFirst
) -> tuple[str, PreTrainedTokenizerBase]:
    """(the model's source, its tokenizer: a trained result's own)."""
    with main_process_first():  # a built-in model is written once, by the first process
        source = model_source(cfg)
    return source, models.load_tokenizer(processor_source(cfg, source), cfg.model.trust_remote_code)


def raw_datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset | None, str, str]:
    """(train, eval or None, train source name, eval source name) as loaded, before tokenising:
    each file cut to ``data.max_samples``, several train files mixed by ``data.mix``, their text
    columns read as text (``row_formats.text_names``)."""
    d = cfg.data
    files = d.train_sources()
    if not files:
        raise XtrainError(
            "data.train is not set", "set data.train to a file, a folder, a hub id or builtin:NAME"
        )
    text = text_names(d)
    parts = [
        mixing.first_n(load_source(f, d.format, role="train", key="data.train", text=text), d.max_samples)
        for f in files
    ]
    train, train_name = mixing.mix(parts, files, d, cfg.run.seed), " + ".join(files)
    eval_ds, eval_name = None, d.eval or ""
    if d.eval:
        eval_ds = load_source(d.eval, d.format, role="eval", key="data.eval", text=text)
        eval_ds = mixing.first_n(eval_ds, d.max_samples)
    elif d.eval_fraction > 0:
        if len(train) < 2:
            raise XtrainError(f"{train_name} has {len(train)} rows: too few to split off an eval set")
        split = train.train_test_split(test_size=d.eval_fraction, seed=cfg.run.seed, shuffle=True)
        train, eval_ds = split["train"], split["test"]
        eval_name = f"{train_name} (eval_fraction {d.eval_fraction})"
    if len(train) == 0:
        raise XtrainError(f"{train_name} has no rows")
    return train, eval_ds, train_name, eval_name


def pad_multiple(device: str) -> int | None:
    """Lengths in multiples of 8 suit GPU tensor cores; on CPU they only add padding."""
    return 8 if device.startswith("cuda") else None


def pad_collator(tokenizer: PreTrainedTokenizerBase, device: str) -> collate.PadCollator:
    return collate.PadCollator(tokenizer.pad_token_id, pad_multiple(device))


def placement(run: Run, task: Task, model_class: ModelClass, source: str) -> dict[str, Any]:
    """``from_pretrained`` keywords for this process (``run.device``, ``run.precision``): the
    attention implementation ``model.attn_implementation`` decides, and with
    ``model.quantization`` the 4/8-bit config on this process's device."""
    cfg = run.cfg
    chosen = attention.for_load(cfg, model_class, source, run.device, run.precision)
    quantized = quantization.load_kwargs(cfg, run.device, run.precision, run.fsdp, task.unquantized)
    return {**chosen.kwargs(), **quantized}


def load_seeded(run: Run, task: Task, source: str, **extra: Any) -> PreTrainedModel:
    """The task's model class ``from_pretrained``, right after ``set_seed(run.seed)``: every
    process and launch mode starts from the same weights (heads made new included), placed for
    this process (``placement``)."""
    import transformers
    from transformers import set_seed

    assert task.model_class is not None, f"{task.name} loads its model itself"
    m = run.cfg.model
    set_seed(run.cfg.run.seed)
    extra = {**placement(run, task, getattr(transformers, task.model_class), source), **extra}
    return models.load_model(
        source, task.model_class, task.name, m.dtype, m.trust_remote_code, run.device_type, **extra
    )


def train_everything(model: Module, cfg: TrainConfig) -> None:
    """The default full fine-tune: every weight trains."""
    for p in model.parameters():
        p.requires_grad_(True)


def finish_model(
    model: Module,
    cfg: TrainConfig,
    task: Task,
    apply_lora: Callable[[Module, LoraConfig], PeftModel] | None = None,
) -> Module:
    """The model checked against the config (``model_checks``: lengths, LoRA targets), then
    peft's k-bit preparation of a quantized model, then gradient checkpointing, then LoRA
    (``apply_lora(model, cfg.lora)``, default: adapters on ``lora.target_modules`` with the
    task's peft type) or the task's full fine-tune. A trained result as the start: its adapters
    first, frozen, then the new adapter on top or its last one trained on (``model.chain``)."""
    model_checks.check_model(model, cfg, task)  # the one place a run checks its model
    if quantization.is_quantized(model):
        model = quantization.prepare(model)
    if cfg.model.gradient_checkpointing:
        lora.enable_gradient_checkpointing(model, cfg.lora.enabled)
    if cfg.lora.enabled:

        def new_adapter(model: Module) -> PeftModel:
            if apply_lora is not None:
                return apply_lora(model, cfg.lora)
            return lora.apply_lora(model, cfg.lora, task.peft_task_type)

        start = start_of(cfg.model.name_or_path)
        if start.adapters:
            return chain.attach(model, start, cfg.lora.continue_adapter, new_adapter)
        return new_adapter(model)
    (task.full_fine_tune or train_everything)(model, cfg)
    return model


def tokenizing(
    task: str,
    tokenize: Callable[..., Mapping[str, list]],
    kwargs: dict[str, Any],
    processes: int | None = None,
) -> Callable[[Dataset, str], Dataset]:
    """``(ds, role) -> ds`` tokenized by ``tokenize(**kwargs)`` (``encoded.encode``: once, in
    ``processes`` processes, cached under a fingerprint of the task, the tokenizer
    (``kwargs["tokenizer"]``) and every other setting in ``kwargs``)."""
    settings = {k: v for k, v in kwargs.items() if k != "tokenizer"}
    key = (task, TOKENIZE_VERSION, tokenizer_fingerprint(kwargs["tokenizer"]), settings)
    # concatenate joins the rows of a map batch: its batches must start where one process starts them
    grouped = kwargs.get("packing") == "concatenate"
    encoding = Encoding(task, tokenize, kwargs, key, with_indices=False, processes=processes, grouped=grouped)

    def run(ds: Dataset, role: str) -> Dataset:
        return encode(ds, encoding, f"tokenizing {role}")

    return run


def text_workload(
    model: Module,
    run: Run,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    datasets: tuple[Dataset, Dataset | None],
    evaluation: tuple[EvalBatchFn, ReduceFn, str],
) -> Workload:
    """The workload of a text task: the model finished (checked, LoRA, checkpointing),
    padded batches, ``datasets`` = (train, eval or None), ``evaluation`` = (per-batch statistics,
    their reduction, the main metric)."""
    eval_batch, reduce_metrics, main_metric = evaluation
    train, eval_ds = datasets
    return Workload(
        model=finish_model(model, run.cfg, task),
        train_dataset=train,
        collator=pad_collator(tokenizer, run.device),
        eval_dataset=eval_ds,
        eval_batch=eval_batch,
        reduce_metrics=reduce_metrics,
        tokenizer=tokenizer,
        main_metric=main_metric,
    )


def set_decoder_tokens(
    model: Module,
    tokenizer: PreTrainedTokenizerBase,
    start: int | None,
    pad: int | None,
    vocab: tuple[str, int | None],
    **more: Any,
) -> None:
    """An encoder-decoder model's decoder start and pad ids (and ``more``, e.g. ``eos_token_id``)
    on its config and generation config. Refused: a start or pad id nobody sets, a tokenizer with
    more tokens than ``vocab`` = (what holds the vocabulary, its size)."""
    if start is None or pad is None:
        raise XtrainError(
            "cannot tell the decoder's start and pad tokens: the checkpoint and its tokenizer set neither",
            "set decoder_start_token_id and pad_token_id in the model's config.json",
        )
    for target in (model.config, model.generation_config):
        target.decoder_start_token_id = start
        target.pad_token_id = pad
        for key, value in more.items():
            setattr(target, key, value)
    holder, size = vocab
    if size and len(tokenizer) > size:
        raise XtrainError(
            f"the tokenizer has {len(tokenizer)} tokens but the {holder} only {size}",
            "use the tokenizer that came with the checkpoint",
        )


def require_nonempty(ds: Dataset, name: str, what: str) -> None:
    if len(ds) == 0:
        raise XtrainError(
            f"no {what} examples left in {name} after tokenising", "check the columns and data.max_length"
        )


# ---------------------------------------------------------------------------------------------
# The media tasks' one sequence: source -> model type -> processors -> data -> seeded model ->
# checkpointing -> LoRA or freezing -> evaluation by generation.


def media_source(
    cfg: TrainConfig, main_process_first: MainProcessFirst, check: Callable[[str, bool], object]
) -> str:
    """The model folder (a built-in is written once, by the first process), its model type
    checked by ``check(source, trust_remote_code)`` before anything else is loaded."""
    with main_process_first():
        source = model_source(cfg)
    check(source, cfg.model.trust_remote_code)
    return source


def base_dir(source: str, role: str) -> Path | None:
    """The folder that relative image paths of ``source`` are relative to."""
    if builtin.is_builtin(source):
        return builtin.builtin_data_file(source, "train" if role == "train" else "eval").parent
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve().parent
    if path.is_dir():
        return path.resolve()
    return None


def media_dirs(cfg: TrainConfig, media: str) -> tuple[Path | None, Path | None]:
    """The folders that the train and eval data's relative ``media`` ("image" or "audio") paths
    are relative to: ``data.image_root`` / ``data.audio_root`` for both when set, else each data
    file's folder. ``image_data.resolve_path`` joins them; absolute paths stay as they are."""
    d = cfg.data
    root = getattr(d, f"{media}_root")
    if root is not None:
        folder = Path(root).expanduser()
        if not folder.is_dir():
            raise XtrainError(
                f"data.{media}_root {root} is not a folder",
                f"set it to the folder the data's relative {media} paths start from, or leave it unset",
            )
        return folder.resolve(), folder.resolve()
    folders = {base_dir(f, "train") for f in d.train_sources()}
    if len(folders) > 1:
        raise XtrainError(
            f"data.train lists files in {len(folders)} folders: their relative {media} paths start "
            "from different places",
            f"set data.{media}_root to the folder the {media} paths start from, or keep the files together",
        )
    train_dir = folders.pop() if folders else None
    return train_dir, base_dir(d.eval, "eval") if d.eval else train_dir


def image_datasets(
    cfg: TrainConfig, main_process_first: MainProcessFirst, columns: dict[str, str]
) -> tuple[tuple[Dataset, str, Path | None], tuple[Dataset | None, str, Path | None]]:
    """(train, its name, its folder), (eval or None, ...): loaded by the first process first,
    the ``columns`` ({key: column}) present and every image file found before training starts."""
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        train_dir, eval_dir = media_dirs(cfg, "image")
        for ds, name, folder in ((train, train_name, train_dir), (eval_ds, eval_name, eval_dir)):
            if ds is not None:
                require_columns(ds, columns, name)
                check_image_files(ds, cfg.data.image_column, folder, name)
    return (train, train_name, train_dir), (eval_ds, eval_name, eval_dir)


def load_media_model(run: Run, task: Task, source: str) -> PreTrainedModel:
    """``task.model_class`` loaded right after ``set_seed(run.seed)``, placed for this process
    (``placement``: quantized with ``model.quantization``, the task's ``unquantized`` modules left
    as they are)."""
    import transformers
    from transformers import set_seed

    set_seed(run.cfg.run.seed)
    m = run.cfg.model
    assert task.model_class is not None, f"{task.name} loads its model itself"
    model_class = getattr(transformers, task.model_class)
    extra = placement(run, task, model_class, source)
    return models.load_pretrained(model_class, source, m.dtype, m.trust_remote_code, run.device_type, **extra)


def generation_eval(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, **more: Any) -> GenerationEval:
    """The evaluation by generation (``xtrain.tasks.generation``) with ``generation.*``."""
    g = cfg.generation
    settings = {"max_new_tokens": g.max_new_tokens, "num_beams": g.num_beams, **more}
    return GenerationEval(tokenizer=tokenizer, sample_predictions=g.sample_predictions, **settings)
