"""GRPO's log-probs fit big vocabularies (issue 48): a GRPO step's log-prob work on a tiny model
with Qwen2.5's 152,064-entry vocabulary and 8 completions of 128 tokens (their float32 logits alone:
594 MiB) peaks at a small fraction of that: the policy's forward and backward through the loss,
and the reference's log-probs without gradients, the head run in chunks on the completions' tokens
(``GrpoStep`` with ``Workload.use_chunked_loss``, as the loop's levers set it). The chunks bound
the peak whatever the completions' length (the run's own chunks: 220 positions of this vocabulary,
128 MiB of float32 logits; here 64, to keep the test's arithmetic small). The peak is the CPU
allocator's, from PyTorch's profiler's record of every allocation and free."""

from __future__ import annotations

from types import SimpleNamespace

import torch

VOCAB, ROWS, PROMPT, COMPLETION, CHUNK = 152_064, 8, 16, 128, 64


def _allocated_peak(fn) -> int:
    """Peak bytes the CPU allocator holds above the start while ``fn`` runs: the running sum of
    the profiler's memory events (allocations positive, frees negative), in time order."""
    from itertools import accumulate

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())  # fmt: skip
    return max(accumulate(e.nbytes() for e in events), default=0)


def test_a_grpo_step_on_a_152k_vocabulary_never_holds_the_full_logits():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from xtrain.builtin.text import tiny_llama_config
    from xtrain.config.schema import GrpoConfig
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.tasks.grpo.step import GrpoStep

    torch.manual_seed(0)
    shape = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}
    base = LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB, max_position_embeddings=1024, **shape))
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    g = GrpoConfig(num_generations=4, max_completion_length=COMPLETION, beta=0.1, rewards=["length"])
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=2)
    step = GrpoStep(g, [], [], SimpleNamespace(tokenizer=tokenizer), seed=0)
    step.use_chunked_loss(LogitMap(), CHUNK)  # the levers' call under model.chunked_loss=auto
    prompts = torch.randint(3, VOCAB, (ROWS // 4, PROMPT)).repeat_interleave(4, 0)
    completions = torch.randint(3, VOCAB, (ROWS, COMPLETION))
    mask = torch.ones(ROWS, COMPLETION, dtype=torch.long)
    mask[1, 50:] = 0  # a completion that ended early: its padding is not scored
    batch = {
        "input_ids": torch.cat([prompts, completions], 1),
        "attention_mask": torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask], 1),
        "completion_mask": mask, "loss_mask": mask, "advantages": torch.randn(ROWS),
        "stat/total_tokens": mask.sum().float(), "stat/micro_batches": torch.tensor(1.0),
    }  # fmt: skip

    def grpo_step():
        step._side_logps(model, batch)  # the reference's log-probs (beta > 0), no gradients
        step(model, batch).loss.backward()

    peak = _allocated_peak(grpo_step)
    logits = ROWS * COMPLETION * VOCAB * 4  # one float32 copy of the completions' logits
    assert batch["ref_logps"].shape == (ROWS, COMPLETION)
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
    assert peak < logits / 4, f"peak {peak / 2**20:.0f} MiB, the full logits {logits / 2**20:.0f} MiB"
