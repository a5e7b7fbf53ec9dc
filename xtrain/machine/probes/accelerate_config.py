"""Probes of accelerate's default config file: where it is, what it says, whether accelerate's own
loader takes it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xtrain import structured
from xtrain.errors import XtrainError
from xtrain.machine.facts import Facts
from xtrain.machine.probes import why


def accelerate_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """accelerate's default config file, computed as accelerate 1.x does (config_args.py).

    ``$HF_HOME/accelerate/default_config.yaml``, else ``$XDG_CACHE_HOME/huggingface/...``, else
    ``~/.cache/huggingface/...``, read at call time with ``os.environ.get(name, default)`` exactly
    as accelerate reads them (a set but empty variable counts as set). Computed here so that
    probing does not import accelerate; ``xtrain configure`` writes to the same path.
    """
    env = os.environ if environ is None else environ
    hf_home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(hf_home)) / "accelerate" / "default_config.yaml"


def probe_accelerate_config(facts: Facts) -> dict[str, Any]:
    """accelerate's default config: where it is, what it says, or why it cannot be read."""
    path = accelerate_config_path()
    found: dict[str, Any] = {"accelerate_config_path": str(path)}
    if not path.is_file():
        return found
    try:
        # the one YAML reader: a broken, duplicated or absurdly nested file is a finding, not a crash
        data = structured.read_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as e:
        found["accelerate_config_error"] = why(e)
        return found
    except XtrainError as e:
        found["accelerate_config_error"] = e.message.removeprefix(f"{path} ")
        return found
    if not isinstance(data, dict):
        found["accelerate_config_error"] = f"expected a mapping of settings, found {type(data).__name__}"
        return found
    # YAML may hold dates or other objects: keep the snapshot JSON-serialisable.
    found["accelerate_config"] = json.loads(json.dumps(data, default=str))
    return found


def probe_accelerate_loads(facts: Facts) -> dict[str, Any]:
    """Full mode: let accelerate's own (strict) loader judge the file, as `accelerate launch` will."""
    if facts.accelerate_config is None or not facts.packages.get("accelerate"):
        return {}
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(facts.accelerate_config_path)
    except Exception as e:  # unknown keys, bad enum values: exactly what `accelerate launch` hits
        return {"accelerate_config_error": why(e)}
    return {}
