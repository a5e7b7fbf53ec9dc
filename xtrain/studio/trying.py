"""Try: the run's start and its result answer the same input side by side (a chat prompt, with
tools for a run that calls them; an image for the vision tasks; an audio file for speech), each
through ``xtrain predict``'s own function, in a process of its own (``jobs.py``: models are
loaded there, never in the server). The files the page sends are kept in a private temporary
folder for the answer's time, then removed."""

from __future__ import annotations

import base64
import binascii
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.studio.runs import config_value, status

MAX_BYTES = 64 << 20  # an image or audio file sent from the page
TIMEOUT_S = 1800  # two models loaded and answering on a CPU: minutes for a real one
SUFFIXES = {
    "image": (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"),
    "audio": (".wav", ".flac", ".mp3", ".ogg"),
}


def _file(tmp: Path, kind: str, sent: Any) -> str | None:
    """A file the page sent (``{"name", "data"}``, base64), written into ``tmp``."""
    if not sent:
        return None
    if not isinstance(sent, dict) or not isinstance(sent.get("data"), str):
        raise XtrainError(f"the {kind} file did not come through", "choose the file again")
    suffix = Path(str(sent.get("name") or "")).suffix.lower()
    if suffix not in SUFFIXES[kind]:
        raise XtrainError(f"{sent.get('name')} is not an {kind} file xtrain reads",
                          f"one of {', '.join(SUFFIXES[kind])}")  # fmt: skip
    if len(sent["data"]) > MAX_BYTES * 4 // 3 + 4:
        raise XtrainError(f"the {kind} file is over {MAX_BYTES >> 20} MiB", "send a smaller one")
    try:
        data = base64.b64decode(sent["data"], validate=True)
    except (binascii.Error, ValueError):
        raise XtrainError(f"the {kind} file did not come through", "choose the file again") from None
    path = tmp / f"input{suffix}"
    path.write_bytes(data)
    return str(path)


def _arguments(tmp: Path, body: dict[str, Any]) -> list[str]:
    args = []
    for key in ("prompt", "system"):
        text = body.get(key)
        if isinstance(text, str) and text.strip():
            args += [f"--{key}", text]
    for kind in ("image", "audio"):
        if (path := _file(tmp, kind, body.get(kind))) is not None:
            args += [f"--{kind}", path]
    tools = body.get("tools")
    if isinstance(tools, str) and tools.strip():
        try:
            json.loads(tools)
        except ValueError as e:
            raise XtrainError(f"the tools are not JSON ({e})", "paste a JSON list of tool schemas") from None
        (tmp / "tools.json").write_text(tools, encoding="utf-8")
        args += ["--tools", str(tmp / "tools.json")]
    tokens = body.get("max_new_tokens")
    if tokens not in (None, ""):
        if not str(tokens).isdigit() or not 0 < int(tokens) <= 4096:
            raise XtrainError(f"max new tokens {tokens} is not a whole number in 1..4096", "e.g. 64")
        args += ["--max-new-tokens", str(int(tokens))]
    return args


def try_run(run: Path, body: dict[str, Any]) -> dict[str, Any]:
    """Both answers (``{"start", "base": rows, "trained": rows}``), or one line."""
    if status(run).state != "finished":
        raise XtrainError(f"{run.name} has no result yet", "try it once it has finished")
    start = config_value(run, "model", "name_or_path")
    if not isinstance(start, str) or not start:
        raise XtrainError(f"{run.name} does not say which model it started from", "its config lacks one")
    with tempfile.TemporaryDirectory(prefix="xtrain-studio-try-") as folder:
        tmp = Path(folder)
        args = _arguments(tmp, body)
        if not any(a in args for a in ("--prompt", "--image", "--audio")):
            raise XtrainError("nothing to answer", "write a prompt, or choose an image or audio file")
        result = tmp / "answer.json"
        cmd = [sys.executable, "-m", "xtrain.studio.jobs", "try", str(run), start, str(result), *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise XtrainError(f"no answer within {TIMEOUT_S // 60} minutes", "try a shorter answer") from None
        try:
            answer = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last = (done.stderr.strip().splitlines() or ["it ended without an answer"])[-1]
            raise XtrainError(f"the answer failed: {last}") from None
    if not answer.get("ok"):
        raise XtrainError(str(answer.get("error") or "the answer failed"))
    sent = {str(tmp / f"input{Path(str(f.get('name'))).suffix.lower()}"): str(f.get("name"))
            for f in (body.get("image"), body.get("audio")) if isinstance(f, dict)}  # fmt: skip
    for rows in (answer.get("base") or [], answer.get("trained") or []):
        for row in rows:  # the file as the user chose it, not the temporary copy answered
            if isinstance(row, dict) and row.get("input") in sent:
                row["input"] = sent[row["input"]]
    return answer
