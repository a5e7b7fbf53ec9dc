"""Gradients proven, not assumed: for every training path, the gradients of xtrain's first
optimizer step equal a plain reference's built from the same weights (tests/support/gradients.py:
the real loop read at its optimizer step; the model's class, peft and the dequantized weights
alone for the reference), also after an evaluation. And evaluation never changes training: a
run with evaluations ends with the same adapter as the run without them, in 16 and 4 bits.

"The loss falls" and "two runs agree" do not prove a training path: a 4-bit run whose adapters
below each quantized layer got no gradient after its first evaluation passed both
(docs/fitting-big-models.md, "4-bit training and evaluation")."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl, reference_gradients, xtrain_gradients

from xtrain import builtin
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each task's few rows (train.jsonl + eval.jsonl per task folder), made once."""
    return tmp_path_factory.mktemp("gradient-data")


def _stories(root: Path) -> tuple[Path, Path]:
    rows = builtin.story_examples(12, seed=3)
    return jsonl(root / "stories" / "train.jsonl", rows[:8]), jsonl(root / "stories" / "eval.jsonl", rows[8:])


def _cfg(out: Path, *overrides: str):
    """The built-in job's config (load_config's base) made one step without evaluations, then
    ``overrides``."""
    return load_config(
        None,
        [f"run.output_dir={out}", "run.report_to=none", "run.max_steps=1", "run.eval_at_start=false",
         "run.eval_every=null", "optim.max_grad_norm=null", "optim.warmup_steps=0", *overrides],
    )  # fmt: skip


def _causal(data: Path, out: Path, *extra: str):
    train, eval_ = _stories(data)
    return _cfg(
        out,
        "model.name_or_path=builtin:tiny-llama",
        "model.task=causal-lm",
        f"data.train={train}",
        f"data.eval={eval_}",
        "data.max_length=32",
        "batch.per_device=2",
        "batch.global_batch=4",  # 2 micro-batches: accumulation
        "lora.dropout=0.1",  # dropout on: the reference replays the loop's seeded generator
        *extra,
    )


def _check(cfg, rtol: float = 1e-4, adjust=None, micro_batches: int | None = None, evaluated: bool = False,
           chunked: bool = True):  # fmt: skip
    """xtrain's gradients at its first step against the plain reference's; ``chunked``: the run's
    loss was the chunked one (model.chunked_loss auto: the tasks whose loss is over a vocabulary),
    so the reference's plain ``.loss`` checks it too."""
    capture = xtrain_gradients(cfg)
    if micro_batches is not None:
        assert len(capture.inputs) == micro_batches
    assert capture.widths and all((w == 0) == chunked for w in capture.widths), capture.widths
    assert bool(capture.evaluated) == evaluated, f"evaluation forwards before the step: {capture.evaluated}"
    if cfg.lora.enabled and cfg.lora.dropout:  # the reference replays each LoRA dropout's masks
        assert capture.masks and {len(m) for m in capture.masks.values()} == {len(capture.inputs)}
    want = reference_gradients(capture, adjust, cfg.optim.max_grad_norm)
    assert_same_gradients(capture.grads, want, rtol)
    return capture


# -- the reproduction: 4-bit, one evaluation, then a training step -----------------------------------
def test_4bit_gradients_after_an_evaluation_equal_the_dequantized_reference(data, tmp_path):
    """bitsandbytes 0.50 on a CPU with AVX512-BF16 repacks a Linear4bit for inference at its
    first eval-mode no-grad forward; afterwards the layer passes no gradient to its input, so
    every adapter below a quantized layer got a wrong one (xtrain before the fix: this failed)."""
    pytest.importorskip("bitsandbytes")
    cfg = _causal(data, tmp_path / "q4", "model.quantization=4bit", "run.eval_at_start=true")
    capture = _check(cfg, micro_batches=2, evaluated=True)
    layers = [m for m in capture.model.modules() if type(m).__name__ == "Linear4bit"]
    assert layers and not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)


def test_the_reference_replays_the_runs_dropout_masks_not_its_generator(data, tmp_path):
    """The reference takes each LoRA dropout's mask from xtrain's run (``ReplayedDropout``), so it
    agrees where the same generator state draws other masks: on CUDA a mask depends on the
    input's dtype, and peft's bitsandbytes LoRA layers drop out a bf16 input under autocast
    (the H100 check was 13% off before). Here every forward's generator is changed instead."""
    import dataclasses

    capture = xtrain_gradients(_causal(data, tmp_path / "masks"))
    other = (torch.Generator().manual_seed(1234).get_state(), None)
    moved = dataclasses.replace(capture, inputs=[(kwargs, other) for kwargs, _ in capture.inputs])
    assert_same_gradients(capture.grads, reference_gradients(moved))


def test_a_4bit_layer_keeps_its_input_gradient_after_an_eval_forward():
    """The layer itself: an eval-mode no-grad forward, then a training forward and backward; the
    input's gradient is the dequantized weight's, and torch's "no autograd kernel" never fires."""
    pytest.importorskip("bitsandbytes")
    import warnings

    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit

    from xtrain.model.quantization import keep_training_layout

    torch.manual_seed(0)
    layer = Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4").to("cpu")
    weight = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).clone()
    assert keep_training_layout(torch.nn.Sequential(layer)) == 1
    layer.eval()
    with torch.no_grad():
        evaluated = layer(torch.randn(3, 64))
    layer.train()
    x = torch.randn(3, 64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.ones(3, 64) @ weight)
    torch.testing.assert_close(F.dequantize_4bit(layer.weight.data, layer.weight.quant_state), weight)
    assert evaluated.shape == (3, 64)


# -- causal-lm: 16-bit, 8-bit, the LoRA variants, packing, NEFTune ---------------------------------
def test_16bit_lora_with_accumulation_clipping_and_dropout_after_an_evaluation(data, tmp_path):
    cfg = _causal(data, tmp_path / "lora", "run.eval_at_start=true")
    cfg.optim.max_grad_norm = 0.05  # small enough to clip: the reference clips the same way
    _check(cfg, micro_batches=2, evaluated=True)


def test_8bit_gradients_after_an_evaluation_equal_the_dequantized_reference(data, tmp_path):
    pytest.importorskip("bitsandbytes")
    cfg = _causal(data, tmp_path / "q8", "model.quantization=8bit", "run.eval_at_start=true")
    _check(cfg, evaluated=True)


@pytest.mark.parametrize(
    "variant",
    ["lora.use_dora=true", "lora.use_rslora=true", "lora.init_weights=pissa", "lora.init_weights=olora",
     "model.quantization=4bit lora.use_dora=true"],
)  # fmt: skip
def test_lora_variants(data, tmp_path, variant):
    if "quantization" in variant:
        pytest.importorskip("bitsandbytes")
    _check(_causal(data, tmp_path / "variant", *variant.split(), "lora.dropout=0.0"))


def test_packing_restarts_positions_per_example(data, tmp_path):
    capture = _check(_causal(data, tmp_path / "packed", "data.packing=on", "data.max_length=96"))
    positions = capture.inputs[0][0]["position_ids"]
    assert positions.shape[0] == 1 and int((positions == 0).sum()) >= 2  # one row, examples restart at 0


def test_neftune_noise_is_the_papers(data, tmp_path):
    """NEFTune on: the gradient equals a reference that adds the paper's noise itself (uniform in
    +-alpha/sqrt(L*d) on the input embeddings, from the same generator state)."""
    alpha = 5.0

    def noisy(model):
        def hook(module, inputs, output):
            scale = alpha / (output.size(-2) * output.size(-1)) ** 0.5
            return output + torch.empty_like(output).uniform_(-scale, scale)

        model.get_input_embeddings().register_forward_hook(hook)

    _check(_causal(data, tmp_path / "neftune", f"optim.neftune_alpha={alpha}"), adjust=noisy)


# -- the memory levers: the chunked loss's heads and chat, the plain loss, activation offloading ------
# (every causal-lm, image-to-text, speech-to-text and vision-language check above runs the chunked
# loss: model.chunked_loss is auto; ``_check`` asserts that no logits were made)
@pytest.mark.parametrize(
    "head",
    ["lora.modules_to_save=lm_head",  # trained whole (peft's modules_to_save), LoRA dropout elsewhere
     "lora.target_modules=q_proj,v_proj,lm_head lora.dropout=0.0"],  # a LoRA-adapted head
)  # fmt: skip
def test_the_chunked_loss_trains_a_whole_or_adapted_head(data, tmp_path, head):
    capture = _check(_causal(data, tmp_path / "head", *head.split()), micro_batches=2)
    assert any("lm_head" in n for n in capture.grads)


def test_the_chunked_loss_on_chat_with_masked_prompts(tmp_path):
    examples = Path(__file__).resolve().parents[1] / "examples" / "data"
    cfg = _cfg(tmp_path, "model.name_or_path=builtin:tiny-llama", "model.task=causal-lm",
               f"data.train={examples / 'chat-train.jsonl'}", "data.eval=null",
               f"data.chat_template={examples / 'chat-template.jinja'}", "data.max_length=96",
               "batch.per_device=2", "batch.global_batch=4", "lora.dropout=0.1")  # fmt: skip
    capture = _check(cfg, micro_batches=2)
    labels = capture.inputs[0][0]["labels"]
    assert bool((labels == -100).any()) and bool((labels != -100).any())  # prompts masked, answers not


def test_the_plain_loss_when_turned_off(data, tmp_path):
    _check(_causal(data, tmp_path / "plain", "model.chunked_loss=off"), chunked=False)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_offload_with_and_without_checkpointing(data, tmp_path, checkpointing):
    checkpoints = f"model.gradient_checkpointing={str(checkpointing).lower()}"
    _check(_causal(data, tmp_path / "offload", "model.activation_offload=true", checkpoints), micro_batches=2)


# -- each task's loss ----------------------------------------------------------------------------------
def _task(out: Path, name: str, model: str, train: Path, *extra: str):
    return _cfg(out, f"model.name_or_path={model}", f"model.task={name}", f"data.train={train}",
                "data.eval=null", "batch.per_device=2", "batch.global_batch=4", "lora.dropout=0.0",
                *extra)  # fmt: skip


def test_seq_cls_trains_adapters_and_its_head_whole(data, tmp_path):
    train = jsonl(data / "sentiment" / "train.jsonl", builtin.sentiment_examples(8, seed=5))
    capture = _check(_task(tmp_path / "cls", "seq-cls", "builtin:tiny-bert", train, "lora.dropout=0.1"),
                     chunked=False)  # fmt: skip
    assert any("modules_to_save" in n for n in capture.grads), "the head trains whole"


def test_image_classification_trains_adapters_and_its_head_whole(data, tmp_path):
    from xtrain.builtin import image_classes

    rng, rows = random.Random(7), []
    for i, label in enumerate(image_classes.shape_labels(8, seed=7)):
        image_classes.draw_shape(label, rng).save(data / f"shape-{i}.png")
        rows.append({"image": str(data / f"shape-{i}.png"), "label": label})
    train = jsonl(data / "shapes" / "train.jsonl", rows)
    cfg = _task(tmp_path / "vit", "image-classification", "builtin:tiny-vit", train)
    capture = _check(cfg, chunked=False)
    assert any("modules_to_save" in n for n in capture.grads)


def test_image_to_text_adapters_on_encoder_and_decoder(data, tmp_path):
    from xtrain.builtin import image as builtin_image

    rng, rows = random.Random(3), []
    for i, text in enumerate(builtin_image.line_texts(4, seed=3)):
        builtin_image.render_line(text, rng).save(data / f"line-{i}.png")
        rows.append({"image": str(data / f"line-{i}.png"), "text": text})
    train = jsonl(data / "lines" / "train.jsonl", rows)
    _check(
        _task(
            tmp_path / "ocr",
            "image-to-text",
            "builtin:tiny-trocr",
            train,
            "data.max_length=24",
            "generation.max_new_tokens=8",
        )
    )


def test_speech_to_text_full_fine_tune(data, tmp_path):
    import soundfile

    from xtrain.builtin import audio as builtin_audio

    rng, rows = random.Random(5), []
    for i, text in enumerate(builtin_audio.clip_texts(4, seed=5)):
        path = data / f"clip-{i}.wav"
        soundfile.write(path, builtin_audio.synthesize(text, rng), builtin_audio.FILE_RATE)
        rows.append({"audio": str(path), "text": text})
    train = jsonl(data / "clips" / "train.jsonl", rows)
    capture = _check(
        _task(tmp_path / "asr", "speech-to-text", "builtin:tiny-whisper", train, "data.max_length=24",
              "lora.enabled=false", "generation.max_new_tokens=8"),
    )  # fmt: skip
    assert not hasattr(capture.model, "peft_config") and len(capture.grads) > 20  # every weight trains


def test_vision_language_adapters_and_projector(data, tmp_path):
    from xtrain.builtin import vision_language as builtin_vl

    rng, rows = random.Random(11), []
    for i in range(4):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).save(data / f"vqa-{i}.png")
        rows.append(builtin_vl.conversation(str(data / f"vqa-{i}.png"), shape, colour, rng))
    train = jsonl(data / "vqa" / "train.jsonl", rows)
    capture = _check(
        _task(tmp_path / "vl", "vision-language", "builtin:tiny-qwen2-vl", train, "data.max_length=64",
              "lora.projector=true", "generation.max_new_tokens=4"),
    )  # fmt: skip
    assert any("merger" in n for n in capture.grads), "the projector trains whole"


# -- preference: DPO's loss (and its SFT term) by hand from the model's logits -----------------------
def test_dpo_gradients_equal_the_loss_by_hand_from_the_logits(data, tmp_path):
    """The preference task's forward (policy log-probs, the reference with the adapters off, the
    DPO loss, a mean over the step's pairs, plus ``preference.sft_weight`` times the cross-entropy
    over the chosen tokens of the whole step: both micro-batches, xtrain/train/step_loss.py)
    against the formulas written out over a plain peft model's logits, with the adapters moved off
    zero first so the policy and its reference differ."""
    import torch.nn.functional as F
    from support.gradients import reference_model

    beta, sft_weight, batches = 0.5, 0.7, []
    train = jsonl(data / "pref" / "train.jsonl", builtin.preference_examples(8, 3))
    cfg = _cfg(tmp_path / "dpo", "model.name_or_path=builtin:tiny-llama", "model.task=preference",
               f"data.train={train}", "data.eval=null", "data.max_length=48", "batch.per_device=2",
               "batch.global_batch=4", f"preference.beta={beta}", f"preference.sft_weight={sft_weight}",
               "lora.dropout=0.0")  # fmt: skip

    def record(workload):
        forward = workload.forward
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)

        def recorded(model, batch):
            batches.append({k: v.detach().clone() for k, v in batch.items()})
            return forward(model, batch)

        workload.forward = recorded

    capture = xtrain_gradients(cfg, on_workload=record)
    assert len(batches) == 2 and capture.evaluated == 2  # one reference forward (no grad) per micro-batch

    def logps(logits, labels):
        target = labels[:, 1:]
        logp = logits[:, :-1].log_softmax(-1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return (logp * (target != -100)).sum(-1)

    ref = reference_model(capture).train()
    chosen = [int((b["labels"][: len(b["labels"]) // 2, 1:] != -100).sum()) for b in batches]
    assert len(set(chosen)) > 1, chosen  # the micro-batches' chosen tokens differ: the step's count matters
    for batch in batches:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        logits = ref(**inputs).logits
        policy = logps(logits, batch["labels"])
        with torch.no_grad(), ref.disable_adapter():
            reference = logps(ref(**inputs).logits, batch["labels"])
        b = len(policy) // 2
        z = (policy[:b] - policy[b:]) - (reference[:b] - reference[b:])
        assert float(z.abs().max()) > 1e-3, "the policy differs from its reference"
        chosen_logits, chosen_labels = logits[:b, :-1], batch["labels"][:b, 1:]
        nll = F.cross_entropy(chosen_logits.flatten(0, 1), chosen_labels.flatten(), ignore_index=-100,
                              reduction="sum")  # fmt: skip
        (-F.logsigmoid(beta * z).mean() / len(batches) + sft_weight * nll / sum(chosen)).backward()
    want = {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}
    assert_same_gradients(capture.grads, want)


# -- evaluation never changes training -----------------------------------------------------------------
@pytest.mark.parametrize("quantization", [None, "4bit"])
def test_evaluations_leave_the_trained_adapter_bitwise_the_same(data, tmp_path, quantization):
    """Evaluations at the start and after each step (a DataLoader iterator each, eval mode,
    no_grad, 4-bit layers that would repack) end with the adapter of the same run without them."""
    from safetensors.torch import load_file

    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.train.loop import train

    if quantization:
        pytest.importorskip("bitsandbytes")
    plan, adapters, first = make_plan(Facts(torch_version="2.13.0", gloo_available=True)), [], []
    for name, evals in (("plain", ()), ("evaluated", ("run.eval_at_start=true", "run.eval_every=1"))):
        cfg = _causal(data, tmp_path / name, f"model.quantization={quantization or 'null'}",
                      "run.max_steps=2", "optim.max_grad_norm=1.0", "optim.lr=0.01", "run.log_every=1",
                      *evals)  # fmt: skip
        result = train(cfg, plan)
        adapters.append(load_file(str(Path(result.outputs["adapter"]) / "adapter_model.safetensors")))
        first.append([loss for _, loss in result.losses])
        if evals:
            assert [h["step"] for h in result.eval_history] == [0, 1, 2]
    plain, evaluated = adapters
    assert plain.keys() == evaluated.keys() and all(torch.equal(plain[k], evaluated[k]) for k in plain)
    assert first[0] == first[1]  # every step's training loss too


# -- warnings that mean wrong gradients stop the run ---------------------------------------------------
def test_an_operator_without_autograd_stops_the_run_in_one_line(data, tmp_path):
    """torch's "an autograd kernel was not registered" (an operator on the way to the trained
    weights has no backward: their gradients are wrong) is an XtrainError, not a log line."""
    from xtrain.errors import XtrainError
    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.tasks import build_workload
    from xtrain.train.loop import train

    lib = torch.library.Library("xtrain_gradients_test", "DEF")  # an op with a CPU kernel only
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CPU")

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        norm = workload.model.get_base_model().model.norm  # above every adapter
        norm.register_forward_hook(lambda module, args, out: torch.ops.xtrain_gradients_test.double(out))
        return workload

    cfg = _causal(data, tmp_path / "op")
    with pytest.raises(XtrainError) as raised:
        train(cfg, make_plan(Facts(torch_version="2.13.0", gloo_available=True)), build=build)
    line = raised.value.one_line()
    assert raised.value.exit_code == 3
    assert "\n" not in line and line.startswith("xtrain_gradients_test::double has no gradient"), line
    assert not (tmp_path / "op" / "adapter").exists()


def test_only_the_listed_warnings_become_errors():
    import warnings

    from xtrain.runtime import quiet

    before = list(warnings.filters)
    with quiet.wrong_results_raise():
        warnings.warn("something else", UserWarning, stacklevel=1)  # shown as before, not raised
        with pytest.raises(UserWarning) as raised:
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=1)
    problem = quiet.wrong_result(raised.value)
    assert problem is not None and "activation checkpointing" in problem.message
    assert quiet.wrong_result(UserWarning("something else")) is None
    assert warnings.filters == before  # the filters as they were, on the way out


# -- two processes under FSDP2: the averaged gradient is one process's ---------------------------------
# xtrain.run with the Accelerator's state switched to FSDP2 (tests/test_fsdp_cpu.py's seam), each
# rank writing its whole gradients (FSDP2's shards gathered) at the first optimizer step
FSDP_WORKER = """
import os, runpy, sys

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

import xtrain.train.loop as loop
import xtrain.tasks as tasks

real_accelerator, real_build, models = loop.build_accelerator, tasks.build_workload, []


def fsdp_accelerator(*args, **kwargs):
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    acc = real_accelerator(*args, **kwargs)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            auto_wrap_policy="transformer_based_wrap")
    PartialState().distributed_type = DistributedType.FSDP
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    return acc


def build_workload(*args, **kwargs):
    workload = real_build(*args, **kwargs)
    models.append(workload.model)
    return workload


def at_step(optimizer, args, kwargs):
    grads = {}
    for name, p in models[0].named_parameters():
        if p.requires_grad:
            grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    torch.save(grads, os.path.join(os.environ["TEST_OUT"], f"grads-{dist.get_rank()}.pt"))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # the gradients are all this test wants (and no gloo teardown race)


loop.build_accelerator, tasks.build_workload = fsdp_accelerator, build_workload
register_optimizer_step_pre_hook(at_step)
sys.argv = ["xtrain.run", *sys.argv[1:]]
runpy.run_module("xtrain.run", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("tuning", ["lora", "full"])
def test_two_fsdp2_processes_average_to_one_processs_gradient(tmp_path, tmp_path_factory, tuning):
    """Two FSDP2 ranks over gloo, one micro-batch each, reduce-scatter the mean of their
    gradients: gathered, it is the gradient of one plain process accumulating both micro-batches
    over the same global batch, which is the reference's (dropout on: the loop seeds it per sample
    position, not per rank). Both under the chunked loss; ``full``: a full fine-tune, the head
    trained and sharded in accelerate's group of final norm and head (it crashed once: SIGSEGV,
    the group's hooks fired once a chunk, xtrain/model/chunked_loss.py ``_head_call``)."""
    from support.jobs import make_job, run_xtrain, session_builtin

    from xtrain.launch.rendezvous import free_port

    job = make_job(tmp_path / "job", model=str(session_builtin(tmp_path_factory, "builtin:tiny-llama")))
    common = ["run.max_steps=1", "optim.max_grad_norm=null", "optim.warmup_steps=0", "batch.per_device=4"]
    if tuning == "full":
        common.append("lora.enabled=false")
    one = _check(load_config(job.config, [*common, f"run.output_dir={tmp_path / 'one'}"]), micro_batches=2)
    worker = tmp_path / "fsdp_worker.py"
    worker.write_text(FSDP_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), "--config", str(job.config),
           f"run.output_dir={tmp_path / 'fsdp'}", *common]  # fmt: skip
    proc = run_xtrain(cmd, {**job.env, "TEST_OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "loss: chunked cross-entropy" in proc.stdout + proc.stderr  # the plan's Loss line, FSDP2 too
    if tuning == "full":
        assert any("lm_head" in name for name in one.grads)
    for rank in (0, 1):
        assert_same_gradients(torch.load(tmp_path / f"grads-{rank}.pt"), one.grads, rtol=1e-4)


def test_a_4bit_layer_repacked_before_the_run_is_unpacked_for_training():
    """A custom task's builder that ran its 4-bit model in eval mode hands the loop repacked
    layers: they are unpacked (bitsandbytes' inverse: the weights within its bf16-rounded scales)
    and pass their input gradient again."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit

    from xtrain.model.quantization import keep_training_layout

    torch.manual_seed(0)
    layer = Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4").to("cpu")
    weight = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).clone()
    if not layer.support_avx512bf16_for_cpu:
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never repacks here")
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(3, 64))
    assert layer.weight.quant_state.packing_format_for_cpu  # what bitsandbytes 0.50 does
    assert keep_training_layout(layer) == 1 and not layer.weight.quant_state.packing_format_for_cpu
    layer.train()
    x = torch.randn(3, 64, requires_grad=True)
    layer(x).sum().backward()
    unpacked = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    torch.testing.assert_close(unpacked, weight, rtol=0, atol=1e-3)
    torch.testing.assert_close(x.grad, torch.ones(3, 64) @ unpacked)
