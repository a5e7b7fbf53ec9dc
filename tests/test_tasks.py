"""Tasks build Workloads the loop can train: data formats, masking, packing, labels, custom
tasks, LoRA targets, the tokenisation cache, reproducible initial weights, and clear errors."""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import sys
from pathlib import Path

import pytest
import torch
from support.workloads import build_workload

from xtrain import builtin
from xtrain.data.collate import IGNORE_INDEX, PadCollator
from xtrain.data.labels import label_mapping
from xtrain.data.tokenize import tokenize_causal_lm, tokenizer_fingerprint
from xtrain.errors import XtrainError
from xtrain.model import lora as lora_mod
from xtrain.tasks.contract import Workload
from xtrain.tasks.validation import load_config

STORIES = [r["text"] for r in builtin.story_examples(24, seed=5)]
REVIEWS = builtin.sentiment_examples(40, seed=5)


pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture
def llama(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-llama"))


@pytest.fixture
def bert(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-bert"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def causal_cfg(model: str, train: Path | str, *extra: str):
    return load_config(
        None,
        [
            f"model.name_or_path={model}",
            "model.task=causal-lm",
            f"data.train={train}",
            "data.eval=null",
            "data.max_length=128",
            *extra,
        ],
    )


def seq_cfg(model: str, train: Path | str, *extra: str):
    return load_config(None, [f"model.name_or_path={model}", f"data.train={train}", "data.eval=null", *extra])


def first_batch(workload: Workload, dataset=None, n: int = 4) -> dict[str, torch.Tensor]:
    ds = dataset if dataset is not None else workload.train_dataset
    return workload.collator([ds[i] for i in range(min(n, len(ds)))])


def check_trains_and_evaluates(workload: Workload) -> dict[str, float]:
    """A batch goes through forward/backward with a finite loss; eval stats reduce to metrics."""
    batch = first_batch(workload)
    out = workload.model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert any(p.grad is not None for p in workload.model.parameters() if p.requires_grad)
    workload.model.zero_grad()
    stats = workload.eval_batch(out, batch)
    n = batch["input_ids"].shape[0]
    assert {"loss_sum", "count"} <= set(stats) and all(v.shape == (n,) for v in stats.values())
    metrics = workload.reduce_metrics(stats)
    assert workload.main_metric in metrics and 0 <= metrics[workload.main_metric] <= 1
    # The eval loss the loop computes equals the model's own loss on the same batch (mean over tokens).
    assert float(stats["loss_sum"].sum() / stats["count"].sum()) == pytest.approx(float(out.loss), rel=1e-4)
    for fn in (workload.collator, workload.eval_batch, workload.reduce_metrics):
        pickle.loads(pickle.dumps(fn))  # spawned DataLoader workers need these
    return metrics


# -- causal-lm -------------------------------------------------------------------------------------


def _save_text_data(tmp_path: Path, fmt: str) -> Path:
    import datasets

    ds = datasets.Dataset.from_dict({"text": STORIES})
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in STORIES])
    if fmt == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps([{"text": t} for t in STORIES]))
        return path
    if fmt == "csv":
        ds.to_csv(str(tmp_path / "d.csv"))
        return tmp_path / "d.csv"
    if fmt == "parquet":
        ds.to_parquet(str(tmp_path / "d.parquet"))
        return tmp_path / "d.parquet"
    if fmt == "txt":
        (tmp_path / "d.txt").write_text("\n".join(STORIES) + "\n")
        return tmp_path / "d.txt"
    if fmt == "saved":
        ds.save_to_disk(str(tmp_path / "saved"))
        return tmp_path / "saved"
    if fmt == "saved-dict":
        datasets.DatasetDict({"train": ds, "validation": ds.select(range(4))}).save_to_disk(
            str(tmp_path / "dd")
        )
        return tmp_path / "dd"
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "txt", "saved", "saved-dict"])
def test_causal_lm_from_every_format(fmt, llama, tmp_path):
    source = _save_text_data(tmp_path, fmt)
    workload = build_workload(causal_cfg(llama, source))
    assert len(workload.train_dataset) == len(STORIES)
    row = workload.train_dataset[0]
    assert row["labels"] == row["input_ids"] and row["input_ids"][-1] == workload.tokenizer.eos_token_id
    assert workload.main_metric == "token_accuracy"
    check_trains_and_evaluates(workload)


def test_prompt_response_masks_the_prompt(llama, tmp_path):
    rows = [
        {"q": f"Question: opposite of {a}?\nAnswer:", "a": f" {b}"}
        for a, b in [("hot", "cold"), ("up", "down")]
    ]
    cfg = causal_cfg(
        llama, write_jsonl(tmp_path / "qa.jsonl", rows), "data.prompt_column=q", "data.response_column=a"
    )
    workload = build_workload(cfg)
    tok = workload.tokenizer
    for row, src in zip(workload.train_dataset, rows, strict=True):
        prompt = tok(src["q"])["input_ids"]
        response = tok(src["a"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert row["input_ids"] == prompt + response
        assert row["labels"] == [IGNORE_INDEX] * len(prompt) + response
    batch = first_batch(workload)
    assert (batch["labels"] != IGNORE_INDEX).sum() == sum(
        len(tok(r["a"], add_special_tokens=False)["input_ids"]) + 1 for r in rows
    )
    check_trains_and_evaluates(workload)


def test_truncated_away_responses_are_dropped(llama, tmp_path):
    rows = [{"p": "word " * 200, "r": " end"}, {"p": "short", "r": " answer"}]
    cfg = causal_cfg(
        llama, write_jsonl(tmp_path / "long.jsonl", rows), "data.prompt_column=p", "data.response_column=r"
    )
    workload = build_workload(cfg)
    assert len(workload.train_dataset) == 1
    assert len(workload.train_dataset[0]["input_ids"]) <= 48


def test_packing_concatenate_cuts_the_concatenation_into_blocks(llama, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    plain = build_workload(causal_cfg(llama, path, "data.max_length=512"))
    packed = build_workload(causal_cfg(llama, path, "data.packing=concatenate", "data.max_length=32"))
    lengths = [len(r["input_ids"]) for r in packed.train_dataset]
    assert all(n == 32 for n in lengths[:-1]) and 0 < lengths[-1] <= 32
    flat = [t for r in plain.train_dataset for t in r["input_ids"]]
    assert sum(lengths) == len(flat)
    assert [t for r in packed.train_dataset for t in r["input_ids"]] == flat
    assert all(r["labels"] == r["input_ids"] for r in packed.train_dataset)
    check_trains_and_evaluates(packed)


def test_eval_fraction_splits_train(llama, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    workload = build_workload(causal_cfg(llama, path, "data.eval_fraction=0.25"))
    assert len(workload.eval_dataset) == 6 and len(workload.train_dataset) == 18
    check_trains_and_evaluates(workload)


# -- seq-cls ---------------------------------------------------------------------------------------


def test_seq_cls_with_string_labels(bert, tmp_path):
    rows = [{"sentence": r["text"], "sentiment": r["label"]} for r in REVIEWS]
    train = write_jsonl(tmp_path / "train.jsonl", rows[:30])
    evals = write_jsonl(tmp_path / "eval.jsonl", rows[30:])
    cfg = seq_cfg(
        bert, train, f"data.eval={evals}", "data.text_column=sentence", "data.label_column=sentiment"
    )
    workload = build_workload(cfg)
    model_config = workload.model.base_model.model.config
    assert model_config.num_labels == 2
    assert model_config.id2label == {0: "negative", 1: "positive"}  # sorted names: stable everywhere
    expected = [1 if r["sentiment"] == "positive" else 0 for r in rows[:30]]
    assert [r["labels"] for r in workload.train_dataset] == expected
    trainable = [n for n, p in workload.model.named_parameters() if p.requires_grad]
    assert any("classifier" in n for n in trainable) and any("lora_" in n for n in trainable)
    assert len(workload.eval_dataset) == 10
    assert workload.main_metric == "accuracy"
    check_trains_and_evaluates(workload)


def test_seq_cls_with_int_labels_and_text_pairs(bert, tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict(
        {"a": [r["text"] for r in REVIEWS], "b": ["and more"] * 40, "y": [i % 3 for i in range(40)]}
    )
    ds.to_csv(str(tmp_path / "pairs.csv"))
    cfg = seq_cfg(
        bert, tmp_path / "pairs.csv", "data.text_column=a", "data.text_pair_column=b", "data.label_column=y"
    )
    workload = build_workload(cfg)
    assert workload.model.base_model.model.config.num_labels == 3
    batch = first_batch(workload)
    assert batch["labels"].tolist() == [0, 1, 2, 0]
    assert batch["token_type_ids"].max() == 1  # the pair is the second segment
    check_trains_and_evaluates(workload)
    cfg = seq_cfg(
        bert, tmp_path / "pairs.csv", "data.text_column=a", "data.label_column=y", "model.num_labels=5"
    )
    assert build_workload(cfg).model.base_model.model.config.num_labels == 5


def test_seq_cls_on_a_decoder_model(llama, tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", REVIEWS[:16])
    workload = build_workload(seq_cfg(llama, train))
    assert workload.model.base_model.model.config.pad_token_id == workload.tokenizer.pad_token_id
    assert any("score" in n for n, p in workload.model.named_parameters() if p.requires_grad)
    check_trains_and_evaluates(workload)


def test_label_mapping_rules():
    mapping, n, names = label_mapping(["b", "a", "c"], ["a"], None, ("t", "e"))
    assert mapping == {"a": 0, "b": 1, "c": 2} and n == 3 and names == {0: "a", 1: "b", 2: "c"}
    assert label_mapping([0, 1, 1], [1], None, ("t", "e")) == (None, 2, None)
    assert label_mapping([True, False], [], None, ("t", "e"))[0] == {"False": 0, "True": 1}
    assert label_mapping([1, 0], [], None, ("t", "e"), ["neg", "pos", "mixed"]) == (
        None,
        3,
        {0: "neg", 1: "pos", 2: "mixed"},
    )
    with pytest.raises(XtrainError, match="label 'neutral' of e is not among the training labels"):
        label_mapping(["pos", "neg"], ["neutral"], None, ("t", "e"))
    with pytest.raises(XtrainError, match="does not fit model.num_labels=2"):
        label_mapping([0, 2], [], 2, ("t", "e"))
    with pytest.raises(XtrainError, match="fractional"):
        label_mapping([0.5, 1.0], [], None, ("t", "e"))
    with pytest.raises(XtrainError, match="at least 2 classes"):
        label_mapping(["only"], [], None, ("t", "e"))


# -- the quickstart job ----------------------------------------------------------------------------


@pytest.mark.slow
def test_quickstart_workload_learns_with_a_plain_loop():
    """The built-in job, trained by a bare AdamW loop (no accelerate): accuracy well above chance."""
    from transformers import get_cosine_schedule_with_warmup

    steps = 200
    cfg = load_config(None, [f"run.max_steps={steps}"])
    workload = build_workload(cfg)

    def accuracy() -> float:
        workload.model.eval()
        stats: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for i in range(0, len(workload.eval_dataset), 100):
                batch = first_batch(workload, workload.eval_dataset.select(range(i, i + 100)), 100)
                for k, v in workload.eval_batch(workload.model(**batch), batch).items():
                    stats.setdefault(k, []).append(v)
        workload.model.train()
        return workload.reduce_metrics({k: torch.cat(v) for k, v in stats.items()})["accuracy"]

    before = accuracy()
    params = [p for p in workload.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr)
    sched = get_cosine_schedule_with_warmup(opt, cfg.optim.warmup_steps, steps)
    order = torch.randperm(len(workload.train_dataset), generator=torch.Generator().manual_seed(0)).tolist()
    bs = cfg.batch.per_device
    for step in range(steps):
        idx = order[(step * bs) % len(order) :][:bs]
        loss = workload.model(**workload.collator([workload.train_dataset[i] for i in idx])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    after = accuracy()
    print(f"quickstart plain loop: {steps} steps, accuracy {before:.3f} -> {after:.3f}")
    assert before < 0.6 and after > 0.7 and after - before > 0.15, (before, after)


# -- custom tasks ----------------------------------------------------------------------------------


CUSTOM_MODULE = """
import torch
from xtrain.tasks.contract import Workload

class Collate:
    def __call__(self, rows):
        return {"x": torch.tensor([r["x"] for r in rows]), "y": torch.tensor([r["y"] for r in rows])}

class Out:
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits

class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
    def forward(self, x, y):
        pred = self.lin(x[:, None]).squeeze(1)
        return Out(((pred - y) ** 2).mean(), pred)

def build(cfg, main_process_first):
    with main_process_first():
        rows = [{"x": float(i), "y": 2.0 * i} for i in range(8)]
    return Workload(model=Regressor(), train_dataset=rows, collator=Collate(), tokens_key=None)

def not_a_workload(cfg):
    return {"model": None}
"""


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    (tmp_path / "my_xtrain_task.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_xtrain_task"
    sys.modules.pop("my_xtrain_task", None)


def test_custom_task(custom_module):
    entered = []

    @contextlib.contextmanager
    def main_first():
        entered.append(True)
        yield

    cfg = load_config(None, ["model.task=custom", f"model.custom={custom_module}:build"])
    workload = build_workload(cfg, main_first)
    assert entered and len(workload.train_dataset) == 8
    assert torch.isfinite(workload.model(**workload.collator(workload.train_dataset[:4])).loss)


def test_custom_task_errors(custom_module):
    def build(spec: str) -> XtrainError:
        with pytest.raises(XtrainError) as e:
            build_workload(load_config(None, ["model.task=custom", f"model.custom={spec}"]))
        return e.value

    assert "not an xtrain Workload" in build(f"{custom_module}:not_a_workload").message
    assert "has no function 'missing'" in build(f"{custom_module}:missing").message
    e = build("no_such_module_xyz:build")
    assert e.message.startswith("cannot import the custom task module 'no_such_module_xyz'")
    assert "PYTHONPATH" in e.hint


# -- LoRA ------------------------------------------------------------------------------------------


def test_same_initial_weights_on_every_build(llama, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])

    def trainable(*extra: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(999 if extra else 0)  # the caller's RNG state must not matter
        model = build_workload(causal_cfg(llama, path, *extra)).model
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    a, b = trainable(), trainable("run.seed=42")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_A" in k)
    c = trainable("run.seed=7")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def _targets_of(config) -> list[str]:
    from transformers import AutoModel

    return lora_mod.find_target_modules(AutoModel.from_config(config))


def test_auto_target_modules_for_common_architectures(llama, bert):
    from transformers import AutoModelForCausalLM, GPT2Config, T5Config

    assert lora_mod.find_target_modules(AutoModelForCausalLM.from_pretrained(llama)) == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    ]
    workload_bert = build_workload(seq_cfg(bert, "builtin:sentiment", "run.max_steps=1"))
    targeted = {n.split(".")[-4] for n, _ in workload_bert.model.named_parameters() if "lora_A" in n}
    assert targeted == {"query", "key", "value"}
    small = {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 50}
    assert _targets_of(GPT2Config(**small)) == ["c_attn"]
    t5 = T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=50)
    assert _targets_of(t5) == ["q", "k", "v", "o"]


def test_auto_target_modules_fallback_for_unknown_architectures():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.ModuleDict({"wq": torch.nn.Linear(4, 4), "wv": torch.nn.Linear(4, 4)})
            self.mlp = torch.nn.Linear(4, 4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block()])
            self.lm_head = torch.nn.Linear(4, 9)

    assert lora_mod.find_target_modules(Net()) == ["wq", "wv"]
    net = Net()
    net.blocks[0].attn = torch.nn.ModuleDict()
    assert lora_mod.find_target_modules(net) == ["mlp"]  # no attention block: every Linear but the head


def test_explicit_target_modules_and_gradient_checkpointing(llama, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    workload = build_workload(
        causal_cfg(llama, path, "lora.target_modules=[q_proj,v_proj]", "model.gradient_checkpointing=true")
    )
    targeted = {n.split(".")[-4] for n, _ in workload.model.named_parameters() if "lora_A" in n}
    assert targeted == {"q_proj", "v_proj"}
    assert workload.model.base_model.model.is_gradient_checkpointing
    workload.model.train()
    check_trains_and_evaluates(workload)
    with pytest.raises(XtrainError, match="not found in the model") as e:
        build_workload(causal_cfg(llama, path, "lora.target_modules=[nope_proj]"))
    assert "q_proj" in e.value.hint


def test_lora_disabled_trains_every_weight(llama, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    model = build_workload(causal_cfg(llama, path, "lora.enabled=false")).model
    assert all(p.requires_grad for p in model.parameters())
    assert not any("lora_" in n for n, _ in model.named_parameters())


# -- the tokenisation cache ------------------------------------------------------------------------


def test_tokenisation_is_cached_between_builds(llama, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "cache.jsonl", [{"text": t} for t in STORIES])
    calls = []
    real = tokenize_causal_lm

    def counting(*args, **kwargs):
        import inspect

        # the data check tokenises the first rows at every build (tasks/data_check.py): not the data
        if not any(frame.function == "_check_text" for frame in inspect.stack()):
            calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("xtrain.data.tokenize.tokenize_causal_lm", counting)
    first = build_workload(causal_cfg(llama, path)).train_dataset
    assert calls, "the first build tokenises"
    files = [f["filename"] for f in first.cache_files]
    calls.clear()
    second = build_workload(causal_cfg(llama, path)).train_dataset
    assert not calls, "the second build must load the cached result"
    assert [f["filename"] for f in second.cache_files] == files
    assert second[0] == first[0]
    build_workload(causal_cfg(llama, path, "data.max_length=40"))
    assert calls, "other settings give another cache entry"


def test_tokenizer_fingerprint_is_stable(llama):
    from transformers import AutoTokenizer

    a = AutoTokenizer.from_pretrained(llama)
    before = tokenizer_fingerprint(a)
    a(["warm up the tokenizer", "with padding"], padding=True, truncation=True, max_length=4)
    assert tokenizer_fingerprint(a) == before == tokenizer_fingerprint(AutoTokenizer.from_pretrained(llama))


# -- bad inputs: one line each ---------------------------------------------------------------------


def one_line_error(cfg) -> XtrainError:
    with pytest.raises(XtrainError) as e:
        build_workload(cfg)
    assert "\n" not in e.value.one_line()
    return e.value


def test_missing_data_file(llama, tmp_path):
    e = one_line_error(causal_cfg(llama, tmp_path / "nope.jsonl"))
    assert e.message.startswith(f"data file {tmp_path / 'nope.jsonl'} not found")


def test_wrong_column(llama, tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "a b", "label": 1}])
    e = one_line_error(causal_cfg(llama, path, "data.text_column=txt"))
    assert e.message == f"text rows need 'txt' (did you mean 'text'?); {path} has text, label"
    assert e.hint == "data.text_column=txt names no column of it: set it to the one holding them"


def test_unknown_task(llama, tmp_path):
    cfg = causal_cfg(llama, tmp_path / "x.jsonl")
    cfg.model.task = "causal_lm_x"
    e = one_line_error(cfg)
    assert e.message.startswith("unknown task 'causal_lm_x'") and e.hint == "did you mean 'causal-lm'?"


@pytest.mark.parametrize("path", ["/no/such/model/dir", "./missing-model", "a/b/c"])
def test_missing_model_path(path, tmp_path):
    e = one_line_error(causal_cfg(path, tmp_path / "x.jsonl"))
    assert e.message == f"model path {path} not found"


def test_unreachable_hub_model_is_one_line(tmp_path):
    e = one_line_error(causal_cfg("someone/model-that-is-not-here", tmp_path / "x.jsonl"))
    assert "not a local folder" in e.message


def test_unreachable_hub_data_is_one_line(llama):
    e = one_line_error(causal_cfg(llama, "someone/data-that-is-not-here"))
    assert e.message.startswith("data.train 'someone/data-that-is-not-here' is not a local file or folder")


def test_unknown_extension_needs_a_format(llama, tmp_path):
    path = tmp_path / "data.dat"
    path.write_text('{"text": "a"}\n')
    e = one_line_error(causal_cfg(llama, path))
    assert "cannot tell the format" in e.message and "data.format" in e.hint
    assert len(build_workload(causal_cfg(llama, path, "data.format=json")).train_dataset) == 1


def test_unreadable_data_is_one_line(llama, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "a"\nnot json at all\n')
    message = one_line_error(causal_cfg(llama, path)).message
    assert message.startswith(f"data file {path}, line 1: not valid JSON")


def test_data_without_trainable_tokens(llama, tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}])
    assert "no training examples left" in one_line_error(causal_cfg(llama, path, "data.max_length=1")).message


# -- the collator ----------------------------------------------------------------------------------


def test_pad_collator_pads_right_and_rounds_up():
    rows = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [5, 6, 7]},
        {"input_ids": [8], "attention_mask": [1], "labels": [-100]},
    ]
    batch = PadCollator(pad_token_id=0, pad_to_multiple_of=8)(rows)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][1].tolist() == [8] + [0] * 7
    assert batch["labels"][1].tolist() == [-100] * 8 and batch["attention_mask"][1].sum() == 1
    cls = PadCollator(pad_token_id=3)([{"input_ids": [1, 2], "labels": 1}, {"input_ids": [1], "labels": 0}])
    assert cls["labels"].tolist() == [1, 0] and cls["input_ids"].tolist() == [[1, 2], [1, 3]]
    assert math.isfinite(0.0)


def test_seq_cls_class_label_names(bert, tmp_path):
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["sad", "happy"])}
    )
    rows = {
        "text": [r["text"] for r in REVIEWS[:12]],
        "label": [int(r["label"] == "positive") for r in REVIEWS[:12]],
    }
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
        str(tmp_path / "cl")
    )
    config = build_workload(seq_cfg(bert, tmp_path / "cl")).model.base_model.model.config
    assert config.id2label == {0: "sad", 1: "happy"}
