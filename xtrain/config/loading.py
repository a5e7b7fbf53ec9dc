"""Loading a config: one YAML file plus ``key=value`` overrides, then the checks.

- ``load_config(path, overrides)``: YAML (``xtrain.structured``: safe loading, no key twice) ->
  defaults -> overrides -> checks.
  ``path=None`` starts from the small built-in BERT job (``xtrain/builtin/jobs/quickstart.yaml``,
  seq-cls's quickstart): the base of configs made in code. The job a user runs without naming one
  (``python -m xtrain.run``, ``xtrain quickstart``) is the quickstart's default: ``xtrain.tasks.default_job``.
- Unknown sections and keys are refused with the closest valid name; values are type-checked
  and range-checked (``values.py``); every mistake is one ``XtrainError`` line.
- ``config_to_dict`` / ``config_from_dict`` round-trip for checkpoints; ``flat_config`` for
  TensorBoard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xtrain import structured
from xtrain.config import foreign
from xtrain.config.schema import TrainConfig, mark_given, section_fields, sections
from xtrain.config.values import closest, resolve_key, set_value, show
from xtrain.encoding import read_text
from xtrain.errors import XtrainError, shown

QUICKSTART_CONFIG = Path(__file__).resolve().parents[1] / "builtin" / "jobs" / "quickstart.yaml"  # seq-cls's
# Input paths in a config file are looked up next to the file first (then the current folder).
_INPUT_PATHS = (
    "model.name_or_path",
    "data.train",
    "data.eval",
    "data.tools",
    "data.chat_template",
    "data.image_root",
    "data.audio_root",
    "eval.benchmarks",  # task YAML files and folders (lm-eval's task names are left as they are)
)
# Function specs (``path/to/file.py:function``) whose file is looked up the same way.
_FUNCTION_SPECS = ("grpo.rewards", "grpo.tools")
MODEL_REWARD = "model:"  # grpo.rewards' entry of a reward model: model:PATH (a reward run's folder)


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.exists() and not path.is_dir() and not path.is_file():  # /dev/null, a pipe, a device
        raise XtrainError(
            f"config path {path} is not a regular file", "give a YAML file, e.g. examples/*.yaml"
        )
    try:
        # UTF-8 (BOM or not) or UTF-16 with a BOM (PowerShell's `>`); ANSI bytes: one-line refusal
        text = read_text(path, "config file")
    except FileNotFoundError:
        raise XtrainError(f"config file {path} not found", "check the path") from None
    except IsADirectoryError:
        raise XtrainError(f"config path {path} is a folder, not a YAML file") from None
    except OSError as e:
        raise XtrainError(f"config file {path} cannot be read: {e.strerror or e}") from None
    # safe loading; a key written twice, or nesting past any config, is one line naming the file
    data = structured.read_yaml(text, f"config file {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise XtrainError(
            f"config file {path} must be a mapping of sections (model:, data:, ...), "
            f"got {type(data).__name__}"
        )
    return data


def _apply_mapping(cfg: TrainConfig, data: dict[str, Any], where: str) -> list[str]:
    """Apply ``{section: {key: value}}``; returns the keys set."""
    done = []
    for section, values in data.items():
        section = str(section)
        if section not in sections():
            if not isinstance(values, dict) and foreign.answer(section):  # `learning_rate: 2e-4`
                raise XtrainError(f"unknown key {section!r}{where}", foreign.answer(section))
            if isinstance(values, dict) and closest(section, sections()) is None:
                # `training: {learning_rate: ...}`: no section of that name; a key says what was meant
                for name in values:
                    if foreign.answer(str(name)):
                        key = f"{section}.{name}"  # quoted as repr: a name with a line break stays one line
                        raise XtrainError(f"unknown key {key!r}{where}", foreign.answer(str(name)))
            resolve_key(section, "", where)  # raises: unknown section, with the closest name
        if values is None:  # an empty section (`lora:` with nothing under it)
            continue
        if not isinstance(values, dict):
            if foreign.answer(section):  # HF's `optim: adamw_torch`, at the top level
                raise XtrainError(f"section '{section}'{where} is not a setting", foreign.answer(section))
            raise XtrainError(
                f"section '{section}'{where} must be a mapping of keys, got {show(values)}",
                f"write it as '{section}:' with indented 'key: value' lines below",
            )
        for name, value in values.items():
            key = resolve_key(section, str(name), where)
            set_value(cfg, key, value)
            done.append(key)
    return done


def parse_override(text: str) -> tuple[str, Any, str]:
    """``"section.key=value"`` -> (key, YAML-parsed value, raw value text): the one parser of
    ``key=value`` overrides (``xtrain train``, ``python -m xtrain.run``, quickstart)."""
    import yaml

    body = text[2:] if text.startswith("--") else text
    key, eq, raw = body.partition("=")
    key = key.strip()
    if eq and "." not in key:  # learning_rate=2e-4, cutoff_len=512, max_length=512
        _no_section(key, raw.strip(), text)
    if not eq or "." not in key:
        raise XtrainError(
            f"override {shown(text)} must look like section.key=value",
            "e.g. run.max_steps=20 or data.eval=null",
        )
    try:
        value = structured.load_yaml(raw) if raw.strip() else None
    except structured.StructureError as e:
        raise XtrainError(f"override {shown(text)}: the value {e}", "e.g. data.eval=null") from None
    except yaml.YAMLError:
        value = raw  # not YAML: the text as written
    return key, value, raw.strip()


def _no_section(name: str, raw: str, text: str) -> None:
    """An override without a section: an xtrain key's own name gets its section, a name from
    another trainer the table's answer (``foreign``) with the override to write; else nothing
    (the caller's one-line form)."""
    form = f"override {shown(text)} must look like section.key=value"
    owners = [f"{s}.{name}" for s, cls in sections().items() if name in section_fields(cls)]
    if owners:
        raise XtrainError(form, f"did you mean {owners[0]}={raw}?")
    answer = foreign.answer(name)
    if answer:
        found = foreign.FOREIGN.get(name.strip().lower().replace("-", "_"))
        write = f": write {found.key}={found.value or raw}" if found and found.key and not found.how else ""
        raise XtrainError(form, answer + write)


def _resolve_inputs(cfg: TrainConfig, base: Path, keys: Iterable[str]) -> None:
    """Relative input paths in a config file: next to the file when they exist there."""
    for key in keys:
        if key in _FUNCTION_SPECS:
            _resolve_specs(cfg, base, key)
        if key not in _INPUT_PATHS:
            continue
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if isinstance(value, list):  # data.train: several files
            setattr(getattr(cfg, section), name, [_next_to(base, v) for v in value])
        elif value:
            setattr(getattr(cfg, section), name, _next_to(base, value))


def _resolve_specs(cfg: TrainConfig, base: Path, key: str) -> None:
    """``file.py:function`` specs (one or a list: reward functions, tools): the file next to the
    config file when it is there; ``package.module:function`` and built-in names unchanged."""
    section, name = key.split(".")
    value = getattr(getattr(cfg, section), name)

    def spec(text: str) -> str:
        if text.startswith(MODEL_REWARD):  # grpo.rewards' model:PATH, a reward run's folder
            return MODEL_REWARD + _next_to(base, text[len(MODEL_REWARD) :])
        where, colon, function = text.rpartition(":")
        return f"{_next_to(base, where)}:{function}" if colon and where.endswith(".py") else text

    setattr(getattr(cfg, section), name, [spec(v) for v in value] if isinstance(value, list) else spec(value))


def _next_to(base: Path, value: str) -> str:
    """``value`` next to the config file (``base``) when it is a relative path that exists there."""
    if value.startswith("builtin:") or "{" in value or "\n" in value:
        return value  # (a chat template given as text, not as a file)
    if Path(value).expanduser().is_absolute():
        return value
    candidate = base / value
    return str(candidate.resolve()) if candidate.exists() else value


def read_config(path: str | Path | None, overrides: Iterable[str] = ()) -> TrainConfig:
    """``path`` (YAML) or the built-in BERT job when ``None``, then ``overrides``
    (``section.key=value``, the value read as YAML): every value typed and checked, the keys the
    user wrote marked (``schema.given_keys``). The checks of the whole config against its task
    follow in ``xtrain.tasks.validation.load_config``, the one way in."""
    cfg = TrainConfig()
    file = QUICKSTART_CONFIG if path is None else Path(path).expanduser()
    where = "" if path is None else f" in {file}"
    keys = _apply_mapping(cfg, _read_yaml(file), where)
    _resolve_inputs(cfg, file.resolve().parent, keys)
    for text in overrides:
        key, value, raw = parse_override(text)
        section, _, name = key.partition(".")
        key = resolve_key(section, name, " in the command-line overrides")
        set_value(cfg, key, value, from_text=raw)
        keys.append(key)
    mark_given(cfg, keys)  # what the user wrote; the rest are defaults (model_checks.fit_defaults)
    return cfg


def read_dict(data: dict[str, Any]) -> TrainConfig:
    """``config_to_dict``'s output back into a ``TrainConfig`` (values typed and checked); the
    whole-config checks follow in ``xtrain.tasks.validation.config_from_dict``."""
    cfg = TrainConfig()
    _apply_mapping(cfg, data, "")
    return cfg


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain data (lists, no tuples): for ``yaml.safe_dump`` / JSON next to checkpoints."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """The config as flat scalars (TensorBoard's hparams accept nothing else)."""
    flat: dict[str, Any] = {}
    for section, values in dataclasses.asdict(cfg).items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat
