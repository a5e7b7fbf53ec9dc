"""Property-based tests (hypothesis) of what xtrain reads from users: the YAML config and its
``key=value`` overrides, facts snapshots, checkpoint state, and the rows of causal-lm and seq-cls
data (JSONL and CSV with random types, missing and extra fields). The one property: a valid
object or xtrain's own ``XtrainError`` (one line), never another exception.

Example counts are bounded (the whole module runs in well under a minute on 2 cores); a failing
example hypothesis finds is kept below as a regular regression test."""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from xtrain.config.schema import config_keys
from xtrain.errors import XtrainError

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = config_keys()
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def xtrain_or_valid(fn: Any, *args: Any) -> Any:
    """``fn(*args)``; an ``XtrainError`` must be one line. Any other exception fails the test."""
    try:
        return fn(*args)
    except XtrainError as e:
        assert "\n" not in e.one_line()
        return None


# -- the config file and its overrides -------------------------------------------------------------

sections = st.dictionaries(
    st.sampled_from([k.split(".")[0] for k in KEYS]) | st.text(max_size=6),
    st.none() | json_values | st.dictionaries(
        st.sampled_from([k.split(".")[1] for k in KEYS]) | st.text(max_size=6), json_values, max_size=4
    ),
    max_size=4,
)  # fmt: skip


def _load(text: str, overrides: list[str] = ()) -> Any:
    from xtrain.tasks.validation import load_config

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.yaml"
        path.write_text(text, encoding="utf-8")
        return load_config(path, overrides)


@FAST
@given(sections)
def test_a_config_file_is_a_config_or_one_line(data: dict[str, Any]) -> None:
    import yaml

    xtrain_or_valid(_load, yaml.safe_dump(data, allow_unicode=True))


@FAST
@given(st.text(max_size=200))
def test_any_text_as_a_config_is_a_config_or_one_line(text: str) -> None:
    xtrain_or_valid(_load, text)


@FAST
@given(st.sampled_from(KEYS) | st.text(max_size=12), st.text(max_size=30) | json_values.map(json.dumps))
def test_an_override_is_a_config_or_one_line(key: str, value: str) -> None:
    xtrain_or_valid(_load, "", [f"{key}={value}"])


# -- facts snapshots -------------------------------------------------------------------------------


def _facts_fields() -> list[str]:
    from xtrain.machine.facts import Facts

    return list(Facts().to_dict())


@FAST
@given(st.dictionaries(st.sampled_from(_facts_fields()) | st.text(max_size=6), json_values, max_size=4))
def test_a_facts_file_is_facts_or_one_line(changes: dict[str, Any]) -> None:
    from xtrain.machine.facts import Facts

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "facts.json"
        path.write_text(json.dumps({**Facts().to_dict(), **changes}), encoding="utf-8")
        xtrain_or_valid(Facts.load, path)


# -- checkpoint state ------------------------------------------------------------------------------

STATE = {
    "step": 2, "epoch": 0, "step_in_epoch": 2, "samples_seen": 16, "seed": 7, "global_batch": 8,
    "per_device": 4, "world_size": 1, "accumulation": 2, "num_samples": 64, "total_steps": 4,
    "config": {"lora": {"r": 4}}, "losses": [[1, 2.5]], "eval_history": [{"step": 2, "eval_loss": 1.0}],
}  # fmt: skip


def _read_state(state: Any) -> Any:
    from xtrain.train.checkpoint import read_state

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step-2"
        path.mkdir()
        (path / "xtrain_state.json").write_text(json.dumps(state), encoding="utf-8")
        return read_state(path, {"lora": {"r": 4}, "optim": {"lr": 0.1}})


@FAST
@given(st.dictionaries(st.sampled_from(list(STATE)) | st.text(max_size=6), json_values, max_size=4))
def test_checkpoint_state_is_a_state_or_one_line(changes: dict[str, Any]) -> None:
    from xtrain.train.checkpoint import TrainState

    state = xtrain_or_valid(_read_state, {**STATE, **changes})
    if state is not None:  # every field of the type the loop uses
        assert (
            isinstance(state, TrainState) and isinstance(state.step, int) and isinstance(state.losses, list)
        )


@FAST
@given(json_values)
def test_any_json_as_checkpoint_state_is_a_state_or_one_line(state: Any) -> None:
    xtrain_or_valid(_read_state, state)


# -- data rows: causal-lm and seq-cls --------------------------------------------------------------

rows = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "text": st.text(max_size=20) | json_values,
            "label": st.sampled_from(["pos", "neg", 0, 1]) | json_values,
            "extra": json_values,
        },
    ),
    min_size=1,
    max_size=6,
)
cells = st.text(max_size=12) | st.integers(-5, 5) | st.floats(allow_nan=True)


def _write(folder: Path, data: list[dict[str, Any]], as_csv: bool) -> Path:
    if not as_csv:
        path = folder / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
        return path
    path = folder / "rows.csv"
    columns = sorted({k for r in data for k in r})
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in data:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    return path


def _build(task: str, data: list[dict[str, Any]], as_csv: bool) -> Any:
    from support.workloads import build_workload

    from xtrain.tasks.validation import load_config

    model = "builtin:tiny-bert" if task == "seq-cls" else "builtin:tiny-llama"
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), data, as_csv)
        cfg = load_config(
            None, [f"model.task={task}", f"model.name_or_path={model}", f"data.train={path}",
                   "data.eval=null", "data.max_length=16"],
        )  # fmt: skip
        return build_workload(cfg)


@SLOW
@given(rows, st.booleans())
@example([{"text": "", "label": [{"": None, "\x00": None}]}], False)  # keys Arrow reads as one name
def test_seq_cls_rows_are_a_workload_or_one_line(data: list[dict[str, Any]], as_csv: bool) -> None:
    xtrain_or_valid(_build, "seq-cls", data, as_csv)


@SLOW
@given(rows, st.booleans())
def test_causal_lm_rows_are_a_workload_or_one_line(data: list[dict[str, Any]], as_csv: bool) -> None:
    xtrain_or_valid(_build, "causal-lm", data, as_csv)


# -- regression tests: examples hypothesis found ---------------------------------------------------


def test_a_facts_key_with_a_line_break_is_still_one_line(tmp_path: Path) -> None:
    from xtrain.machine.facts import Facts

    path = tmp_path / "facts.json"
    path.write_text(json.dumps({**Facts().to_dict(), "\n": None}), encoding="utf-8")
    with pytest.raises(XtrainError, match=r"facts have unknown keys: '\\n'") as e:
        Facts.load(path)
    assert "\n" not in e.value.one_line()


@pytest.mark.parametrize("text", ['"\\n": 1\n', 'model:\n  "a\\nb": 1\n'])
def test_a_config_name_with_a_line_break_is_still_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    from xtrain.tasks.validation import load_config

    with pytest.raises(XtrainError, match=r"unknown (section|key) '.*\\n") as e:
        load_config(path)
    assert "\n" not in e.value.one_line()
