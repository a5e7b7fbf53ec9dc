"""What is exported: a run folder, an adapter folder (its base from peft's record, or ``--base``),
or a full fine-tune's model folder, read with ``xtrain predict``'s own readers (``trained.py``:
``model_folder``, ``run_task``, ``trained_quantization``): the run's task, whether it trained on
chat conversations, how it loaded its base. The chat template is the one saved with the adapter
(training saved the one it rendered with there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.data.rows import chat as chat_data
from xtrain.errors import XtrainError
from xtrain.model import load as models
from xtrain.model import merge
from xtrain.trained import OUTPUT_FOLDERS, model_folder, read_json_object, run_task, trained_quantization

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

# what the adapter/model folder holds besides the weights: copied into a merged export as it is
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_config.json", "README.md")


@dataclass
class Source:
    folder: Path  # the adapter or model folder
    adapter: bool
    base: str | None  # the base an adapter goes onto (a folder or hub id); None for a full model
    task: str | None
    chat: bool
    quantization: str | None  # model.quantization of the run (its base merges from 16 bits anyway)
    model_class: type[PreTrainedModel]  # the transformers class the model loads with
    name: str  # the run's folder name, for file and model names
    record: dict[str, Any] = field(default_factory=dict)

    def load_from(self) -> str:
        return self.base if self.adapter and self.base else str(self.folder)

    def files(self) -> list[Path]:
        """The tokenizer/processor files, chat template and run record saved with the result."""
        skip = set(WEIGHT_FILES)
        return [
            p for p in sorted(self.folder.iterdir())
            if p.is_file() and p.name not in skip and not p.name.startswith("model")
            and p.suffix not in (".safetensors", ".bin", ".pt")
        ]  # fmt: skip


def _model_class(task: str | None, folder: Path, adapter: bool) -> type[PreTrainedModel]:
    """The transformers class: the task's, else a causal LM that peft or the config says it is."""
    import transformers

    if task is not None and task in tasks.all_tasks():
        return getattr(transformers, tasks.get(task).model_class)
    peft_type = read_json_object(folder / "adapter_config.json").get("task_type")
    architectures = read_json_object(folder / "config.json").get("architectures") or []
    if peft_type == "CAUSAL_LM" or any(str(a).endswith("ForCausalLM") for a in architectures):
        return transformers.AutoModelForCausalLM
    raise XtrainError(
        f"cannot tell what kind of model {folder} holds (no xtrain_run.json, no task in its config)",
        "export the output_dir of a run trained by xtrain, or a causal LM adapter",
    )


def find_source(path: str | Path, base: str | None = None) -> Source:
    """The result at ``path`` (a run's output_dir, its adapter/, or a model folder)."""
    folder = model_folder(path)
    adapter = (folder / "adapter_config.json").is_file()
    if base is not None and not adapter:
        raise XtrainError(f"{folder} is a whole model, not an adapter: it has no base", "leave out --base")
    trained = run_task(folder)
    source = None
    if adapter:
        source = models.resolve_model(base) if base is not None else merge.base_source(folder)
    run = folder.parent if folder.name in OUTPUT_FOLDERS else folder
    return Source(
        folder=folder,
        adapter=adapter,
        base=source,
        task=trained.task,
        chat=trained.chat,
        quantization=trained_quantization(folder, trained),
        model_class=_model_class(trained.task, folder, adapter),
        name=run.name,
        record=trained.record,
    )


def head_config(src: Source) -> PretrainedConfig | None:
    """The config the model loads with when its run's head differs from the checkpoint's: a
    classifier's ``num_labels`` as its record saved it (a reward model's one output); None: the
    checkpoint's own."""
    labels = src.record.get("num_labels")
    if not isinstance(labels, int) or isinstance(labels, bool) or labels < 1:
        return None
    config = models.load_config(src.load_from(), False)
    config.num_labels = labels
    return config


def is_classifier(src: Source) -> bool:
    """A sequence classifier (a reward model, seq-cls): its form is merged weights, never a GGUF
    that llama.cpp runs as a language model."""
    return src.model_class.__name__.endswith("ForSequenceClassification")


def load_tokenizer(src: Source) -> PreTrainedTokenizerBase:
    """The tokenizer saved with the result (the run's, with the chat template it trained with)."""
    return models.load_tokenizer(str(src.folder), False)


def chat_template(src: Source, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The template the run rendered its conversations with; None for a plain-text run."""
    if not src.chat:
        return None

    return chat_data.require_template(tokenizer, None, str(src.folder))


def generation_config(src: Source) -> dict[str, Any]:
    """The base's (or the model's) ``generation_config.json``, where it is on this machine."""
    where = Path(src.load_from())
    return read_json_object(where / "generation_config.json") if where.is_dir() else {}
