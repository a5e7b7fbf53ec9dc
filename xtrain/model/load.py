"""Loading the tokenizer and the model: a local folder, a hub id or ``builtin:NAME``, all through
``from_pretrained``. Failures a user can cause become one ``XtrainError`` line."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic, builtin
from xtrain.errors import NoTokenizer, XtrainError
from xtrain.model import hub

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    # what ``from_pretrained`` is called on: a task's Auto class or a model class
    ModelClass = type[PreTrainedModel] | type[_BaseAutoModelClass]

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` or ``name``: what the hub accepts (``hub.is_repo_id``, huggingface_hub's own
    rule). Paths (``./x``, ``/x``, ``~/x``, ``a/b/c``) are not."""
    return hub.is_repo_id(name)


def resolve_model(name_or_path: str) -> str:
    """The folder (built-in or local) or hub id that ``from_pretrained`` gets (a path that is not
    there, or is a file: ``hub.kind_of``'s one line)."""
    if hub.kind_of(name_or_path) == "builtin":
        return str(builtin.ensure_builtin_model(name_or_path))
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    return name_or_path


def _attention_refused(e: BaseException) -> bool:
    """transformers refused the attention implementation it was given (model.attn_implementation)."""
    text = str(e)
    return "attn_implementation" in text or "Flash Attention" in text or "FlashAttention" in text


def load_error(what: str, name: str, local: bool, e: BaseException) -> XtrainError:
    from huggingface_hub import constants

    if refused := atomic.cannot_write(atomic.HUB_CACHE, constants.HF_HUB_CACHE, e):  # a download's
        return refused
    reason = _first_line(e)
    if _attention_refused(e):
        return XtrainError(
            f"{name} cannot load with that model.attn_implementation: {reason[:200]}",
            "set model.attn_implementation=auto",
        )
    if "trust_remote_code" in str(e):
        return XtrainError(
            f"{name} needs custom code from its repository to load its {what}",
            "set model.trust_remote_code=true if you trust that code",
        )
    if local:
        return XtrainError(f"cannot load the {what} from {name}: {reason}")
    return XtrainError(
        f"model '{name}' is not a local folder, and loading its {what} from the Hugging Face hub "
        f"failed: {reason}",
        "check the name and your network, or download it and set model.name_or_path to the folder",
    )


def load_tokenizer(source: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained``; a missing pad token falls back to eos (then unk)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise load_error("tokenizer", source, Path(source).exists(), e) from None
    if not tokenizer("a b", add_special_tokens=False)["input_ids"]:
        # transformers 5 builds a tokenizer class with an empty vocabulary from a folder that has
        # a config.json but no tokenizer files: every row would tokenize to nothing
        raise NoTokenizer(
            f"the tokenizer of {source} has no vocabulary (no tokenizer.json, tokenizer.model or "
            "vocabulary files there)",
            "copy the model's tokenizer files into that folder, next to its config.json",
        )
    if tokenizer.pad_token_id is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise XtrainError(
                f"the tokenizer of {source} has no pad, eos or unk token to pad batches with",
                "use a tokenizer with a pad token",
            )
        tokenizer.pad_token = fallback
    tokenizer.padding_side = "right"
    return tokenizer


def load_dtype(setting: str, device_type: str | None = None) -> torch.dtype | str:
    """``model.dtype``: auto keeps the checkpoint's dtype on a GPU and float32 on CPU (half-precision
    matmuls are slow or missing there); otherwise the named dtype. ``device_type``: where the
    model computes (training: ``Run.device``'s type); None: this machine's GPU if it has one
    (``xtrain predict``, the merged model's fresh base)."""
    import torch

    if setting == "auto":
        on_gpu = torch.cuda.is_available() if device_type is None else device_type == "cuda"
        return "auto" if on_gpu else torch.float32
    return getattr(torch, DTYPES[setting])


def dtype_kwarg() -> str:
    """transformers >= 4.56 calls it ``dtype``; older versions ``torch_dtype``."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def load_model(
    source: str,
    model_class: str,
    task: str,
    dtype: str,
    trust_remote_code: bool,
    device_type: str | None = None,
    **extra: Any,
) -> PreTrainedModel:
    """``transformers.<model_class>.from_pretrained`` (the task's Auto class) in ``dtype`` for
    ``device_type`` (``load_dtype``); a checkpoint without that head is one line naming the ``task``."""
    import transformers

    auto = getattr(transformers, model_class)
    kwargs = {dtype_kwarg(): load_dtype(dtype, device_type), "trust_remote_code": trust_remote_code, **extra}
    try:
        return auto.from_pretrained(source, **kwargs)
    except Exception as e:
        head = "Unrecognized configuration class" in str(e) or "does not support" in str(e)
        if head and not _attention_refused(e):
            raise XtrainError(
                f"{source} has no {task} head in transformers ({_first_line(e)[:120]})",
                "use a model of that kind, or a custom task",
            ) from None
        raise load_error("model", source, Path(source).exists(), e) from None


def load_config(source: str, trust_remote_code: bool) -> PretrainedConfig:
    """The checkpoint's ``AutoConfig`` (tasks check the model type before loading anything else)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise load_error("config", source, Path(source).exists(), e) from None


def require_model_type(
    source: str,
    trust_remote_code: bool,
    accepted: Collection[str],
    kind: str,
    hint: str,
    remote_ok: bool = True,
) -> PretrainedConfig:
    """The checkpoint's config when its ``model_type`` is one a task ``accepted`` (any, for a
    remote-code model when ``remote_ok``); else one line naming what it is, said before anything
    else is loaded."""
    config = load_config(source, trust_remote_code)
    if config.model_type not in accepted and not (remote_ok and trust_remote_code):
        raise XtrainError(f"{source} is a {config.model_type} model, not {kind}", hint)
    return config


def load_pretrained(
    model_class: ModelClass,
    source: str,
    dtype: str,
    trust_remote_code: bool,
    device_type: str | None = None,
    **extra: Any,
) -> PreTrainedModel:
    """``model_class.from_pretrained`` with the config's dtype for ``device_type`` (``load_dtype``)
    and remote-code choice (and ``extra`` keywords); a failure is one line (the media tasks load
    through here)."""
    kwargs = {dtype_kwarg(): load_dtype(dtype, device_type), "trust_remote_code": trust_remote_code, **extra}
    try:
        return model_class.from_pretrained(source, **kwargs)
    except Exception as e:
        raise load_error("model", source, Path(source).exists(), e) from None


class ProcessorFiles:
    """Saves an input processor (image processor or feature extractor) and a tokenizer side by side
    (what ``save_final`` writes next to the adapter), for checkpoints without a processor class."""

    def __init__(
        self, inputs: BaseImageProcessor | SequenceFeatureExtractor, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.inputs = inputs
        self.tokenizer = tokenizer

    def save_pretrained(self, folder: str) -> None:
        self.inputs.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


def load_processors(
    source: str, trust_remote_code: bool, part: str
) -> tuple[
    BaseImageProcessor | SequenceFeatureExtractor, PreTrainedTokenizerBase, ProcessorMixin | ProcessorFiles
]:
    """(input processor, tokenizer, what to save with the adapter) of an encoder-decoder checkpoint.
    ``part`` is the processor's attribute: ``image_processor`` or ``feature_extractor``. The
    checkpoint's AutoProcessor when it has one, else the Auto class of that part + its tokenizer."""
    import contextlib

    import transformers

    auto = {"image_processor": "AutoImageProcessor", "feature_extractor": "AutoFeatureExtractor"}[part]
    processor: ProcessorMixin | None = None
    with contextlib.suppress(Exception):  # many checkpoints have no processor class: fall back
        processor = transformers.AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)
    inputs = getattr(processor, part, None)
    tokenizer = getattr(processor, "tokenizer", None)
    if inputs is None:
        loader = getattr(transformers, auto)
        try:
            inputs = loader.from_pretrained(source, trust_remote_code=trust_remote_code)
        except Exception as e:
            what = part.replace("_", " ")
            raise load_error(what, source, Path(source).exists(), e) from None
        processor = None
    if tokenizer is None:
        tokenizer = load_tokenizer(source, trust_remote_code)
        processor = None
    elif tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return inputs, tokenizer, processor or ProcessorFiles(inputs, tokenizer)
