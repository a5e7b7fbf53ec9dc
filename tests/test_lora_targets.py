"""LoRA targets: ``all-linear`` (peft's meaning: every Linear but the output head) through peft's own
expansion, counted and checked by xtrain exactly as peft adapts; and the target lists of the families
users bring (Qwen2, Qwen2-VL, Llama, Mistral, Gemma 2, Phi-3, Whisper, TrOCR, ViT) checked against
the model's module names as before (``model_checks.check_offline``: a skeleton on the meta device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xtrain import tasks
from xtrain.config.schema import TrainConfig
from xtrain.model import lora_layers
from xtrain.model import size as model_size
from xtrain.model.configs import read_config_offline
from xtrain.tasks import model_checks
from xtrain.tasks.sizes import adapted_layers, offline_sizes
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

DATA = Path(__file__).resolve().parents[1] / "xtrain" / "builtin" / "jobs"
LLAMA_LIKE = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip


def causal_checkpoint(folder: Path, kind: str) -> Path:
    """A config.json of a small ``kind`` model (planning and the checks read only the config)."""
    import transformers

    config_class = {
        "qwen2": transformers.Qwen2Config,
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "gemma2": transformers.Gemma2Config,
        "phi3": transformers.Phi3Config,
    }[kind]
    extra = {"head_dim": 8} if kind == "gemma2" else {}
    config_class(**SMALL, **extra).save_pretrained(folder)
    return folder


def causal_job(folder: Path, targets: str) -> TrainConfig:
    return load_config(
        None, [f"model.name_or_path={folder}", "model.task=causal-lm", f"lora.target_modules={targets}"]
    )


def skeleton(cfg: TrainConfig) -> torch.nn.Module:
    """The task's model on the meta device, as the plan builds it."""
    bare = model_size.meta_model(cfg, tasks.get(cfg.model.task), read_config_offline(cfg))
    assert not isinstance(bare, str), bare
    return bare


def peft_all_linear(model: torch.nn.Module, task_type: str | None) -> set[str]:
    """What peft itself expands ``all-linear`` to on ``model`` (the reference)."""
    from peft import LoraConfig, TaskType
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    config = LoraConfig(target_modules="all-linear", task_type=TaskType[task_type] if task_type else None)
    return set(_maybe_include_all_linear_layers(config, model).target_modules)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "mistral", "gemma2", "phi3"])
def test_all_linear_counts_what_peft_adapts(tmp_path: Path, kind: str) -> None:
    folder = causal_checkpoint(tmp_path / kind, kind)
    cfg = load_config(
        None, [f"model.name_or_path={folder}", "model.task=causal-lm", "lora.target_modules=all-linear"]
    )
    bare = model_size.meta_model(cfg, tasks.get("causal-lm"), read_config_offline(cfg))
    adapted, _ = adapted_layers(bare, cfg)
    assert set(adapted) == peft_all_linear(bare, "CAUSAL_LM")
    assert "lm_head" not in adapted and any(q.endswith("mlp.down_proj") for q in adapted)
    assert "checked against" in model_checks.check_offline(cfg)


def test_all_linear_on_a_classifier_leaves_its_head_to_peft(tmp_path: Path) -> None:
    """seq-cls: peft leaves the classifier out of all-linear and trains it whole (modules_to_save)."""
    cfg = load_config(None, ["lora.target_modules=all-linear"])  # builtin:tiny-bert, seq-cls
    bare = skeleton(cfg)
    adapted, whole = adapted_layers(bare, cfg)
    assert set(adapted) == peft_all_linear(bare, "SEQ_CLS") and "classifier" in whole
    assert "classifier" not in adapted and any(q.endswith("attention.self.query") for q in adapted)


@pytest.mark.parametrize(
    ("kind", "targets"),
    [
        ("qwen2", LLAMA_LIKE),
        ("llama", LLAMA_LIKE),
        ("mistral", LLAMA_LIKE),
        ("gemma2", LLAMA_LIKE),
        ("phi3", "[qkv_proj,o_proj,gate_up_proj,down_proj]"),
    ],
)
def test_the_families_target_names_are_found(tmp_path: Path, kind: str, targets: str) -> None:
    folder = causal_checkpoint(tmp_path / kind, kind)
    cfg = load_config(
        None, [f"model.name_or_path={folder}", "model.task=causal-lm", f"lora.target_modules={targets}"]
    )
    assert "LoRA targets checked" in model_checks.check_offline(cfg)
    bare = model_size.meta_model(cfg, tasks.get("causal-lm"), read_config_offline(cfg))
    adapted, _ = adapted_layers(bare, cfg)
    assert len(adapted) == 2 * len(cfg.lora.target_modules)  # each name in both layers


@pytest.mark.parametrize(
    ("job", "targets", "not_adapted"),
    [
        ("quickstart-vision-language.yaml", LLAMA_LIKE, "lm_head"),  # Qwen2-VL: its language model
        ("quickstart-speech-to-text.yaml", "[q_proj,k_proj,v_proj,out_proj,fc1,fc2]", "proj_out"),  # Whisper
        (
            "quickstart-image-to-text.yaml",
            "[q_proj,v_proj,out_proj,fc1,fc2]",
            "output_projection",
        ),  # TrOCR
        # ViT (transformers 5 names: q_proj, k_proj, v_proj, o_proj, fc1, fc2)
        ("quickstart-image-classification.yaml", "[q_proj,k_proj,v_proj,o_proj,fc1,fc2]", "classifier"),
    ],
)
@pytest.mark.parametrize("listed", [True, False])
def test_media_tasks_take_the_family_names_and_all_linear(
    job: str, targets: str, not_adapted: str, listed: bool
):
    from xtrain import tasks

    cfg = load_config(
        str(DATA / job), ["lora.enabled=true", f"lora.target_modules={targets if listed else 'all-linear'}"]
    )
    assert "LoRA targets checked" in model_checks.check_offline(cfg)
    bare = model_size.meta_model(cfg, tasks.get(cfg.model.task), read_config_offline(cfg))
    adapted, _ = adapted_layers(bare, cfg)
    assert adapted and not [q for q in adapted if q.split(".")[-1] == not_adapted or ".pooler." in q]
    if not listed:  # every Linear of the adapted part(s) but heads and poolers
        assert set(adapted) >= set(
            adapted_layers(bare, load_config(str(DATA / job), ["lora.enabled=true"]))[0]
        )


def test_a_transformers_4_list_for_vit_names_the_new_name() -> None:
    from xtrain.errors import XtrainError

    job = str(DATA / "quickstart-image-classification.yaml")
    with pytest.raises(XtrainError) as e:
        cfg = load_config(job, ["lora.enabled=true", "lora.target_modules=[query,value]"])
        model_checks.check_offline(cfg)
    assert "did you mean 'q_proj'? (transformers 5 renamed query to q_proj" in e.value.one_line()


def test_all_linear_trains_the_builtin_llama(tmp_path: Path) -> None:
    """In-process run: adapters on every attention and MLP projection of every layer, none on the
    head, the same layers peft's own all-linear picks on the plain model, all of them trained, and
    the plan's exact count is the live model's."""
    from test_loop import cpu_plan
    from test_lora_variants import llama_config

    from xtrain.model.load import load_model
    from xtrain.train.loop import train

    kept: dict = {}

    def build(run, main_process_first):
        workload = tasks.build_workload(run, main_process_first)
        kept["model"] = workload.model
        return workload

    cfg = llama_config(tmp_path / "out", steps=3, target_modules="all-linear")
    train(cfg, cpu_plan(), build=build)
    model = kept["model"]
    adapted = {n.removesuffix(".lora_A") for n, m in model.named_modules() if n.endswith(".lora_A")}
    adapted = {n.removeprefix("base_model.model.") for n in adapted}
    names = {n.rsplit(".", 1)[-1] for n in adapted}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(adapted) == 2 * 7 and not any("lm_head" in n for n in adapted)
    from xtrain import builtin

    plain = load_model(str(builtin.ensure_builtin_model("builtin:tiny-llama")), "AutoModelForCausalLM",
                       "causal-lm", "float32", False)  # fmt: skip
    assert adapted == peft_all_linear(plain, "CAUSAL_LM")
    trained = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert trained and all(p.abs().sum() > 0 for p in trained)  # B starts at zero: every adapter moved
    cfg: TrainConfig = llama_config(tmp_path / "plan", target_modules="all-linear")
    sizes = offline_sizes(cfg)
    assert not isinstance(sizes, str)
    assert sizes.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_all_linear_is_peft_shorthand_in_every_spelling() -> None:
    for spelling in ("all-linear", "ALL-LINEAR", "all", "[all-linear]", "all_linear"):
        cfg = load_config(None, [f"lora.target_modules={spelling}"])
        assert cfg.lora.target_modules == lora_layers.ALL_LINEAR
