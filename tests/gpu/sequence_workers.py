"""Spawn targets of tests/gpu/test_sequence_parallel_gpu.py (top level, importable by name)."""

from __future__ import annotations

import os


def sequence_parallel_equality(
    rank: int, world: int, backend: str, port: int, out_dir: str, mode: str
) -> None:
    """Each rank: a tiny llama with LoRA on its GPU (``backend`` nccl: cuda:rank; gloo: every rank
    on cuda:0, the exchanges staged through host memory as on Windows), the token sum of a padded
    batch of two rows, once whole (the reference) and once as this rank's shard through xtrain's
    sequence-parallel attention (``mode``: ulysses or ring); the shard gradients summed over the
    ranks must equal the whole batch's."""
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.data.sequence_shards import shard_batch
    from xtrain.model import sequence_parallel
    from xtrain.model.shard_exchange import Exchange, activate

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    device = torch.device("cuda", rank if backend == "nccl" else 0)
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, attn_implementation="sdpa")  # fmt: skip
    model = get_peft_model(
        LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    model.to(device).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 97, (2, 37), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0  # a right-padded row
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :9] = -100  # a prompt
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def token_sum(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            target.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )

    trained = [p for p in model.parameters() if p.requires_grad]
    whole = {k: v.to(device) for k, v in batch.items() if k != "labels"}
    token_sum(model(**whole).logits[:, :-1], batch["labels"][:, 1:].to(device)).backward()
    want = [p.grad.detach().clone() for p in trained]
    model.zero_grad(set_to_none=True)

    activate(Exchange(None, world, rank, staged=backend == "gloo", mode=mode))
    sequence_parallel.register("sdpa")
    shard = shard_batch(batch, world, rank)
    inputs = {
        k: v.to(device) if torch.is_tensor(v) else v
        for k, v in shard.items()
        if k not in ("labels", "shift_labels")
    }
    token_sum(model(**inputs).logits, shard["shift_labels"].to(device)).backward()
    got = torch.cat([p.grad.detach().flatten() for p in trained])
    summed = got.cpu() if backend == "gloo" else got  # (NCCL reduces CUDA tensors only)
    dist.all_reduce(summed)
    torch.save(
        {"got": got, "want": torch.cat([w.flatten() for w in want]).cpu()},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()


def rollout_broadcast(rank: int, world: int, backend: str, port: int, out_dir: str) -> None:
    """Each rank: rows of CUDA tensors of its own shapes (a rollout's completions differ in
    length where sampling differs); after ``Exchange.broadcast`` (GRPO's and distillation's
    ``same_in_group``) every rank holds rank 0's, on its own device."""
    import torch
    import torch.distributed as dist

    from xtrain.model.shard_exchange import Exchange

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    device = torch.device("cuda", rank if backend == "nccl" else 0)
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    group = dist.new_group([0, 1])
    mine = {
        "input_ids": torch.full((4, 10 + rank), rank, device=device),
        "rewards": torch.rand(4, device=device),
    }
    got = Exchange(group, 2, rank, staged=backend == "gloo").broadcast(mine if rank == 0 else {}, device)
    torch.save({k: v.cpu() for k, v in got.items()} | {"devices": [str(v.device) for v in got.values()]},
               os.path.join(out_dir, f"broadcast{rank}.pt"))  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
