"""Sequence parallelism, exact (issue 58): one process on the whole sequence against two with
``parallel.sequence: 2``, each holding half of every sequence (gloo, real processes), give the
same step loss and the same LoRA gradients within float32 rounding, for padded, packed, chat and
preference batches, under gradient checkpointing, in Ulysses and ring mode; GRPO's and
distillation's steps (tests/test_sequence_parallel_rl.py) in the same torchrun.

The one-process side is xtrain's loop at its first optimizer step, itself checked against the
plain reference (tests/support/gradients.py: the model's class, peft, every token's cross-entropy
over the step's trained tokens, written out); the preference task's own gradient check is
tests/test_gradients.py's. One torchrun of 2 processes runs every configuration in turn (its process
group kept between them) and saves each rank's gradients and its shares of the step's loss, which
summed over the ranks are the step's loss.

The rows' lengths differ widely and exceed one process's half (so shards hold prompt-only, answer
and padding positions, and packed examples cross the cut); every LoRA B matrix is moved off zero
first (seeded by its name, the same in every run), so every adapter weight has a gradient.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl, reference_gradients, xtrain_gradients

from xtrain import builtin
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def _common(*extra: str) -> list[str]:
    return ["run.report_to=none", "run.max_steps=1", "run.eval_at_start=false", "run.eval_every=null",
            "optim.max_grad_norm=null", "optim.warmup_steps=0", "data.eval=null", "lora.dropout=0.0",
            "batch.per_device=2", "batch.global_batch=4", *extra]  # fmt: skip


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each kind's config overrides (without ``parallel.sequence``)."""
    from test_sequence_parallel_vl import vl_overrides  # (it imports this module's helpers)

    data = tmp_path_factory.mktemp("seqpar-data")
    rng = random.Random(5)
    rows = [{"prompt": f"count to {n}: ", "response": " ".join(WORDS[i % 12] for i in range(n))}
            for n in rng.sample(range(1, 40), 8)]  # fmt: skip
    chats = [{"messages": [turn("user", r["prompt"]), turn("assistant", r["response"]), turn("user", "again"),
                           turn("assistant", WORDS[i % 12])]} for i, r in enumerate(rows)]  # fmt: skip
    counting = f"data.train={jsonl(data / 'counting.jsonl', rows)}"
    from test_sequence_parallel_rl import DEFAULT as RL
    from test_sequence_parallel_rl import rl_jobs

    tiny = ("model.name_or_path=builtin:tiny-llama", "model.task=causal-lm")
    pairs = f"data.train={jsonl(data / 'pairs.jsonl', builtin.preference_examples(8, 3))}"
    chat = f"data.train={jsonl(data / 'chats.jsonl', chats)}"
    return {
        # the model's own loss (shift_labels), padded rows of 3 to 40 tokens, sdpa
        "padded": _common(*tiny, counting, "data.max_length=41", "model.chunked_loss=off"),
        # examples packed into rows of 64, crossing the cut; the chunked loss; ring attention, which
        # keeps the packed examples apart by their segments
        "packed-ring": _common(*tiny, counting, "data.packing=on", "data.max_length=64",
                               "parallel.sequence_mode=ring"),
        # chat rows under gradient checkpointing, eager attention (the models call it outside the
        # registry: its own name there)
        "chat-checkpointing": _common(
            "model.name_or_path=builtin:tiny-llama-chat", "model.task=causal-lm", chat, "data.max_length=64",
            "model.gradient_checkpointing=true", "model.attn_implementation=eager",
        ),
        "preference": _common("model.name_or_path=builtin:tiny-llama", "model.task=preference", pairs,
                              "data.max_length=48", "preference.sft_weight=0.5"),
        # vision-language rows whose images straddle the cut (tests/test_sequence_parallel_vl.py)
        "vision-language": vl_overrides(data / "vl"),
        # GRPO and on-policy distillation: completed in the step, then cut (test_sequence_parallel_rl.py)
        **{k: v for k, v in rl_jobs(data, tmp_path_factory).items() if k in RL},
    }  # fmt: skip


# Each rank of a torchrun runs xtrain's loop (support.gradients.xtrain_gradients) on each config
# in turn in one process group, and saves its gradients at the first optimizer step and its shares
# of the step's loss (StepLoss.micro's second value, summed over its micro-batches).
WORKER = """
import json, os, sys

import torch
import torch.distributed as dist

sys.path.insert(0, sys.argv[1])
from support.gradients import keep_group, xtrain_gradients
from test_sequence_parallel import SHARDS_SEEN, WHOLE, moved_adapters, record_shares

import xtrain.train.loop as loop
from xtrain.machine.facts import Facts
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan
from xtrain.tasks.validation import load_config

loop.release = keep_group  # one process group for every config
facts = Facts(torch_version="2.13.0", gloo_available=True, cpu_count=2)
plan = make_plan(facts, Overrides(num_processes=int(os.environ["WORLD_SIZE"])))  # torchrun's
for name, overrides in json.loads(sys.argv[2]).items():
    SHARDS_SEEN.clear()
    WHOLE.clear()
    with record_shares() as shares:
        grads = xtrain_gradients(load_config(None, overrides), plan, on_workload=moved_adapters).grads
    out = os.path.join(os.environ["TEST_OUT"], f"{name}-{dist.get_rank()}.pt")
    torch.save({"grads": grads, "loss": sum(shares), "shards": list(SHARDS_SEEN), "whole": len(WHOLE)}, out)
dist.barrier()
dist.destroy_process_group()
"""


SHARDS_SEEN: list[tuple[int, int]] = []  # (shard, of how many) of each forward given a sequence shard
WHOLE: list[int] = []  # one entry a forward of whole sequences (generation's)


def moved_adapters(workload) -> None:
    """Every LoRA B matrix set to seeded values (by its name): B starts at 0, and then the A
    matrices would have no gradient to compare. Each forward of the model that gets a sequence
    shard is noted in ``SHARDS_SEEN``."""
    from xtrain.data.sequence_shards import KEY

    with torch.no_grad():
        for name, p in workload.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)

    def seen(module, args, kwargs) -> None:
        if kwargs.get(KEY) is not None:
            SHARDS_SEEN.append((kwargs[KEY].index, kwargs[KEY].size))
        else:
            WHOLE.append(1)

    workload.model.register_forward_pre_hook(seen, with_kwargs=True)


class record_shares:
    """Collects every micro-batch's share of the step's loss while it is open."""

    def __enter__(self) -> list[float]:
        from xtrain.train.step_loss import StepLoss

        self.own, shares = StepLoss.micro, []

        def micro(step_loss, out, count, total):
            backward, share = self.own(step_loss, out, count, total)
            shares.append(float(share))
            return backward, share

        StepLoss.micro = micro
        return shares

    def __exit__(self, *exc: object) -> None:
        from xtrain.train.step_loss import StepLoss

        StepLoss.micro = self.own


def _torchrun(configs: dict[str, list[str]], root: Path, cache: Path, processes: int = 2) -> dict[str, list]:
    """Each config's first step on ``processes`` processes (one torchrun): every rank's saved
    gradients and loss shares."""
    from support.jobs import offline_env, run_xtrain

    from xtrain.launch.rendezvous import free_port

    worker = root / "worker.py"
    worker.write_text(WORKER)
    env = {**offline_env(root, cache), "TEST_OUT": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), str(Path(__file__).parent),
           json.dumps(configs)]  # fmt: skip
    proc = run_xtrain(cmd, env)
    failed = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("[rank"))
    assert proc.returncode == 0, (failed or proc.stderr)[-4000:]
    return {k: [torch.load(root / f"{k}-{rank}.pt") for rank in range(processes)] for k in configs}


def _cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain"  # conftest's private_caches


@pytest.fixture(scope="module")
def two_processes(jobs: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Each kind's first step on 2 processes, each holding half of every sequence (one torchrun)."""
    root = tmp_path_factory.mktemp("seqpar-two")
    configs = {k: [*o, "parallel.sequence=2", f"run.output_dir={root / k}"] for k, o in jobs.items()}
    return _torchrun(configs, root, _cache(tmp_path_factory))


def one_process(overrides: list[str], out: Path) -> tuple[dict, float]:
    """One process on whole sequences: (its first-step capture, its step loss)."""
    with record_shares() as shares:
        capture = xtrain_gradients(
            load_config(None, [*overrides, f"run.output_dir={out}"]), on_workload=moved_adapters
        )
    return capture, sum(shares)


@pytest.mark.parametrize(
    "kind", ["padded", "packed-ring", "chat-checkpointing", "preference", "vision-language"]
)
def test_two_processes_holding_half_of_each_sequence_train_as_one(jobs, two_processes, kind, tmp_path):
    """The step's loss (every rank's shares summed) and each rank's LoRA gradients equal one
    process's on the whole sequences, and those equal the plain reference's (token losses)."""
    one, loss = one_process(jobs[kind], tmp_path / "one")
    if kind != "preference":  # (the preference forward's own check: tests/test_gradients.py)
        assert_same_gradients(one.grads, reference_gradients(one))
    assert sum(r["loss"] for r in two_processes[kind]) == pytest.approx(loss, rel=1e-5)
    for rank in two_processes[kind]:
        assert_same_gradients(rank["grads"], one.grads)


@pytest.mark.parametrize("kind", ["grpo", "distill"])
def test_grpo_and_distillation_train_on_halves_as_one(jobs, two_processes, kind, tmp_path):
    """GRPO (dapo with the KL to the reference, two micro-batches) and on-policy distillation:
    completed whole and the same in the group, trained on halves; the step's loss and each rank's
    LoRA gradients equal one process's, and those the loss by hand (test_sequence_parallel_rl.py)."""
    from test_sequence_parallel_rl import check

    check(kind, jobs[kind], two_processes[kind], tmp_path / "one")


# -- the combinations (soak: minutes) -------------------------------------------------------------

SOAK = {  # (the kind it starts from, what it adds)
    # 4-bit NF4 base weights (bitsandbytes on the CPU), LoRA on top
    "qlora": ("padded", ["model.quantization=4bit"]),
    # what autograd saves moved to host memory and back (saved-tensor hooks around the exchanges)
    "offload": ("padded", ["model.activation_offload=true", "model.gradient_checkpointing=true"]),
    # unpaired rows, each sequence's log-probs summed over its shards
    "kto": ("preference", ["preference.loss=kto", "preference.sft_weight=0.0"]),
}


@pytest.mark.soak  # one more torchrun and a one-process run a case: about a minute each
@pytest.mark.parametrize("case", list(SOAK))
def test_the_combinations_train_as_one(jobs, case, tmp_path, tmp_path_factory):
    """4-bit QLoRA, activation offloading, KTO: two processes holding half of each sequence against
    one on the whole sequences, the same loss and gradients."""
    kind, extra = SOAK[case]
    overrides = [*jobs[kind], *extra]
    two = _torchrun({case: [*overrides, "parallel.sequence=2", f"run.output_dir={tmp_path / 'two'}"]},
                    tmp_path, _cache(tmp_path_factory))[case]  # fmt: skip
    one, loss = one_process(overrides, tmp_path / "one")
    assert sum(r["loss"] for r in two) == pytest.approx(loss, rel=1e-5)
    for rank in two:
        assert_same_gradients(rank["grads"], one.grads, rtol=2e-4 if case == "qlora" else 1e-4)


@pytest.mark.soak  # four processes on two cores
def test_four_processes_data_parallel_on_top_and_ring_across_four(jobs, tmp_path, tmp_path_factory):
    """Four processes, two groups of two each holding half of every sequence: the groups read
    different rows (global batch 8 = 2 per-device x 2 groups x 2 accumulation), the step is one
    process's on the same 8 rows (4 micro-batches of 2). And one sequence split across all four:
    the tiny llama's 2 key/value heads do not divide by 4, so auto picks ring attention."""
    wide = [*jobs["padded"], "batch.global_batch=8"]
    configs = {
        "dp": [*wide, "parallel.sequence=2", f"run.output_dir={tmp_path / 'dp'}"],
        "ring4": [*jobs["padded"], "parallel.sequence=4", f"run.output_dir={tmp_path / 'ring4'}"],
    }
    four = _torchrun(configs, tmp_path, _cache(tmp_path_factory), processes=4)
    for name, overrides in (("dp", wide), ("ring4", jobs["padded"])):
        one, loss = one_process(overrides, tmp_path / f"one-{name}")
        assert sum(r["loss"] for r in four[name]) == pytest.approx(loss, rel=1e-5)
        for rank in four[name]:
            assert_same_gradients(rank["grads"], one.grads)


@pytest.mark.soak  # three trainings of 4 steps
def test_resume_is_exact(tmp_path):
    """Two processes with parallel.sequence: 2, 4 steps, a checkpoint at step 2: resumed there it
    ends bitwise where the uninterrupted run ended, and both end where one process ends."""
    import shutil

    from support.jobs import assert_same_training, make_job, python_run, run_xtrain

    job = make_job(tmp_path / "job", steps=4, save_every=2)

    def run(out: Path, processes: int, *extra: str) -> None:
        args = [
            "--processes",
            str(processes),
            "--config",
            str(job.config),
            f"run.output_dir={out}",
            "lora.dropout=0.0",
        ]
        proc = run_xtrain(python_run(*args, *extra), job.env)
        assert proc.returncode == 0, proc.stderr[-4000:]

    split = ["parallel.sequence=2"]
    run(tmp_path / "one", 1)
    run(tmp_path / "split", 2, *split)
    assert (
        json.loads((tmp_path / "split" / "train_result.json").read_text())["run_info"]["sequence_parallel"]
        == 2
    )
    assert_same_training(tmp_path / "one", tmp_path / "split")
    straight = tmp_path / "straight"
    shutil.copytree(tmp_path / "split", straight)
    run(tmp_path / "split", 2, *split, f"run.resume={tmp_path / 'split' / 'checkpoints' / 'step-2'}")
    assert_same_training(straight, tmp_path / "split", exact=True)


# -- the cut (no processes) -----------------------------------------------------------------------


def test_the_cut_shifts_labels_first_and_numbers_positions_globally():
    """Two rows of 7 tokens cut in 2 (padded to 8): the shards' shifted labels, laid end to end,
    are the labels shifted once over the whole row (a shard's last token predicts the next shard's
    first); positions count over the whole row; a left-padded row's tokens and each pad are segments
    of their own, a packed row's examples too; the shards' real tokens add up to the batch's."""
    from xtrain.data.collate import PackedCollator, PadCollator
    from xtrain.data.sequence_shards import segments_of, shard_batch

    rows = [{"input_ids": [5, 6, 7, 8, 9, 10, 11], "labels": [-100, -100, 7, 8, 9, 10, 11]},
            {"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}]  # fmt: skip
    batch = PadCollator(0, masks=True)(rows)
    shards = [shard_batch(batch, 2, i) for i in (0, 1)]
    whole = torch.cat([s["shift_labels"] for s in shards], dim=1)
    assert whole.tolist() == [[-100, 7, 8, 9, 10, 11, -100, -100], [6, 7, 8, -100, -100, -100, -100, -100]]
    assert torch.cat([s["position_ids"] for s in shards], dim=1).tolist() == [list(range(8))] * 2
    assert all(s["input_ids"].shape == (2, 4) and s["sequence_shards"].segments is None for s in shards)
    assert sum(s["sequence_shards"].tokens for s in shards) == 11
    left = {"input_ids": torch.tensor([[0, 0, 4, 5]]), "attention_mask": torch.tensor([[0, 0, 1, 1]]),
            "labels": torch.tensor([[-100, -100, 4, 5]])}  # fmt: skip
    assert shard_batch(left, 2, 0)["sequence_shards"].segments == ((1, 1, 2),)
    examples = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "position_ids": [0, 1, 2]},
                {"input_ids": [4, 5], "labels": [-100, 5], "position_ids": [0, 1]}]  # fmt: skip
    cut = shard_batch(PackedCollator(0)(examples), 2, 1)
    assert cut["sequence_shards"].segments == ((3, 3),)  # the 1-token tail continues the last example
    assert cut["position_ids"].tolist() == [[0, 1, 2]] and cut["shift_labels"].tolist() == [[5, -100, -100]]
    assert segments_of(torch.tensor([[0, 1, 2, 0, 1]])) == ((3, 2),)


def test_the_plan_groups_consecutive_ranks_and_picks_the_mode_from_the_heads():
    from xtrain.errors import XtrainError
    from xtrain.planning.sequence import choose_mode, sequence_plan

    plan = sequence_plan(2, 4)
    assert plan.groups() == [[0, 1], [2, 3]] and plan.data_parallel == 2
    assert [plan.group_of(r) for r in range(4)] == [0, 0, 1, 1] and [plan.shard(r) for r in range(4)] == [
        0,
        1,
        0,
        1,
    ]
    assert sequence_plan(0, 2).size == 2 and not sequence_plan(0, 1).on  # all: every process
    assert choose_mode("auto", 2, 28, 4)[0] == "ulysses" and choose_mode("auto", 4, 4, 2)[0] == "ring"
    with pytest.raises(XtrainError, match="parallel.sequence=3 does not divide the 4 processes"):
        sequence_plan(3, 4)


# -- bad input: one line each, at the dry run ----------------------------------------------------


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal-lm job with parallel.sequence: 2, and a model folder of a family whose attention
    does not go through transformers' registry (Bloom: its tokenizer the tiny llama's)."""
    import shutil

    from transformers import BloomConfig

    root = tmp_path_factory.mktemp("seqpar-bad")
    tiny = builtin.ensure_builtin_model("builtin:tiny-llama")
    bloom = root / "bloom"
    BloomConfig(hidden_size=32, n_layer=1, n_head=4, vocab_size=512).save_pretrained(bloom)
    for f in tiny.iterdir():
        if "token" in f.name:
            shutil.copy(f, bloom / f.name)
    rows = jsonl(root / "rows.jsonl", builtin.story_examples(8, seed=1))
    jsonl(root / "prompts.jsonl", [{"prompt": f"count to {n}:", "completion": "one"} for n in range(8)])
    (root / "job.yaml").write_text(
        f"model:\n  name_or_path: builtin:tiny-llama\n  task: causal-lm\ndata:\n  train: {rows}\n"
        f"  max_length: 64\nrun:\n  output_dir: {root / 'out'}\nparallel:\n  sequence: 2\n"
    )
    return root


BAD = {
    "processes": (["--processes", "3"], "parallel.sequence=2 does not divide the 3 processes"),
    "heads": (
        ["--processes", "4", "parallel.sequence=4", "parallel.sequence_mode=ulysses"],
        "parallel.sequence_mode=ulysses splits the attention heads across the 4 processes of a sequence, "
        "and this model has 4 attention heads and 2 key/value heads",
    ),
    "family": (
        ["--processes", "2", "model.name_or_path={r}/bloom"],
        "parallel.sequence: BloomForCausalLM does not pass its attention through transformers'",
    ),
    "short": (
        ["--processes", "2", "data.max_length=1"],
        "data.max_length=1 is shorter than parallel.sequence=2",
    ),
    "task": (
        ["--processes", "2", "model.task=seq-cls", "model.name_or_path=builtin:tiny-bert"],
        "parallel.sequence: the seq-cls task does not split its sequences across processes",
    ),
    "teacher": (  # (a distillation teacher runs on the shards too)
        [
            "--processes",
            "2",
            "model.task=distill",
            "distill.teacher={r}/bloom",
            "data.train={r}/prompts.jsonl",
        ],
        "parallel.sequence: BloomForCausalLM (distill.teacher) does not pass its attention through",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_at_the_dry_run(bad: Path, case: str, capsys, monkeypatch) -> None:
    """Processes that N does not divide, heads Ulysses cannot split (ring named), a family outside
    the attention registry (a distillation teacher's too), a sequence shorter than N tokens, a task
    that cannot split: one line."""
    from xtrain.cli import main

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    args, expected = BAD[case]
    code = main(["train", str(bad / "job.yaml"), "--dry-run", *(a.format(r=bad) for a in args)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and expected in errors[0], err[-2000:]
    if case == "heads":
        assert "parallel.sequence_mode=ring" in errors[0]


@pytest.mark.soak  # two quickstarts of 40 steps
def test_the_long_quickstart_learns_the_same_at_one_and_two_processes(tmp_path):
    """``xtrain quickstart --task long``: conversations longer than each process's half, answer
    token accuracy from 0 to over 0.8, and the two runs' evaluations equal (LoRA dropout off)."""
    from support.jobs import offline_env, run_xtrain

    results = []
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        cmd = [sys.executable, "-m", "xtrain", "quickstart", "--task", "long", "--processes", str(processes),
               "--output-dir", str(out)]  # fmt: skip
        proc = run_xtrain(cmd, offline_env(tmp_path, tmp_path / "cache"))
        assert proc.returncode == 0, proc.stderr[-4000:]
        (run,) = out.iterdir()
        results.append(json.loads((run / "train_result.json").read_text()))
    assert results[1]["run_info"]["sequence_parallel"] == 2
    before = results[0]["eval_history"][0]["token_accuracy"]
    after = [r["eval_metrics"]["token_accuracy"] for r in results]
    assert before < 0.1 and min(after) > 0.8
    assert results[1]["eval_metrics"]["eval_loss"] == pytest.approx(
        results[0]["eval_metrics"]["eval_loss"], rel=1e-4
    )
