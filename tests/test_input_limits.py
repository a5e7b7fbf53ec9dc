"""The limits on what a user's input may make xtrain do (issue 31's bad-input classes): an image
whose header declares a huge size (decompression bomb), an audio clip without samples, YAML
aliases that expand exponentially, and long values in error lines. The CLI cases (one line,
exit 2, nothing lost) are in tests/test_bad_inputs.py; these check the rules themselves."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from xtrain import structured
from xtrain.data.rows.audio import UnreadableAudio, check_audio_files, read_audio
from xtrain.data.rows.images import MAX_PIXELS, UnreadableImage, open_image
from xtrain.errors import SHOWN_CHARS, XtrainError, shown

FAST = settings(max_examples=60, deadline=None)


# -- decompression bombs ---------------------------------------------------------------------------
def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, height), 255).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    ("limit", "refused"),
    [(None, False), (150, False), (149, True), (100, True), (20, True), (MAX_PIXELS, False)],
)
def test_an_image_above_the_pixel_limit_is_refused_undecoded(limit: int | None, refused: bool) -> None:
    """15 x 10 = 150 pixels. Pillow only warns up to twice its limit (and decodes): 149 and 100
    take that path, 20 its error path; both are one refusal here."""
    cell = {"bytes": _png(15, 10), "path": None}
    before = Image.MAX_IMAGE_PIXELS
    if refused:
        with pytest.raises(UnreadableImage) as e:
            open_image(cell, None, 3, "train.jsonl", limit)
        assert e.value.message == (
            f"cannot read image embedded image bytes (row 3 of train.jsonl): it declares 150 pixels, "
            f"above data.max_image_pixels={limit}"
        )
        assert "raise data.max_image_pixels" in (e.value.hint or "")
    else:
        assert open_image(cell, None, 3, "train.jsonl", limit).size == (15, 10)
    assert before == Image.MAX_IMAGE_PIXELS  # Pillow's global is put back


def test_a_bomb_given_to_predict_is_one_line(tmp_path: Path) -> None:
    from support.media import png_declaring

    from xtrain.tasks.predicting import read_input

    bomb = tmp_path / "scan.png"
    bomb.write_bytes(png_declaring(100_000, 100_000))  # 100 bytes on disk, 10^10 pixels declared
    with pytest.raises(XtrainError) as e:
        read_input(bomb, "image", lambda: open_image(str(bomb), None, 0, ""))
    assert e.value.one_line().startswith(
        f"input {bomb} is not a readable image: it declares 10000000000 pixels, above "
        f"data.max_image_pixels={MAX_PIXELS}"
    )


# -- audio without samples ---------------------------------------------------------------------------
def _wav(frames: int) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, np.zeros(frames, dtype="float32"), 16000, format="WAV")
    return out.getvalue()


@pytest.mark.parametrize(
    "cell",
    [{"bytes": _wav(0), "path": None}, {"array": np.zeros(0, dtype="float32"), "sampling_rate": 16000}],
    ids=["embedded-bytes", "decoded"],
)
def test_a_clip_without_samples_is_refused_with_its_row(cell: dict) -> None:
    with pytest.raises(UnreadableAudio) as e:
        read_audio(cell, None, 7, "clips.jsonl", 16000)
    assert "(row 7 of clips.jsonl): no samples, an empty recording" in e.value.message
    assert read_audio({"bytes": _wav(160), "path": None}, None, 7, "clips.jsonl", 16000).shape == (160,)


def test_a_csv_of_clips_is_checked_before_training(tmp_path: Path) -> None:
    """CSV columns load as large_string in datasets 5: the up-front header check reads them too."""
    import datasets

    (tmp_path / "a.wav").write_bytes(_wav(1600))
    (tmp_path / "b.wav").write_bytes(_wav(0))
    (tmp_path / "clips.csv").write_text("audio,text\na.wav,one\nb.wav,two\n")
    ds = datasets.load_dataset("csv", data_files=str(tmp_path / "clips.csv"), split="train")
    with pytest.raises(UnreadableAudio, match=r"b\.wav \(row 1 of clips\.csv\): no samples"):
        check_audio_files(ds, "audio", tmp_path, "clips.csv", None, "refuse")


# -- YAML aliases ------------------------------------------------------------------------------------
def _chain(fanouts: list[int]) -> tuple[str, int]:
    """YAML whose anchor i is a list of ``fanouts[i]`` aliases of anchor i-1 (anchor 0: a list of
    ``fanouts[0]`` scalars), and the number of values it expands to (keys and the top mapping too)."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * fanouts[0])}]"]
    sizes = [1 + fanouts[0]]
    for i, fan in enumerate(fanouts[1:], 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]")
        sizes.append(1 + fan * sizes[-1])
    return "\n".join(lines) + "\n", 1 + sum(1 + s for s in sizes)


@FAST
@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=12))
def test_aliases_are_refused_exactly_when_they_expand_too_far(fanouts: list[int]) -> None:
    text, size = _chain(fanouts)
    deep = len(fanouts) + 1 > structured.MAX_DEPTH
    if size <= structured.MAX_NODES and not deep:
        data = structured.load_yaml(text)
        assert len(data) == len(fanouts)
        return
    with pytest.raises(XtrainError) as e:
        structured.read_yaml(text, "config file job.yaml")
    line = e.value.one_line()
    assert line.startswith("config file job.yaml expands to more than 10000 values through its aliases")
    assert len(line) < 250 and "lol" not in line


def test_a_billion_laughs_is_refused_at_once() -> None:
    """Nine levels of nine: 9^9 (387 million) values from 10 lines, refused on the node graph."""
    text, size = _chain([9] * 10)
    assert size > 10**9
    with pytest.raises(structured.TooLarge) as e:
        structured.load_yaml(text)
    assert e.value.line == 5  # the first anchor whose expansion passes the limit


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: [1, {c: *a}]}\n", "- &x [&y [*x]]\n"])
def test_an_alias_inside_its_own_anchor_is_refused(text: str) -> None:
    with pytest.raises(XtrainError, match="has an alias inside its own anchor's value"):
        structured.read_yaml(text, "config file job.yaml")


def test_ordinary_anchors_and_merge_keys_still_load() -> None:
    text = "base: &b {lr: 0.1, steps: 3}\nrun:\n  <<: *b\n  steps: 5\nlist: &l [1, 2]\nagain: *l\n"
    assert structured.load_yaml(text) == {
        "base": {"lr": 0.1, "steps": 3},
        "run": {"lr": 0.1, "steps": 5},
        "list": [1, 2],
        "again": [1, 2],
    }
    assert structured.load_yaml("") is None and structured.load_yaml("# nothing\n") is None


def test_an_alias_chain_deeper_than_the_limit_is_refused() -> None:
    """A value nested through 200 aliases is 200 levels deep once built, though each anchor's
    text is one level: refused like a deep file (code that walks it would recurse 200 times)."""
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 200))
    with pytest.raises(structured.TooDeep):
        structured.load_yaml(text)


# -- long values in error lines ------------------------------------------------------------------------
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=120),
    lambda inner: st.lists(inner, max_size=14) | st.dictionaries(st.text(max_size=10), inner, max_size=10),
    max_leaves=40,
)


@settings(max_examples=40, deadline=None)
@given(values)
def test_a_shown_value_is_short_and_what_python_prints_when_short(value: object) -> None:
    text = shown(value)
    assert len(text) <= SHOWN_CHARS
    full = repr(value)
    if isinstance(value, (str, int, float, type(None))) and len(full) <= SHOWN_CHARS:
        assert text == full
    elif len(full) > SHOWN_CHARS:
        assert "..." in text  # cut at the end, or items left out inside (reprlib)


def test_a_shown_value_of_an_expanded_bomb_costs_nothing() -> None:
    """reprlib renders only the first items of the first levels: 9^30 leaves, shown at once."""
    value: object = ["lol"] * 9
    for _ in range(30):
        value = [value] * 9
    assert shown(value).startswith("[[[[...], [...],") and len(shown(value)) <= SHOWN_CHARS
    assert math.isclose(len(shown("x" * 10**6)), SHOWN_CHARS)


def test_a_config_value_in_an_error_is_cut(tmp_path: Path) -> None:
    from xtrain.tasks.validation import load_config

    big = {"data": {"text_column": ["a" * 50] * 1000}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(big))
    with pytest.raises(XtrainError) as e:
        load_config(path)
    assert e.value.one_line().startswith("data.text_column must be a string, got ['aaaa")
    assert len(e.value.one_line()) < 140
    with pytest.raises(XtrainError) as e:
        load_config(None, ["x" * 5000])
    assert len(e.value.one_line()) < 180
