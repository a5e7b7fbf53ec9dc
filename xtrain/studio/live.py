"""A run as it trains, streamed to the page as server-sent events: its curves, its status and the
new lines of its log, each sent when its files change (the run's ``history.jsonl``, checkpoints,
result, lock and end record; the log), looked at every ``TICK_S``. The trainer is never asked
anything: its files are read, as a restarted studio reads them.

The curves are the report's (``report.page.curves``: the run read by ``report.runs.read_run``,
its history the longer of ``history.jsonl`` and its newest checkpoint's), drawn as inline SVG on
the server, at most once every ``REDRAW_S``. Several runs side by side (compare) are the same
stream over their folders, the report's sections redrawn together (``compare.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from xtrain.errors import XtrainError
from xtrain.evaluate import saved
from xtrain.report.html import note
from xtrain.runtime import lock, run_control
from xtrain.studio.runs import LOG_TAIL, config_value, launch_of, status
from xtrain.train.checkpoint.layout import CHECKPOINTS, RESULT_FILE
from xtrain.train.run_files import HISTORY

TICK_S = 0.5  # how often the files are looked at
REDRAW_S = 1.0  # the curves drawn at most this often
HEARTBEAT_S = 15.0  # a comment line keeps proxies and the browser from closing an idle stream
WATCHED = (HISTORY, RESULT_FILE, CHECKPOINTS, lock.LOCK_NAME, run_control.END_RECORD, saved.FOLDER)


def event(name: str, payload: Any) -> str:
    """One server-sent event: its name and one ``data:`` line of JSON (JSON holds no raw newline)."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def signature(folders: list[Path]) -> tuple:
    """What changes when a run writes anything the curves or status read."""
    out = []
    for folder in folders:
        for name in WATCHED:
            try:
                st = os.stat(folder / name)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
    return tuple(out)


def curves_html(folder: Path) -> str:
    """The run's curves as the report draws them, or one line saying why there are none yet."""
    from xtrain.report.page import curves
    from xtrain.report.runs import read_run

    try:
        view = read_run(folder)
    except XtrainError as e:
        return str(note(f"No curve yet: {e.message}."))
    if "task" not in view.record:  # a run that has not finished: its task from its config
        view.record = {**view.record, "task": config_value(folder, "model", "task") or "?"}
    return str(curves([view], False))


class Tail:
    """The new whole lines of a growing text file (a log), from its last ``LOG_TAIL`` characters
    on; a file that was replaced or cut starts over."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.key = path, None, None

    def read(self) -> str | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino)
        if self.offset is None or key != self.key or st.st_size < self.offset:
            self.key, self.offset = key, max(0, st.st_size - LOG_TAIL)
        if st.st_size == self.offset:
            return None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        whole = data.rfind(b"\n") + 1
        if not whole:
            return None
        self.offset += whole
        return data[:whole].decode("utf-8", errors="replace")


async def _stream(
    folders: list[Path], render: Callable[[], str], log: Path | None, closing: Callable[[], bool]
) -> AsyncIterator[str]:
    """The events of ``folders``: ``curves`` (``render``'s HTML) when their files change,
    ``status`` (each folder's) when it changes, ``log`` (new lines of ``log``)."""
    drawn: tuple | None = None
    shown: list[Any] | None = None
    tail = Tail(log) if log is not None else None
    last_draw = last_beat = 0.0
    while not closing():
        now = time.monotonic()
        seen = signature(folders)
        if seen != drawn and now - last_draw >= REDRAW_S:
            html = await anyio.to_thread.run_sync(render)
            yield event("curves", {"html": html})
            drawn, last_draw = seen, now
        states = [asdict(status(f)) for f in folders]
        if states != shown:
            yield event("status", {"runs": states})
            shown = states
        text = tail.read() if tail is not None else None
        if text:
            yield event("log", {"text": text})
        if now - last_beat >= HEARTBEAT_S:
            yield ": still here\n\n"
            last_beat = now
        await asyncio.sleep(TICK_S)


def run_stream(folder: Path, closing: Callable[[], bool]) -> AsyncIterator[str]:
    """One run's events: its curves, status and log."""
    launched = launch_of(folder)
    log = launched[0] / launched[1].log if launched is not None else None
    return _stream([folder], lambda: curves_html(folder), log, closing)


def many_stream(
    folders: list[Path], render: Callable[[], str], closing: Callable[[], bool]
) -> AsyncIterator[str]:
    """Several runs' events (compare): their sections redrawn together, each one's status."""
    return _stream(folders, render, None, closing)
