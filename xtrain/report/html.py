"""The few HTML pieces the report is built of. Every value is escaped on its way in (``esc``);
only markup this package made itself is passed through, marked as ``Raw``. So a data row, a
sample answer, a run folder's name or a metric's name can hold ``<script>`` and stays text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any


class Raw(str):
    """HTML this package made (its pieces escaped already): passed through as it is."""


def esc(value: Any) -> str:
    return value if isinstance(value, Raw) else escape(str(value), quote=True)


def tag(name: str, body: Any = "", **attributes: Any) -> Raw:
    """``<name attr="...">body</name>``: the body escaped unless ``Raw``; ``class_`` for class."""
    attrs = "".join(
        f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attributes.items() if v is not None
    )
    return Raw(f"<{name}{attrs}>{esc(body)}</{name}>")


def join(parts: Iterable[Any], sep: str = "") -> Raw:
    return Raw(sep.join(esc(p) for p in parts))


def table(head: Sequence[Any], rows: Iterable[Sequence[Any]], class_: str | None = None) -> Raw:
    """A table: a header row and one row per sequence (cells escaped unless ``Raw``)."""
    header = tag("tr", join(tag("th", h) for h in head))
    body = join(tag("tr", join(tag("td", c) for c in row)) for row in rows)
    return tag("table", join([tag("thead", header), tag("tbody", body)]), class_=class_)


def section(id_: str, title: str, *parts: Any) -> Raw:
    return tag("section", join([tag("h2", title), *parts]), id=id_)


def note(text: Any) -> Raw:
    return tag("p", text, class_="note")


def value(v: Any, digits: int = 4) -> str:
    """A metric's value as a table shows it."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 1e5 else f"{v:.4g}"
    return str(v)
