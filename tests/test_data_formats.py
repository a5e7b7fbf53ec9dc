"""The data formats people already have (issue 31): LLaMA-Factory / LLaVA rows with ``<image>``
placeholders and an ``images`` list, sharegpt conversations, flat image + question + answer rows
for vision-language, turn keys and role tags (``data.role_tag`` & co.) for chat data, and
``data.image_root`` / ``data.audio_root``. Each format is the built-in data converted into it and
must give the native format's tokens, labels and batches (the processor's image tokens in the
batch, pixel values fed); a row whose images and placeholders disagree is refused in one line.
In-process and without training runs: the readers, the tokenised rows and the collated batches."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.workloads import build_workload

from xtrain import builtin
from xtrain.config.schema import DataConfig
from xtrain.data.rows import chat as chat_data
from xtrain.data.rows import formats as row_formats
from xtrain.data.rows import vision_rows
from xtrain.data.rows.vision_chat import VisionChatCollator, VisionChatRows
from xtrain.errors import RowError, XtrainError
from xtrain.model import load as models
from xtrain.tasks import common
from xtrain.tasks.validation import load_config
from xtrain.tasks.vision.processor import load_processor

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session
ROWS = 8  # built-in rows converted into each format


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _shapes() -> tuple[Path, list[tuple[str, str, str]]]:
    """The built-in shapes-vqa folder and its first rows as (image path, question, answer)."""
    folder = builtin.ensure_builtin_data("builtin:shapes-vqa")
    out = []
    for line in (folder / "train.jsonl").read_text(encoding="utf-8").splitlines()[:ROWS]:
        user, assistant = json.loads(line)["messages"]
        image = next(p["image"] for p in user["content"] if p["type"] == "image")
        question = next(p["text"] for p in user["content"] if p["type"] == "text")
        out.append((image, question, assistant["content"]))
    return folder, out


# the built-in rows in each format: (image, question, answer) -> (row, overrides that read it)
FORMATS: dict[str, Any] = {
    "messages": lambda i, q, a: {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": i}, {"type": "text", "text": q}]},
            {"role": "assistant", "content": a},
        ]
    },
    "llamafactory": lambda i, q, a: {
        "messages": [{"role": "user", "content": f"<image>{q}"}, {"role": "assistant", "content": a}],
        "images": [i],
    },
    "sharegpt": lambda i, q, a: {
        "conversations": [{"from": "human", "value": f"<image>{q}"}, {"from": "gpt", "value": a}],
        "images": [i],
    },
    "llava": lambda i, q, a: {  # LLaVA's own files: one image path beside the conversations
        "id": "x",
        "image": i,
        "conversations": [{"from": "human", "value": f"<image>{q}"}, {"from": "gpt", "value": a}],
    },
    "flat": lambda i, q, a: {"image": i, "question": q, "answer": a},
    "flat-prompt": lambda i, q, a: {"img": [i], "prompt": q, "response": a},
    "spelt": lambda i, q, a: {
        "dialog": [{"speaker": "Customer", "text": f"<image>{q}"}, {"speaker": "agent", "text": a}],
        "pictures": [i],
    },
}
OVERRIDES = {
    "flat-prompt": ["data.image_column=img"],
    "spelt": [
        "data.messages_column=dialog",
        "data.images_column=pictures",
        "data.role_tag=speaker",
        "data.content_tag=text",
        "data.user_tag=customer",
        "data.assistant_tag=agent",
    ],
}


@functools.cache
def _processor(source: str) -> tuple[Any, chat_data.Render]:
    processor = load_processor(source, False)
    return processor, chat_data.renderer(processor, chat_data.require_template(processor, None, source))


def _vision_cfg(data: Path, *overrides: str):
    return load_config(
        None,
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            f"data.train={data}",
            "data.eval=null",
            "data.max_length=64",
            "generation.max_new_tokens=4",
            *overrides,
        ],
    )


def _vision_rows(data: Path, *overrides: str) -> tuple[VisionChatRows, Any]:
    """The vision-language task's rows of ``data`` (read, checked, rendered), without the model."""
    cfg = _vision_cfg(data, *overrides)
    source = str(models.resolve_model(cfg.model.name_or_path))
    processor, render = _processor(source)
    train, _, name, _ = common.raw_datasets(cfg)
    folder, _ = common.media_dirs(cfg, "image")
    rows = vision_rows.rows(train, cfg, name, folder, render, processor.tokenizer, False)
    return rows, processor


def test_every_vision_format_gives_the_native_tokens_labels_and_batches(tmp_path):
    """Written away from the images (their folder is data.image_root), each format gives the same
    rendered text, ids, labels and images as the native messages rows, and the same batch: the
    processor's image tokens in input_ids and the pixel values."""
    folder, shapes = _shapes()
    got: dict[str, tuple[VisionChatRows, dict[str, Any]]] = {}
    for name, convert in FORMATS.items():
        data = _jsonl(tmp_path / f"{name}.jsonl", [convert(*row) for row in shapes])
        rows, processor = _vision_rows(data, f"data.image_root={folder}", *OVERRIDES.get(name, []))
        batch = VisionChatCollator(processor, 64)([rows[i] for i in range(len(rows))])
        got[name] = rows, batch
    native_rows, native = got.pop("messages")
    image_token = VisionChatCollator(processor, 64)._image_token()
    assert int((native["input_ids"] == image_token).sum()) == ROWS * 4  # 56x56 images: 4 tokens each
    assert native["pixel_values"].shape[0] == int(native["image_grid_thw"].prod(-1).sum())
    for name, (rows, batch) in got.items():
        assert len(rows) == ROWS, name
        for i in range(ROWS):
            assert rows.encoded[i]["input_ids"] == native_rows.encoded[i]["input_ids"], name
            assert rows.encoded[i]["labels"] == native_rows.encoded[i]["labels"], name
        assert rows.images == native_rows.images, name
        assert sorted(batch) == sorted(native), name
        for key, value in native.items():
            assert torch.equal(batch[key], value), (name, key)


def test_the_image_placeholder_form_feeds_the_images_to_the_model(tmp_path):
    folder, shapes = _shapes()
    data = _jsonl(tmp_path / "lf.jsonl", [FORMATS["llamafactory"](*row) for row in shapes[:4]])
    workload = build_workload(_vision_cfg(data, f"data.image_root={folder}", "batch.per_device=4"))
    batch = workload.collator([workload.train_dataset[i] for i in range(4)])
    image_token = workload.collator._image_token()
    assert int((batch["input_ids"] == image_token).sum()) == 16 and "pixel_values" in batch
    with torch.no_grad():
        loss = workload.model(**batch).loss
        other = dict(batch, pixel_values=torch.zeros_like(batch["pixel_values"]))
        blank = workload.model(**other).loss
    assert torch.isfinite(loss) and not torch.equal(loss, blank)  # the pixels reach the loss


# ---------------------------------------------------------------------------------------------
# Refusals: one line naming the file, the row and the field


def _one_line(tmp_path: Path, rows: list[dict[str, Any]], *overrides: str) -> str:
    folder, _ = _shapes()
    data = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(XtrainError) as e:
        _vision_rows(data, f"data.image_root={folder}", *overrides)
    line = e.value.one_line()
    assert "\n" not in line and "bad.jsonl" in line
    return line


def _chat(user: Any, answer: str = "red", images: list[str] | None = None) -> dict[str, Any]:
    turns = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    row: dict[str, Any] = {"messages": turns}
    return row if images is None else {**row, "images": images}


IMAGE = "train/00000.png"


@pytest.mark.parametrize(
    ("row", "says"),
    [
        # an image the turns never place (it trained text-only before, silently)
        (_chat("what colour?", images=[IMAGE]), "field 'images' lists 1 image(s) but the turns place 0"),
        (_chat("<image><image>what?", images=[IMAGE]), "'images' lists 1 image(s) but the turns place 2"),
        (_chat("<image>what?"), "field 'images' lists 0 image(s) but the turns place 1"),
        (
            _chat([{"type": "image", "image": "train/00001.png"}], images=[IMAGE]),
            "field 'images' lists 1 image(s) but the turns place 0",
        ),
        (_chat("<image>what?", "<image>", images=[IMAGE]), "turn 1: images go in user or system turns"),
        (
            {
                "conversations": [
                    {"from": "human", "value": "<image>what?"},
                    {"from": "gpt", "value": "red"},
                ],
                "images": ["train/99999.png"],
            },  # fmt: skip
            "99999.png (row 1 of",
        ),
    ],
)
def test_images_and_placeholders_that_disagree_are_refused_with_the_row(tmp_path, row, says):
    good = FORMATS["messages" if "messages" in row else "sharegpt"](IMAGE, "what?", "red")
    line = _one_line(tmp_path, [good, row])
    assert says in line and "row 1 of" in line


def test_flat_rows_without_their_columns_are_one_line_naming_the_key(tmp_path):
    line = _one_line(tmp_path, [{"picture": "train/00000.png", "caption": "red"}])
    assert "cannot tell what the rows" in line and "picture, caption" in line
    flat = {"picture": "train/00000.png", "question": "q?", "answer": "red"}
    line = _one_line(tmp_path, [flat])  # never trained text-only: the image column must be there
    assert "column 'image' not in" in line and "data.image_column" in line
    line = _one_line(tmp_path, [flat, {"picture": "train/00000.png", "question": "q?", "answer": ""}],
                     "data.image_column=picture")  # fmt: skip
    assert "row 1 of" in line and "field 'answer' is missing or empty" in line
    line = _one_line(tmp_path, [flat, {"picture": None, "question": "q?", "answer": "red"}],
                     "data.image_column=picture")  # fmt: skip
    assert "row 1 of" in line and "field 'picture' is empty" in line


def test_vision_row_formats_are_checked_in_the_config(tmp_path):
    with pytest.raises(XtrainError, match="data.row_format=alpaca is not a vision-language row format"):
        _vision_cfg(tmp_path / "x.jsonl", "data.row_format=alpaca")
    with pytest.raises(XtrainError, match="data.user_tag and data.assistant_tag are both 'Bot'"):
        _vision_cfg(tmp_path / "x.jsonl", "data.user_tag=Bot", "data.assistant_tag=bot")
    with pytest.raises(XtrainError, match="data.role_tag spells the turns of conversations"):
        load_config(None, ["model.task=causal-lm", "data.row_format=text", "data.role_tag=from"])
    with pytest.raises(XtrainError, match="data.image_root is for tasks"):
        load_config(None, ["model.task=causal-lm", "data.image_root=imgs"])


# ---------------------------------------------------------------------------------------------
# causal-lm: sharegpt and re-spelt conversations give the native messages' tokens and labels


def test_respelt_chat_rows_give_the_native_tokens_and_labels(tmp_path):
    from xtrain.data.rows.columns import row_format
    from xtrain.tasks.text import rows as text_rows

    native_rows = [json.loads(x) for x in (REPO / "examples/data/chat-train.jsonl").read_text().splitlines()]
    speaker = {"system": "instructions", "user": "Customer", "assistant": "agent"}
    spelt = [
        {"dialog": [{"who": speaker[t["role"]], "says": t["content"]} for t in r["messages"]]}
        for r in native_rows
    ]
    sharegpt = [
        {
            "conversations": [
                {
                    "from": {"user": "human", "assistant": "gpt"}.get(t["role"], t["role"]),
                    "value": t["content"],
                }
                for t in r["messages"]
            ]
        }  # fmt: skip
        for r in native_rows
    ]
    template = f"data.chat_template={REPO / 'examples/data/chat-template.jinja'}"
    tags = ["data.messages_column=dialog", "data.role_tag=who", "data.content_tag=says",
            "data.user_tag=customer", "data.assistant_tag=agent", "data.system_tag=instructions"]  # fmt: skip

    def rows(data: list[dict[str, Any]], name: str, *extra: str) -> list[dict[str, list[int]]]:
        path = _jsonl(tmp_path / f"{name}.jsonl", data)
        cfg = load_config(None, ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm",
                                 f"data.train={path}", "data.eval=null", template, *extra])  # fmt: skip
        source, tokenizer = common.prepare_tokenizer(cfg, contextlib.nullcontext)
        train, _, train_name, _ = common.raw_datasets(cfg)
        fmt = row_format(cfg, train)
        return text_rows.chat_rows(cfg, tokenizer, source, fmt, (train, train_name), (None, ""))[0].to_list()

    native = rows(native_rows, "native")
    assert native and any(t != -100 for t in native[0]["labels"])
    assert rows(spelt, "spelt", *tags) == native
    assert rows(sharegpt, "sharegpt") == native
    bad = [spelt[0], {"dialog": [{"who": "robot", "says": "hi"}]}]
    with pytest.raises(RowError, match=r"row 1 of .*bad.jsonl: dialog\[0\] field 'who' is 'robot'"):
        rows(bad, "bad", *tags)
    llava = [{**native_rows[0], "images": []}, {**native_rows[1], "images": ["0.png"]}]  # it would drop them
    with pytest.raises(RowError, match=r"row 1 of .*llava.jsonl: field 'images' lists images; causal-lm"):
        rows(llava, "llava")


# ---------------------------------------------------------------------------------------------
# data.image_root / data.audio_root


def test_media_roots_resolve_relative_paths_and_keep_absolute_ones(tmp_path):
    folder, shapes = _shapes()
    image = shapes[0][0]
    rows = [{"image": image, "text": "a"}, {"image": str(folder / shapes[1][0]), "text": "b"}]
    data = _jsonl(tmp_path / "ocr.jsonl", rows)
    config = tmp_path / "job.yaml"  # a relative root in a config file: next to the file
    (tmp_path / "imgs").symlink_to(folder, target_is_directory=True)
    config.write_text(f"model:\n  task: image-to-text\ndata:\n  train: {data}\n  image_root: imgs\n")
    cfg = load_config(config, ["data.eval=null"])
    assert cfg.data.image_root == str((tmp_path / "imgs").resolve())
    columns = {"data.image_column": "image", "data.text_column": "text"}
    (train, _, train_dir), _ = common.image_datasets(cfg, contextlib.nullcontext, columns)
    assert train_dir == folder.resolve() and len(train) == 2
    with pytest.raises(XtrainError, match=r"image .*00000.png \(row 0 of .*ocr.jsonl\) not found"):
        common.image_datasets(load_config(config, ["data.image_root=null"]), contextlib.nullcontext, columns)
    speech = ["model.task=speech-to-text", f"data.train={data}"]
    audio = load_config(None, [*speech, f"data.audio_root={tmp_path}"])
    assert common.media_dirs(audio, "audio") == (tmp_path.resolve(), tmp_path.resolve())
    with pytest.raises(XtrainError, match="data.audio_root .*missing is not a folder"):
        common.media_dirs(load_config(None, [*speech, "data.audio_root=missing"]), "audio")


# ---------------------------------------------------------------------------------------------
# Properties of the readers of user input

FAST = settings(max_examples=60, deadline=None)  # a loaded CI machine: no per-example deadline
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="<"), max_size=12)


@FAST
@given(st.lists(texts, min_size=1, max_size=6))
def test_placeholders_split_a_turn_into_parts_in_place(pieces):
    text = chat_data.IMAGE_PLACEHOLDER.join(pieces)
    parts = chat_data.image_parts(text)
    rebuilt = "".join(p["text"] if p["type"] == "text" else chat_data.IMAGE_PLACEHOLDER for p in parts)
    assert rebuilt == text
    assert sum(p["type"] == "image" for p in parts) == len(pieces) - 1
    assert all(p["text"] for p in parts if p["type"] == "text")  # no empty text parts
    kinds = [p["type"] for p in parts]
    assert ("text", "text") not in zip(kinds, kinds[1:], strict=False)


@FAST
@given(st.integers(0, 4), st.integers(0, 4), texts)
def test_a_row_is_read_exactly_when_its_images_fill_its_placeholders(placed, listed, question):
    content = chat_data.IMAGE_PLACEHOLDER * placed + question
    turns = [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
    images = [f"{k}.png" for k in range(listed)]
    if placed != listed:
        with pytest.raises(RowError, match=f"row 3 of f.jsonl: field 'images' lists {listed} image"):
            chat_data.parse_conversation(turns, 3, "f.jsonl", images)
        return
    conv = chat_data.parse_conversation(turns, 3, "f.jsonl", images)
    assert conv.images == images
    assert [p["type"] for p in conv.messages[0]["content"]].count("image") == placed


names = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=8)
roles = st.sampled_from(["system", "user", "assistant"])


@FAST
@given(
    st.lists(names, min_size=5, max_size=5, unique_by=str.casefold),
    st.lists(st.tuples(roles, texts), min_size=1, max_size=5),
)
def test_respelt_turns_map_back_onto_roles_and_contents(spelling, turns):
    role_key, content_key, user, assistant, system = spelling
    d = DataConfig(role_tag=role_key, content_tag=content_key, user_tag=user, assistant_tag=assistant,
                   system_tag=system, row_format="sharegpt")  # fmt: skip
    row_formats.check_tags(d)
    tag = {"user": user.upper(), "assistant": assistant, "system": system.lower()}  # tags ignore case
    cell = [{role_key: tag[role], content_key: text} for role, text in turns]
    keys = row_formats.turn_keys(d, "sharegpt")
    assert keys is not None
    assert row_formats.mapped_turns(cell, keys, 0, "f", "c") == [{"role": r, "content": t} for r, t in turns]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@FAST
@given(json_values, st.sampled_from(["messages", "sharegpt", "prompt_response"]), json_values, json_values)
def test_any_row_is_read_or_refused_in_one_line(cell, fmt, images, answer):
    d = DataConfig(row_format=fmt)
    row = {"messages": cell, "conversations": cell, "images": images, "image": images, "question": cell,
           "answer": answer}  # fmt: skip
    try:
        conv = vision_rows.vision_conversation(d, fmt, row, 0, "f.jsonl")
    except RowError as e:
        assert e.one_line().startswith("row 0 of f.jsonl") and "\n" not in e.one_line()
    else:
        assert any(t["role"] == "assistant" for t in conv.messages)
