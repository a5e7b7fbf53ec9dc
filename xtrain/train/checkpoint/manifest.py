"""A checkpoint's manifest: every file's size (and hash up to ``HASH_LIMIT``) written with it, and
the check against it before a resume."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from xtrain import atomic, structured
from xtrain.model.start import sha256_of
from xtrain.train.checkpoint.layout import MANIFEST_FILE, STATE_FILE

HASH_LIMIT = 64 * 2**20  # files up to this size are hashed too (LoRA checkpoints: all of them)
# per-rank RNG states: optional on load (accelerate keeps the seeded RNG without them), and on
# several machines without a shared disk each machine has only its own
_OPTIONAL = re.compile(r"^random_states_\d+\.pkl$")


def write_manifest(folder: Path) -> None:
    """Record every file of a checkpoint being written (sizes, and hashes of the small ones)."""
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or rel in (STATE_FILE, MANIFEST_FILE) or _OPTIONAL.match(rel):
            continue
        size = p.stat().st_size
        files[rel] = {"size": size, **({"sha256": sha256_of(p)} if size <= HASH_LIMIT else {})}
    atomic.write_text(folder / MANIFEST_FILE, json.dumps({"version": 1, "files": files}, indent=1))


def damage(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from (None: intact). Checks that the state file
    parses and, when a manifest was written (every checkpoint since manifests exist), that each
    file it lists is there with its size and hash."""
    try:
        state = structured.load_json((path / STATE_FILE).read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            return f"{STATE_FILE} is not a JSON object"
    except OSError as e:
        return f"{STATE_FILE} cannot be read ({e.strerror or e})"
    except structured.StructureError as e:
        return f"{STATE_FILE} {e}"
    except ValueError:
        return f"{STATE_FILE} is not valid JSON"
    manifest = path / MANIFEST_FILE
    if not manifest.exists():
        return None  # written before manifests existed: the state file is all there is to check
    try:
        files = structured.load_json(manifest.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST_FILE} cannot be read"
    if not isinstance(files, dict) or not all(isinstance(w, dict) for w in files.values()):
        return f"{MANIFEST_FILE} cannot be read"
    for rel, want in files.items():
        p = path / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != want.get("size"):
            return f"{rel} has {size} bytes, {want.get('size')} were written"
        if "sha256" in want and sha256_of(p) != want["sha256"]:
            return f"{rel} does not match the hash written with it"
    return None
