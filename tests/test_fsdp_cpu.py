"""xtrain's loop under accelerate's FSDP2 path, on CPU: two real processes over gloo.

accelerate 1.15 has no supported switch for FSDP on CPU (``Accelerator(cpu=True, fsdp_plugin=...)``
becomes MULTI_CPU, ``accelerate launch --cpu --use_fsdp`` is refused: FIELD_NOTES). torch's
``fully_shard`` itself runs on CPU over gloo, so the worker (tests/support/fsdp.py) builds
xtrain's Accelerator as usual and then sets accelerate's state to FSDP with an FSDP2 plugin (its state's
``distributed_type``: NOT a supported switch, a test seam). From there on every call is
accelerate's own FSDP2 code: ``prepare`` (``fully_shard`` per decoder layer, the optimizer's
parameters swapped for the DTensors), ``no_sync``, ``clip_grad_norm_``, ``save_state`` /
``load_state`` (torch.distributed.checkpoint folders), and xtrain's gather-then-write of the
adapter (``xtrain.train.distributed.sharded``). The real accelerate FSDP path on CUDA is
tests/gpu/test_fsdp_gpu.py."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from support import warm
from support.fsdp import fsdp_run
from support.jobs import Job, assert_same_training, make_job, python_run, run_xtrain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return make_job(tmp_path_factory.mktemp("fsdp"), steps=4, save_every=2)


def test_lora_under_fsdp2_trains_saves_and_resumes_like_one_process(job: Job) -> None:
    """Two FSDP2 ranks train the same as one plain process (same losses, eval loss, adapter);
    the checkpoint is accelerate's sharded one, and resuming from it ends at the same adapter.
    Micro-batches of 2: accumulation 2 on two ranks (FSDP2's no_sync), 4 on one."""
    ref = job.root / "one"
    args = ("--config", str(job.config), f"run.output_dir={ref}", "batch.per_device=2")
    proc = run_xtrain(python_run(*args), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = job.root / "fsdp"
    fsdp_run(job, out, "batch.per_device=2")
    assert_same_training(ref, out)  # the adapter was gathered from the shards and written by rank 0
    step2 = out / "checkpoints" / "step-2"
    assert (step2 / "pytorch_model_fsdp_0").is_dir() and (step2 / "optimizer_0").is_dir()
    assert not (step2 / "model.safetensors").exists()  # accelerate's sharded save, not xtrain's hook
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert json.loads((out / "train_result.json").read_text())["accumulation"] == 2

    # resume from step 2 on two FSDP ranks: the same end as the run that never stopped
    straight = job.root / "fsdp-straight"
    shutil.copytree(out, straight)
    fsdp_run(job, out, f"run.resume={step2}", "batch.per_device=2")
    assert_same_training(straight, out)


def test_full_finetune_under_fsdp2_writes_loadable_model_and_best(job: Job) -> None:
    """Without LoRA the whole model is gathered on both ranks and written by rank 0, for the
    final model and for the best one (run.best_metric); both load with plain transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    out = job.root / "fsdp-full"
    fsdp_run(job, out, "lora.enabled=false", "optim.lr=1e-4", "run.eval_every=2", "run.best_metric=eval_loss")
    base = AutoModelForCausalLM.from_pretrained(job.config.read_text().split("name_or_path: ")[1].split()[0])
    for folder in (out / "model", out / "best"):
        trained = AutoModelForCausalLM.from_pretrained(folder)
        assert trained.state_dict().keys() == base.state_dict().keys()
        changed = [k for k, v in trained.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
        assert changed, f"{folder.name}: no weight changed"
    assert json.loads((out / "best" / "best.json").read_text())["metric"] == "eval_loss"


# fully_shard directly (no accelerate): the helpers' collectives with two real gloo ranks
DIRECT = textwrap.dedent(
    """
    import json, os, sys
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp import fully_shard

    from xtrain.train.distributed import sharded

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 2))
    model[0].weight.requires_grad_(False)  # a frozen base beside trainable weights (LoRA-like)
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    fully_shard(model[0]); fully_shard(model)
    acc = SimpleNamespace(distributed_type=DistributedType.FSDP, is_main_process=rank == 0,
                          device=torch.device("cpu"), num_processes=2)
    acc.unwrap_model = lambda m, keep_torch_compile=False: m
    result = {}
    full = sharded.gathered_state_dict(acc, model, trainable_only=False)
    trainable = sharded.gathered_state_dict(acc, model, trainable_only=True)
    if rank == 0:
        same = all(torch.equal(full[k], whole[k]) for k in whole)
        result["full_equal"] = sorted(full) == sorted(whole) and same
        result["trainable"] = sorted(trainable)
    else:
        result["others"] = [full, trainable]
    params = list(model.parameters())
    ok = sharded.finite_check_input(acc, params)
    result["finite_before"] = bool(torch.isfinite(ok[0]).all())
    if rank == 0:  # a NaN in rank 0's slice only
        with torch.no_grad():
            model[1].weight.to_local()[0, 0] = float("nan")
    result["finite_after"] = bool(torch.isfinite(sharded.finite_check_input(acc, params)[0]).all())
    with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown race (see test_comm_hook.py)
    """
)


def test_gather_and_finite_check_against_fully_shard(tmp_path: Path) -> None:
    """``sharded.gathered_state_dict`` gives rank 0 the whole (or only the trainable) weights and
    the others None; ``finite_check_input`` makes both ranks see a NaN in one rank's slice."""
    import os

    from xtrain.launch.rendezvous import free_port

    script = tmp_path / "direct.py"
    script.write_text(DIRECT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(script), str(tmp_path)]  # fmt: skip
    proc = warm.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                    timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert r0["full_equal"] is True
    assert r0["trainable"] == ["0.bias", "1.bias", "1.weight"]
    assert r1["others"] == [None, None]
    assert r0["finite_before"] and r1["finite_before"]
    assert not r0["finite_after"] and not r1["finite_after"]  # rank 1 sees rank 0's NaN too


def test_generation_eval_under_fsdp2_runs_in_lockstep(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The vision-language job evaluates by generation: under FSDP2 every step of ``generate``
    all-gathers, ranks whose answers end early keep stepping (``synced_gpus``), the root's
    ``generate`` gathers like ``forward``; the answers are those of one plain process."""
    import random

    import test_vision_language as vl
    from support.jobs import session_builtin, task_job, train_once

    from xtrain.builtin import vision_language as builtin_vl

    root = tmp_path_factory.mktemp("fsdp-vqa")
    (root / "img").mkdir()
    rng = random.Random(11)
    rows = []
    for i in range(42):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).save(root / "img" / f"{i}.png")
        rows.append(builtin_vl.conversation(f"img/{i}.png", shape, colour, rng))
    job = task_job(root, vl.JOB, session_builtin(tmp_path_factory, "builtin:tiny-qwen2-vl"), rows)
    straight = train_once(job)[0]
    one = json.loads((straight / "train_result.json").read_text())
    out = root / "fsdp"
    fsdp_run(job, out)
    two = json.loads((out / "train_result.json").read_text())
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):  # step 0 and the end
        assert (a["step"], a["exact_match"]) == (b["step"], b["exact_match"])
    assert one["predictions"] == two["predictions"]
    assert_same_training(straight, out)  # the adapter with the projector (modules_to_save) gathered


# FSDP2 over a 4-bit (bitsandbytes NF4) model with LoRA, through accelerate's FSDP2 path
QLORA = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    out, fsdp = sys.argv[1], sys.argv[2] == "fsdp"
    acc = Accelerator(cpu=True)
    if fsdp:  # the test seam of support/fsdp.py's WORKER
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        PartialState().distributed_type = DistributedType.FSDP
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True
        )
    folder = os.path.join(out, "tiny")
    if acc.is_main_process and not os.path.isdir(folder):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        LlamaForCausalLM(cfg).save_pretrained(folder)
    acc.wait_for_everyone()
    # the storage dtype of the packed 4-bit weights = the dtype FSDP gathers in (fp32 here)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                           bnb_4bit_quant_storage=torch.float32)
    model = LlamaForCausalLM.from_pretrained(folder, quantization_config=q, device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    # the no-grad loss below must not repack the 4-bit weights for bitsandbytes' CPU inference
    # kernel (AVX512-BF16 CPUs; no gradient through them afterwards): xtrain's own guard
    from xtrain.model.quantization import keep_training_layout
    keep_training_layout(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, opt = acc.prepare(model, opt)
    weight = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    x = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(5))
    r, w = acc.process_index, acc.num_processes
    mine = x[r * 4 // w : (r + 1) * 4 // w]  # each rank its share of the same batch
    losses = []
    for _ in range(3):
        acc.backward(model(input_ids=mine, labels=mine).loss)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            losses.append(model(input_ids=x, labels=x).loss.item())
    if acc.is_main_process:
        with open(os.path.join(out, sys.argv[2] + ".json"), "w") as f:
            json.dump({"losses": losses, "weight": type(weight).__name__}, f)
    acc.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_fsdp2_shards_a_4bit_model_stored_in_the_fsdp_dtype(tmp_path: Path) -> None:
    """FSDP + QLoRA: with ``bnb_4bit_quant_storage`` set to the dtype FSDP gathers in, accelerate
    1.15 shards bitsandbytes' packed 4-bit weights (DTensors) and LoRA trains on them as in one
    plain process (docs: "FSDP with 4-bit weights")."""
    import os

    from xtrain.launch.rendezvous import free_port

    script = tmp_path / "qlora.py"
    script.write_text(QLORA)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    one = warm.run([sys.executable, str(script), str(tmp_path), "plain"], env=env, capture_output=True,
                   text=True, timeout=120)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(free_port())]  # fmt: skip
    two = warm.run([*torchrun, str(script), str(tmp_path), "fsdp"], env=env, capture_output=True,
                   text=True, timeout=180)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    plain = json.loads((tmp_path / "plain.json").read_text())
    sharded = json.loads((tmp_path / "fsdp.json").read_text())
    assert (plain["weight"], sharded["weight"]) == ("Params4bit", "DTensor")  # 4-bit weights sharded
    assert sharded["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert sharded["losses"][-1] < sharded["losses"][0]
