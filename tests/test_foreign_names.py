"""Names from other trainers (xtrain/config/foreign.py): every entry of the one table names a
real xtrain key (and a value it takes), and an unknown key from another trainer is answered with it,
under any section, at the top level and as an override; docs/configuration.md shows the same table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xtrain.config import foreign
from xtrain.config.schema import TrainConfig, config_keys, section_fields, sections
from xtrain.config.values import set_value
from xtrain.errors import XtrainError
from xtrain.tasks.validation import config_from_dict, load_config

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
KEYS = set(config_keys())
NAMES = sorted(foreign.FOREIGN)
KEY_LIKE = re.compile(r"\b(?:" + "|".join(sections()) + r")\.[a-z_]+\b")


def is_key_of(section: str, name: str) -> bool:
    return section in sections() and name in section_fields(sections()[section])


@given(st.sampled_from(NAMES))
def test_every_entry_names_a_real_key_and_a_value_it_takes(name: str) -> None:
    entry = foreign.FOREIGN[name]
    assert entry.key is not None or entry.how, name
    if entry.key is not None:
        assert entry.key in KEYS, name
        if entry.value:  # the value the other trainer's flag stands for is valid here
            set_value(TrainConfig(), entry.key, entry.value)
        if entry.how:
            assert entry.key in entry.how, name  # how xtrain does it names the key
    for mentioned in KEY_LIKE.findall(entry.how):
        assert mentioned in KEYS, (name, mentioned)
    assert name not in KEYS  # a table name never shadows a real key


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NAMES), st.sampled_from([*sections(), "training", "trainer", None]), st.booleans())
def test_an_unknown_name_from_another_trainer_is_answered(name: str, section: str | None, yaml: bool) -> None:
    """In a YAML mapping (under a section or at the top level) and as an override alike."""
    if section is not None and is_key_of(section, name):
        return  # a real key there (run.max_steps): nothing to answer
    with pytest.raises(XtrainError) as e:
        if yaml:
            config_from_dict({section: {name: 1}} if section else {name: 1})
        else:
            load_config(None, [f"{section}.{name}=1" if section else f"{name}=1"])
    entry = foreign.FOREIGN[name]
    if entry.key is None:
        assert e.value.hint == foreign.answer(name)
    else:  # the table's answer, or (a name xtrain has in another section) "did you mean" that key
        assert entry.key in e.value.hint


@settings(max_examples=50)
@given(st.text(max_size=40))
def test_answer_is_none_for_names_not_in_the_table(text: str) -> None:
    leaf = text.strip().rsplit(".", 1)[-1].lower().replace("-", "_")
    assert (foreign.answer(text) is None) == (leaf not in foreign.FOREIGN)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # the trial's three: difflib had answered warmup_ratio, audio_column and max_steps
        ("optim.learning_rate=1e-4", "is optim.lr in xtrain"),
        ("data.cutoff_len=1024", "is data.max_length in xtrain"),
        ("run.logging_steps=5", "is run.log_every in xtrain"),
        ("batch.gradient_accumulation_steps=4", "accumulation is derived from batch.global_batch / "
         "(batch.per_device x processes): set batch.global_batch"),
        ("run.bf16=true", "is run.mixed_precision: bf16 in xtrain"),
        ("lora_rank=16", "is lora.r in xtrain"),
        ("run.deepspeed=zero3", "xtrain train CONFIG --deepspeed zero2"),
        ("optim.warmupratio=0.1", "did you mean 'optim.warmup_ratio'?"),  # a typo: the closest name
    ],
)  # fmt: skip
def test_the_answers_read_as_one_line(override: str, expected: str) -> None:
    with pytest.raises(XtrainError) as e:
        load_config(None, [override])
    assert expected in e.value.one_line() and "\n" not in e.value.one_line()


def test_the_docs_table_is_the_table() -> None:
    assert foreign.doc_table() in DOCS.read_text(encoding="utf-8")
