"""Rows encoded once (xtrain/data/encoded.py): chat rows through ``datasets.map``, the same rows
as the row-by-row encoding on any number of encoding processes (packed too), read from the cache
by the next build, encoded again after one row of the file changes, never read from what a kill
mid-encoding left; the dry run's word on it; the progress the run's reporter shows."""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from xtrain.data import encoded
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.packing import pack_all
from xtrain.errors import RowError

pytestmark = pytest.mark.usefixtures("private_caches")

WORDS = ("the cat dog is in park red blue what where how happy it a ball kite box").split()  # noqa: SIM905
MODEL = "builtin:tiny-llama-chat"


def conversations(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of 2 to 4 turns, answers of 2 to 30 words; a tenth ask at such length that
    their answers lie past a 64-token cut."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    rows = []
    for _ in range(n):
        turns = [{"role": "user", "content": words(rng.randint(2, 8) if rng.random() < 0.9 else 70)},
                 {"role": "assistant", "content": words(rng.randint(2, 30))}]  # fmt: skip
        if rng.random() < 0.5:
            turns += [{"role": "user", "content": words(3)}, {"role": "assistant", "content": words(4)}]
        rows.append({"messages": turns})
    return rows


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def config(path: Path, *extra: str) -> Any:
    from xtrain.tasks.validation import load_config

    return load_config(None, [f"model.name_or_path={MODEL}", "model.task=causal-lm", f"data.train={path}",
                              "data.eval=null", "data.max_length=64", *extra])  # fmt: skip


def encode_all(cfg: Any) -> Any:
    """The training rows as the run's build encodes them (``tasks/text/rows.encoded_sets``)."""
    from xtrain.tasks.common import prepare_tokenizer, raw_datasets
    from xtrain.tasks.text.rows import encoded_sets

    source, tokenizer = prepare_tokenizer(cfg, contextlib.nullcontext)
    return encoded_sets(cfg, tokenizer, source, *raw_datasets(cfg))[2]


def row_by_row(cfg: Any, rows: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
    """The plain reference: each conversation rendered and labelled alone, cut, the rows without
    a trained token left out (what causal-lm's chat rows were before they were encoded once)."""
    from xtrain.data.rows import tools
    from xtrain.tasks.common import prepare_tokenizer
    from xtrain.tasks.text.rows import chat_render

    source, tokenizer = prepare_tokenizer(cfg, contextlib.nullcontext)
    render = chat_render(cfg, tokenizer, source, "messages")
    out = []
    for i, row in enumerate(rows):
        enc = tools.text_chat_encoded(row["messages"], i, render, tokenizer, "x")
        ids, labels = enc.input_ids[:64], enc.labels[:64]
        if any(t != IGNORE_INDEX for t in labels[1:]):
            out.append({"input_ids": ids, "labels": labels})
    return out


def in_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(folder))


def test_chat_rows_are_the_row_by_row_rows_on_any_number_of_processes(tmp_path, monkeypatch):
    rows = conversations(400)
    path = write(tmp_path / "chat.jsonl", rows)
    want = row_by_row(config(path), rows)
    assert 0 < len(want) < len(rows)  # some rows' answers all lie past the cut: left out
    for processes in (1, 2):  # each in a cache of its own: encoded, not read back
        in_cache(monkeypatch, tmp_path / f"cache-{processes}")
        got = encode_all(config(path, f"data.encode_processes={processes}"))
        assert got.to_list() == want, processes
        packed = encode_all(config(path, f"data.encode_processes={processes}", "data.packing=on"))
        assert packed.to_list() == pack_all(want, 64), processes  # the same groups on any count
    bad = write(tmp_path / "bad.jsonl", [*rows[:300], {"messages": [{"role": "robot", "content": "hi"}]}])
    with pytest.raises(RowError, match=r"row 300 of .*bad.jsonl: turn 0 has role 'robot'"):
        encode_all(config(bad, "data.encode_processes=2"))  # raised in an encoding process: its one line


def test_an_unchanged_file_is_read_back_and_an_edited_row_encoded_again(tmp_path, monkeypatch):
    in_cache(monkeypatch, tmp_path / "cache")
    rows = conversations(300, seed=1)
    path = write(tmp_path / "chat.jsonl", rows)
    first = encode_all(config(path))
    files = [f["filename"] for f in first.cache_files]

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an unchanged file must not be encoded again")

    with monkeypatch.context() as m:
        m.setattr("xtrain.data.rows.text_chat.columns", refuse)
        again = encode_all(config(path))
    assert [f["filename"] for f in again.cache_files] == files and again.to_list() == first.to_list()

    rows[3]["messages"][1]["content"] = "a ball is red"  # one answer edited, in place
    write(path, rows)
    edited = encode_all(config(path))
    assert edited.to_list() == row_by_row(config(path), rows)
    assert edited[3] != first[3] and edited[4] == first[4]
    assert not set(f["filename"] for f in edited.cache_files) & set(files)
    assert encode_all(config(path, "data.train_on=all"))[0] != edited[0]  # a setting: another entry


def test_the_dry_run_says_whether_the_rows_are_cached(tmp_path, monkeypatch):
    from xtrain.tasks.text import causal_lm

    in_cache(monkeypatch, tmp_path / "cache")
    path = write(tmp_path / "chat.jsonl", conversations(500, seed=2))
    cfg = config(path)
    before = causal_lm.check_data(cfg, 100).encoding or ""
    assert "not cached yet" in before and "about 500 rows" in before, before
    encode_all(cfg)
    after = causal_lm.check_data(cfg, 100).encoding
    assert after == "encoded rows: cached (the run reads them from datasets' cache, encoding nothing)"
    other = causal_lm.check_data(config(path, "data.max_length=32"), 100).encoding or ""
    assert "not cached yet" in other and "encodes 500 rows" in other  # read before: counted exactly


KILLED = """
import sys, time
import xtrain.data.encoded as encoded
import xtrain.data.rows.text_chat as text_chat
encoded.ARROW_BATCH = 500  # batches of 500 rows, each written as it is done: a kill lands mid-shard
real = text_chat.columns

def slow(*args, **kwargs):  # every map batch: slow enough for the kill to land mid-encoding
    time.sleep(0.5)
    return real(*args, **kwargs)

text_chat.columns = slow
sys.path.insert(0, sys.argv[1])
from test_encoded import config, encode_all
from pathlib import Path
encode_all(config(Path(sys.argv[2]), "data.encode_processes=2"))
"""


def test_a_kill_mid_encoding_leaves_nothing_a_later_run_reads(tmp_path, monkeypatch, private_caches):
    """SIGKILL of the process group (the encoding processes with it) while the batches are being
    written: the next encoding reads none of it, and its rows are the row-by-row rows."""
    from support.jobs import offline_env, run_until

    from xtrain.data.sources import load_source

    cache = tmp_path / "cache"
    rows = conversations(4000, seed=3)
    path = write(tmp_path / "chat.jsonl", rows)
    in_cache(monkeypatch, cache)
    load_source(str(path))  # the file's Arrow copy, as the run's first step leaves it
    script = tmp_path / "encode.py"
    script.write_text(KILLED)
    want = row_by_row(config(path), rows)  # (the built-in model on disk before the child reads it)
    env = {**offline_env(tmp_path, private_caches / "xtrain"), "HF_DATASETS_CACHE": str(cache)}

    def writing() -> bool:  # datasets writes a batch's rows under a temporary name first
        return any(p.name.startswith("tmp") and p.stat().st_size > 0 for p in cache.rglob("tmp*"))

    code = run_until([sys.executable, str(script), str(Path(__file__).parent), str(path)], env, writing)
    assert code == -9, "the encoding ended before the kill"
    assert not any(cache.rglob("cache-*.arrow")), "no shard could be whole yet"
    got = encode_all(config(path, "data.encode_processes=2"))
    assert got.to_list() == want
    assert all(Path(f["filename"]).name.startswith("cache-") for f in got.cache_files)


def test_the_progress_reaches_the_reporter_and_ends_once():
    import datasets
    from rich.console import Console

    from xtrain.train.report import RichReporter

    events: list[tuple[str, int, int]] = []
    ds = datasets.Dataset.from_dict({"x": list(range(encoded.REPORT_ROWS + 500))})
    double = encoded.Encoding("double", _double, {}, ("double", 1), with_indices=False)
    with encoded.reporting(lambda *event: events.append(event)):
        out = encoded.encode(ds, double, "encoding train")
    assert out["y"][:3] == [0, 2, 4]
    total = len(ds)
    assert events[0] == ("encoding train", 0, total) and events[-1] == ("encoding train", total, total)
    assert [e for e in events if e[1] == total] == [events[-1]]  # the end, said once
    assert all(a[1] <= b[1] for a, b in zip(events, events[1:], strict=False))
    printed = io.StringIO()
    reporter = RichReporter(Console(file=printed, force_terminal=False, width=200))
    for event in events:
        reporter.encoding(*event)
    assert printed.getvalue().count("encoding train") == 1, printed.getvalue()
    assert f"{total:,} rows in" in printed.getvalue() and "rows/s" in printed.getvalue()


def _double(batch: dict[str, list[int]]) -> dict[str, list[int]]:
    return {"y": [2 * x for x in batch["x"]]}


def test_kto_rows_take_the_next_completion_across_a_batch_edge():
    """A KTO row's KL sequence pairs its prompt with the next row's completion (the last row's: the
    first's): the same rows whether the map batch ends inside the data or not, pairs too."""
    import datasets

    from xtrain.data.rows import preference as rows_
    from xtrain.model.load import load_tokenizer, resolve_model

    encoder = rows_.Encoder(load_tokenizer(resolve_model("builtin:tiny-llama"), False), 64)
    kto = [{"prompt": f"q {i}", "completion": f"a {i}", "label": i % 2 == 0} for i in range(7)]
    pairs = [{"prompt": f"q {i}", "chosen": f"yes {i}", "rejected": f"no {i}"} for i in range(5)]
    for data in (kto, pairs):
        ds = datasets.Dataset.from_list(data)
        kwargs = rows_.encoding(ds, "x", encoder, True, "").kwargs
        whole = rows_.columns(ds[:], list(range(len(ds))), **kwargs)
        halves = [rows_.columns(ds[a:b], list(range(a, b)), **kwargs) for a, b in ((0, 3), (3, len(ds)))]
        assert {k: halves[0][k] + halves[1][k] for k in whole} == whole
        first = rows_.read_rows(ds, "x")
        want = rows_.unpaired_rows(first if "label" in data[0] else rows_.as_unpaired(first), encoder, "x")
        assert [dict(zip(whole, v, strict=True)) for v in zip(*whole.values(), strict=True)] == want
