"""How data files are read (issue 41 §3.2, 3.3, 9; issue 46 §3): text cells read as text whatever
they look like, in JSON lines, JSON arrays, JSON objects holding their rows under a key, CSV and
Parquet alike (a property test); a file without its row format's columns
named in one line with the closest column and the key the user set; several files mixed and cut
by data.max_samples; another trainer's names at the command line answered."""

from __future__ import annotations

import datetime
import json
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from xtrain.config.loading import parse_override, read_config
from xtrain.config.schema import DataConfig, TrainConfig
from xtrain.data import mixing
from xtrain.data.rows import columns
from xtrain.data.rows.formats import text_names
from xtrain.data.sources import first_rows, load_source
from xtrain.errors import XtrainError

# cells a reader would take for something else: dates, times, numbers, booleans, nulls
LOOKALIKE = st.one_of(
    st.dates().map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat(sep=" ", timespec="seconds")),
    st.integers(-(10**6), 10**6).map(str),
    st.integers(0, 999).map(lambda n: f"{n:05d}"),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["true", "false", "True", "null", "NA", "N/A", "nan", "None"]),
)
KIND = st.sampled_from(["date", "same"])  # every cell a date (the JSON reader's case), or any mix


def _write(folder: Path, cells: list[str]) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"q{i}", "input": c, "output": c} for i, c in enumerate(cells)]
    out = {"jsonl": folder / "d.jsonl", "csv": folder / "d.csv", "parquet": folder / "d.parquet"}
    out |= {"array": folder / "a.json", "keyed": folder / "k.json"}
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out["array"].write_text(json.dumps(rows, indent=2))  # alpaca_data.json's shape
    out["keyed"].write_text(json.dumps({"version": "1", "data": rows}))  # the rows under one key
    lines = ["instruction,input,output"]
    lines += [f'{r["instruction"]},"{r["input"]}","{r["output"]}"' for r in rows]
    out["csv"].write_text("\n".join(lines) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), out["parquet"])
    return out


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LOOKALIKE, min_size=2, max_size=4), st.dates(), KIND)
@example(["x"], datetime.date(2019, 2, 15), "date")  # the file: every input a date
@example(["12", "007", "true", "null", "NA", ""], datetime.date(2019, 2, 15), "same")
def test_text_cells_are_read_as_written_in_every_format(cells, day, kind) -> None:
    if kind == "date":  # a whole column of ISO dates: pyarrow's JSON reader types it as timestamps
        cells = [day.isoformat()] * len(cells)
    text = text_names(DataConfig())
    with tempfile.TemporaryDirectory() as folder:
        for fmt, path in _write(Path(folder), cells).items():
            # the first rows first: once datasets has read a file whole, it knows its types
            first = first_rows(str(path), "auto", 10, text=text)[0] if fmt != "parquet" else None
            whole = load_source(str(path), text=text)
            for ds in (whole, first or whole):  # (Parquet stores its types: nothing is guessed)
                assert ds["input"] == cells and ds["output"] == cells, fmt


def test_compressed_files_and_one_object_files_are_read_as_meant(tmp_path: Path) -> None:
    import gzip

    rows = [{"instruction": f"q{i}", "input": "2019-02-15", "output": "a"} for i in range(3)]
    text = text_names(DataConfig())
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(json.dumps(rows).encode()))
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    (tmp_path / "one.json").write_text(json.dumps(chat, indent=2))  # one conversation, not rows
    for name in ("r.jsonl.gz", "r.json.gz"):
        ds, total = first_rows(str(tmp_path / name), "auto", 10, text=text)
        assert ds["input"] == ["2019-02-15"] * 3 and total == 3, name
        assert load_source(str(tmp_path / name), text=text)["instruction"] == ["q0", "q1", "q2"], name
    ds = load_source(str(tmp_path / "one.json"), text=text)
    assert ds.column_names == ["messages"] and len(ds) == 1 and ds[0] == chat


def _cfg(*overrides: str) -> TrainConfig:
    return read_config(None, ["model.task=causal-lm", *overrides])


def _ds(rows: list[dict]):
    import datasets

    return datasets.Dataset.from_list(rows)


def test_a_misspelt_column_is_named_with_the_format_that_needs_it() -> None:
    ds = _ds([{"instruction": "Say hi.", "input": "", "ouput": "hi"}])
    with pytest.raises(XtrainError) as e:
        columns.row_format(_cfg(), ds, "a.jsonl")
    assert e.value.message.startswith("alpaca rows need 'output' (did you mean 'ouput'?)")
    assert "data.text_column" not in e.value.one_line()


def test_the_column_key_the_user_set_is_named() -> None:
    ds = _ds([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])
    with pytest.raises(XtrainError) as e:
        columns.row_format(_cfg("data.messages_column=msgs"), ds, "m.jsonl")
    assert "messages rows need 'msgs' (did you mean 'messages'?)" in e.value.message
    assert "data.messages_column=msgs" in e.value.hint
    assert columns.row_format(_cfg(), ds, "m.jsonl") == "messages"


def test_predict_speaks_of_the_runs_format_and_the_files_columns() -> None:
    ds = _ds([{"text": "a story"}])
    with pytest.raises(XtrainError) as e:
        columns.require(_cfg(), "sharegpt", ds, "p.jsonl", "the run")
    line = e.value.one_line()
    assert "the run was trained on sharegpt rows" in line and "'conversations'" in line and "has text" in line
    assert "data." not in line
    columns.require(_cfg(), "alpaca", _ds([{"instruction": "x"}]), "p.jsonl", "the run")  # prompts alone


@settings(max_examples=15, deadline=None)
@given(st.text(string.ascii_lowercase, min_size=3, max_size=8))
def test_no_format_is_one_line_naming_a_format_and_the_columns(name: str) -> None:
    ds = _ds([{name: "x"}])
    cfg = _cfg()
    if name in ("text", "messages", "conversations"):
        return
    with pytest.raises(XtrainError) as e:
        columns.row_format(cfg, ds, "f.jsonl")
    assert " rows need '" in e.value.message and f"f.jsonl has {name}" in e.value.message


def test_files_are_cut_and_mixed_the_same_way_every_time() -> None:
    a = _ds([{"text": f"a{i}"} for i in range(10)])
    b = _ds([{"text": f"b{i}"} for i in range(4)])
    d = DataConfig(train=["a", "b"], max_samples=6)
    parts = [mixing.first_n(a, d.max_samples), mixing.first_n(b, d.max_samples)]
    both = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)]
    assert mixing.mix(parts, ["a", "b"], d, seed=1)["text"] == both
    d = DataConfig(train=["a", "b"], mix="interleave_under", mix_probs=[0.5, 0.5])
    once = mixing.mix([a, b], ["a", "b"], d, seed=3)["text"]
    assert once == mixing.mix([a, b], ["a", "b"], d, seed=3)["text"]
    assert sum(t.startswith("b") for t in once) == 4  # stops when b runs out
    d.mix = "interleave_over"
    assert {f"a{i}" for i in range(10)} <= set(mixing.mix([a, b], ["a", "b"], d, seed=3)["text"])
    assert "shares 0.50, 0.50" in (mixing.describe(d) or "")
    with pytest.raises(XtrainError, match="other columns"):
        mixing.mix([a, _ds([{"prompt": "p"}])], ["a", "c"], DataConfig(train=["a", "c"]), seed=1)


def test_mix_probs_are_one_per_file_and_only_for_interleaving() -> None:
    with pytest.raises(XtrainError, match="2 shares for 3"):
        mixing.check(DataConfig(train=["a", "b", "c"], mix="interleave_over", mix_probs=[1, 1]))
    with pytest.raises(XtrainError, match="data.mix=concat"):
        mixing.check(DataConfig(train=["a", "b"], mix_probs=[1, 1]))
    cfg = _cfg("data.train=[a.jsonl,b.jsonl]", "data.mix=interleave", "data.max_samples=5")
    assert cfg.data.train == ["a.jsonl", "b.jsonl"] and cfg.data.mix == "interleave_under"


@pytest.mark.parametrize(
    ("override", "key"),
    [("max_samples=100", "data.max_samples=100"), ("cutoff_len=512", "data.max_length=512"),
     ("mix_strategy=interleave_over", "data.mix=interleave_over"),
     ("dataset_text_field=body", "data.text_column"),
     ("sequence_len=64", "data.max_length=64"), ("max_length=64", "data.max_length=64")],
)  # fmt: skip
def test_an_override_without_a_section_is_answered_with_the_xtrain_key(override: str, key: str) -> None:
    with pytest.raises(XtrainError) as e:
        parse_override(override)
    assert key in e.value.hint
