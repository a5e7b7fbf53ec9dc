"""The training config: YAML + overrides, strict keys and types, batch arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from xtrain.config.loading import config_to_dict
from xtrain.config.schema import TrainConfig, config_keys
from xtrain.errors import XtrainError
from xtrain.planning.batch import gradient_accumulation, scaled_lr
from xtrain.tasks.validation import config_from_dict, load_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(fn, *args, **kwargs) -> XtrainError:
    with pytest.raises(XtrainError) as info:
        fn(*args, **kwargs)
    assert "\n" not in info.value.one_line()
    return info.value


# -- defaults and examples ---------------------------------------------------------------------


def test_no_config_is_the_builtin_quickstart_job():
    cfg = load_config(None)
    assert cfg.model.name_or_path == "builtin:tiny-bert"
    assert cfg.model.task == "seq-cls"
    assert cfg.data.train == "builtin:sentiment"
    assert cfg.data.eval == "builtin:sentiment"
    assert cfg.lora.enabled
    assert cfg.run.max_steps and cfg.run.eval_every


def test_dataclass_defaults_point_at_builtin_assets():
    cfg = TrainConfig()
    assert cfg.model.name_or_path.startswith("builtin:")
    assert cfg.data.train.startswith("builtin:")


@pytest.mark.parametrize("name", ["lora-causal-lm.yaml", "seq-cls.yaml"])
def test_example_configs_load_and_their_data_exists(name):
    cfg = load_config(EXAMPLES / name)
    assert Path(cfg.data.train).is_file() and Path(cfg.data.eval).is_file()
    assert cfg.lora.target_modules == "auto"


def test_causal_lm_example_masks_the_prompt():
    cfg = load_config(EXAMPLES / "lora-causal-lm.yaml")
    assert cfg.model.task == "causal-lm"
    assert (cfg.data.prompt_column, cfg.data.response_column) == ("prompt", "response")
    assert gradient_accumulation(cfg, 1) == 2 and gradient_accumulation(cfg, 2) == 1


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == TrainConfig()
    assert load_config(write(tmp_path, "lora:\n")) == TrainConfig()


# -- values and overrides --------------------------------------------------------------------------


def test_file_values_and_overrides(tmp_path):
    path = write(
        tmp_path,
        "model:\n  task: causal-lm\noptim:\n  lr: 2e-4\n  betas: [0.9, 0.95]\nrun:\n  resume: off\n"
        "  mixed_precision: no\n",
    )
    cfg = load_config(
        path,
        [
            "run.max_steps=20",
            "data.eval=null",
            "lora.target_modules=[q_proj,v_proj]",
            "run.output_dir=2024",
            "--run.seed=3",
            "optim.warmup_ratio=0.1",
        ],
    )
    assert cfg.optim.lr == pytest.approx(2e-4)  # PyYAML reads 2e-4 as a string: still a number
    assert cfg.optim.betas == (0.9, 0.95)
    assert cfg.run.resume == "off" and cfg.run.mixed_precision == "no"  # YAML's bare off/no
    assert cfg.run.max_steps == 20 and cfg.data.eval is None
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.run.output_dir == "2024"  # a string field keeps the text as written
    assert cfg.run.seed == 3 and cfg.optim.warmup_ratio == 0.1


def test_override_forms():
    assert load_config(None, ["lora.target_modules=q_proj,v_proj"]).lora.target_modules == [
        "q_proj",
        "v_proj",
    ]
    assert load_config(None, ["run.resume=off"]).run.resume == "off"
    assert load_config(None, ["model.dtype=bf16"]).model.dtype == "bfloat16"
    assert load_config(None, ["run.max_steps=1e3"]).run.max_steps == 1000
    assert load_config(None, ["data.eval="]).data.eval is None
    assert load_config(None, ["data.eval=None"]).data.eval is None
    assert load_config(None, ["model.task=Causal-LM"]).model.task == "causal-lm"
    assert load_config(None, ["lora.modules_to_save=classifier"]).lora.modules_to_save == ["classifier"]


@pytest.mark.parametrize(
    "text",
    ["run.max_steps", "max_steps=3", "=3"],
)
def test_malformed_override(text):
    assert "section.key=value" in error_of(load_config, None, [text]).message


# -- unknown keys and wrong values ------------------------------------------------------------------


def test_unknown_key_in_file_names_the_closest(tmp_path):
    e = error_of(load_config, write(tmp_path, "lora:\n  rank: 4\n"))
    assert e.message.startswith("unknown key 'lora.rank'")
    assert e.hint == "did you mean 'lora.r'?"


def test_unknown_section_names_the_closest(tmp_path):
    e = error_of(load_config, write(tmp_path, "optimizer:\n  lr: 0.1\n"))
    assert "unknown section 'optimizer'" in e.message and e.hint == "did you mean 'optim'?"


def test_unknown_key_in_override_points_to_its_section():
    e = error_of(load_config, None, ["lora.lr=1e-4"])
    assert "unknown key 'lora.lr'" in e.message and e.hint == "did you mean 'optim.lr'?"
    e = error_of(load_config, None, ["run.max_step=4"])
    assert e.hint == "did you mean 'run.max_steps'?"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("batch.per_device=eight", "batch.per_device must be a positive integer, got 'eight'"),
        ("batch.per_device=0", "batch.per_device must be a positive integer, got 0"),
        ("batch.per_device=2.5", "batch.per_device must be a positive integer, got 2.5"),
        ("optim.lr=-1", "optim.lr must be a positive number, got -1.0"),
        ("optim.lr=fast", "optim.lr must be a positive number, got 'fast'"),
        ("lora.dropout=1.5", "lora.dropout must be a number in [0, 1), got 1.5"),
        ("lora.enabled=maybe", "lora.enabled must be true or false, got 'maybe'"),
        ("batch.per_device=null", "batch.per_device cannot be null"),
        ("optim.betas=[0.9]", "optim.betas must be two numbers in [0, 1), got [0.9]"),
        ("lora.target_modules=[]", "lora.target_modules is an empty list"),
        ("optim.schedule=cosin", "optim.schedule must be one of cosine, linear, constant, got 'cosin'"),
    ],
)
def test_wrong_values(override, message):
    assert error_of(load_config, None, [override]).message == message


def test_wrong_choice_suggests_the_closest():
    e = error_of(load_config, None, ["model.task=seq_clf"])
    assert e.message.startswith(
        "model.task must be one of causal-lm, preference, grpo, reward, seq-cls, image-to-text, "
        "speech-to-text, vision-language, vision-preference, image-classification, custom"
    )
    assert e.hint == "did you mean 'seq-cls'?"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["model.task=custom"], "model.custom is not set"),
        (["model.task=custom", "model.custom=nocolon"], "module:function"),
        (["model.task=causal-lm", "data.prompt_column=p"], "go together"),
        (["data.packing=true"], "data.packing is for task causal-lm"),
        (["optim.lr_scaling=linear"], "needs optim.base_global_batch"),
        (["run.output_dir=''"], "run.output_dir is empty"),
    ],
)
def test_inconsistent_settings(overrides, fragment):
    assert fragment in error_of(load_config, None, overrides).message


def test_type_error_in_file(tmp_path):
    e = error_of(load_config, write(tmp_path, "batch:\n  per_device: eight\n"))
    assert e.message == "batch.per_device must be a positive integer, got 'eight'"


# -- files ----------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    e = error_of(load_config, tmp_path / "nope.yaml")
    assert e.message == f"config file {tmp_path / 'nope.yaml'} not found"


def test_bad_yaml_is_one_line(tmp_path):
    e = error_of(load_config, write(tmp_path, "model:\n  task: [causal-lm\n"))
    assert "is not valid YAML at line" in e.message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "model: 3\n"])
def test_not_a_mapping(tmp_path, text):
    assert "must be a mapping" in error_of(load_config, write(tmp_path, text)).message


def test_relative_inputs_are_found_next_to_the_config(tmp_path):
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "train.jsonl").write_text('{"text": "a"}\n')
    path = write(sub, "data:\n  train: train.jsonl\n  eval: missing.jsonl\nrun:\n  output_dir: out\n")
    cfg = load_config(path)
    assert cfg.data.train == str((sub / "train.jsonl").resolve())
    assert cfg.data.eval == "missing.jsonl"  # not next to the file: left for the current folder
    assert cfg.run.output_dir == "out"  # outputs are relative to the current folder
    assert load_config(path, ["data.train=train.jsonl"]).data.train == "train.jsonl"


# -- round trip and docs -----------------------------------------------------------------------------


def test_config_dict_round_trip():
    cfg = load_config(EXAMPLES / "lora-causal-lm.yaml", ["lora.target_modules=[q_proj]"])
    data = config_to_dict(cfg)
    json.dumps(data)  # plain data
    again = config_from_dict(yaml.safe_load(yaml.safe_dump(data)))
    assert again == cfg


def test_every_key_is_documented():
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [k for k in config_keys() if f"`{k.split('.', 1)[1]}`" not in doc]
    assert not missing, f"undocumented config keys: {missing}"
    assert len(config_keys()) == len(set(config_keys()))


# -- batch arithmetic ---------------------------------------------------------------------------------


def batch_cfg(per_device: int, global_batch: int | None) -> TrainConfig:
    return load_config(None, [f"batch.per_device={per_device}", f"batch.global_batch={global_batch}"])


def test_accumulation_without_global_batch_is_one():
    cfg = batch_cfg(8, None)
    assert gradient_accumulation(cfg, 1) == 1 and gradient_accumulation(cfg, 4) == 1
    assert cfg.batch.per_device * 4 * gradient_accumulation(cfg, 4) == 32  # samples per step


@pytest.mark.parametrize(("world", "accum"), [(1, 4), (2, 2), (4, 1)])
def test_accumulation_keeps_the_global_batch(world, accum):
    cfg = batch_cfg(8, 32)
    assert gradient_accumulation(cfg, world) == accum
    assert cfg.batch.per_device * world * gradient_accumulation(cfg, world) == 32


def test_accumulation_not_divisible():
    e = error_of(gradient_accumulation, batch_cfg(8, 30), 2)
    assert e.message == "global batch 30 is not divisible by per-device 8 x 2 processes (16)"
    assert e.hint == "use batch.global_batch=16 or 32, or batch.per_device=5"


def test_accumulation_global_smaller_than_one_step():
    e = error_of(gradient_accumulation, batch_cfg(8, 8), 2)
    assert e.message == "global batch 8 is smaller than per-device 8 x 2 processes (16)"
    assert e.hint == "use batch.global_batch=16, or batch.per_device=4"
    assert "1 process (" in error_of(gradient_accumulation, batch_cfg(8, 12), 1).message


def test_scaled_lr():
    base = ["optim.lr=0.001", "optim.base_global_batch=16"]
    assert scaled_lr(load_config(None, base), 64) == pytest.approx(0.001)
    assert scaled_lr(load_config(None, [*base, "optim.lr_scaling=linear"]), 64) == pytest.approx(0.004)
    assert scaled_lr(load_config(None, [*base, "optim.lr_scaling=sqrt"]), 64) == pytest.approx(0.002)
