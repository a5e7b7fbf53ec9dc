"""A model's config.json where it already is (a local folder, a built-in, the Hugging Face cache;
a download only when asked): the file, its dtype (``checkpoint_dtype``) and positions
(``text_positions``); ``read_config_offline`` for the plan's memory estimate. A trained result
as ``model.name_or_path`` is read as its base's (``model.start``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin, structured
from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.model import hub
from xtrain.model import load as models
from xtrain.model.start import start_of

if TYPE_CHECKING:
    from types import SimpleNamespace

    from transformers import PretrainedConfig


def read_config_offline(cfg: TrainConfig) -> PretrainedConfig | str:
    """The model's ``AutoConfig`` from a local folder, a built-in or the hub cache; else why not."""
    from transformers import AutoConfig

    name = start_of(cfg.model.name_or_path).base  # a trained result's base
    if cfg.model.trust_remote_code:
        return "the model's config runs custom code (model.trust_remote_code)"
    if builtin.is_builtin(name):
        try:
            source = str(builtin.ensure_builtin_model(name))  # the run builds the same folder
        except XtrainError as e:
            return e.message
    elif Path(name).expanduser().is_dir():
        source = str(Path(name).expanduser())
    elif models.looks_like_hub_id(name):
        source = name
    else:
        return f"{name} not found"
    try:  # local_files_only: the hub cache at most, no network
        return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except Exception:
        return f"{name} is not downloaded yet"


def dtype_in_config(data: dict[str, Any]) -> str | None:
    """The dtype a ``config.json`` says its weights are saved in: ``dtype`` or ``torch_dtype`` at
    its top level, else in its text model's config (composite configs such as Qwen2-VL's); None
    when it names none of float32/bfloat16/float16."""
    for where in (data, data.get("text_config"), data.get("decoder")):
        if not isinstance(where, dict):
            continue
        for key in ("dtype", "torch_dtype"):
            value = str(where.get(key) or "").removeprefix("torch.")
            if value in CHECKPOINT_DTYPES:
                return value
    return None


def checkpoint_dtype(cfg: TrainConfig) -> str | None:
    """The dtype the model's checkpoint is saved in, from its ``config.json`` where that is on this
    machine (a local folder, a built-in already built, the hub cache: ``config_path``;
    never a download; plain JSON, so no repository code runs); None: unknown (the plan then decides
    from the GPU alone). Read once per process by the caller of ``planning.resolve`` (machine I/O
    stays out of the rules)."""
    from xtrain.model.configs import config_json

    data = config_json(start_of(cfg.model.name_or_path).base)
    return dtype_in_config(data) if data is not None else None


def positions_of(config: PretrainedConfig | SimpleNamespace | None) -> int | None:
    """The first positive position limit ``config`` names; None when it names none."""
    for name in POSITION_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def text_positions(config: PretrainedConfig | SimpleNamespace) -> tuple[str, int | None]:
    """The default ``Task.positions``: the text model's (a multimodal config's ``text_config``)."""
    return "model", positions_of(getattr(config, "text_config", None) or config)


def config_path(name: str, fetch: bool = False) -> Path | None:
    """The model's ``config.json`` where it already is on this machine: a local folder, a built-in
    already built, the Hugging Face cache of a hub id; else None. Never a download or a build,
    unless ``fetch`` (a training worker, which loads the model next anyway): then a built-in is
    built and a hub id's config.json (only that file) is downloaded."""
    if builtin.is_builtin(name):
        path = builtin.cache_root() / builtin.strip_prefix(name) / "config.json"
        if fetch and not path.is_file():
            try:
                return builtin.ensure_builtin_model(name) / "config.json"
            except XtrainError:  # an unknown built-in: the run says so when it loads it
                return None
        return path if path.is_file() else None
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    if not models.looks_like_hub_id(name):
        return None
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:  # the cache; the hub only with fetch (offline mode: fails at once)
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - an unreadable cache: the same as not there
        found = None
    if not isinstance(found, str) and fetch:
        hub.locate(name)  # neither cached nor reachable: its one line now, not the hub's retries
        try:
            found = hf_hub_download(name, "config.json")
        except Exception:  # noqa: BLE001 - not there after all: the load says why
            return None
    return Path(found) if isinstance(found, str) else None


def config_json(name: str, fetch: bool = False) -> dict[str, Any] | None:
    """The model's ``config.json`` as plain data, read without transformers where it is on this
    machine (``config_path``); None when it is not (or is not a JSON mapping)."""
    path = config_path(name, fetch)
    if path is None:
        return None
    try:
        data = structured.load_json(path.read_text(encoding="utf-8"))  # no key twice, bounded nesting
    except (OSError, ValueError, TypeError, XtrainError):
        return None
    return data if isinstance(data, dict) else None


def local_config(cfg: TrainConfig, fetch: bool = False) -> SimpleNamespace | None:
    """The model's ``config.json`` as attributes (nested configs too), read without transformers
    when it is on this machine (``config_json``); else None."""
    import json
    import types

    data = config_json(start_of(cfg.model.name_or_path).base, fetch)
    if data is None:
        return None
    return json.loads(json.dumps(data), object_hook=lambda d: types.SimpleNamespace(**d))


# the dtypes a checkpoint's config.json names (torch_dtype before transformers 4.56, dtype after)
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")


# Spellings of "how many positions" across architectures (GPT-2's n_positions, Whisper's decoder)
POSITION_NAMES = ("max_position_embeddings", "n_positions", "max_target_positions")
