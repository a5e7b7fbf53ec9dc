"""xtrain's own decode loop (xtrain/model/decoding.py, issue 48): its completions against plain
references, on the built-in tiny llama with LoRA adapters on and left-padded prompts of different
lengths:

- a group's prompt encoded once and its cache expanded gives, token for token, what transformers'
  ``generate`` gives on every completion's own copy of the prompt with the same per-completion
  draws (a logits processor that draws from each row's generator and leaves only that token);
- the static cache (CUDA's path, run here on the CPU) gives what the model's own cache gives;
- a multi-turn episode (decode, extend with tool results, decode again, one row dropped) gives what
  a loop without any cache gives over the whole context at every step.
"""

from __future__ import annotations

import pytest
import torch

from xtrain.model.decoding import (
    Decoder,
    DecodeSettings,
    Sampling,
    completion_mask,
    decode_settings,
    draws,
    generate,
    pick,
)

pytestmark = pytest.mark.usefixtures("private_caches")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """(peft model with random LoRA weights, tokenizer, left-padded prompt ids, their mask)."""
    from support.decoding import lora_lm

    return lora_lm(tmp_path_factory)


class _DrawnByRow:
    """The reference's sampling inside ``generate``: each row's token picked with its own draws
    (as the decoder picks it), every other token's score -inf (``generate`` then runs greedily)."""

    def __init__(self, seeds: list[int], sampling: Sampling, steps: int) -> None:
        self.sampling, self.u, self.t = sampling, draws(seeds, steps, "cpu"), 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        token = pick(scores, self.sampling, self.u[:, self.t])
        self.t += 1
        return torch.full_like(scores, float("-inf")).scatter_(1, token.unsqueeze(1), 0.0)


def test_draws_and_picks_are_per_row():
    """A row's draws depend on its seed alone; a pick is the inverse of the cumulative distribution
    at the row's draw, within the top-p set (HF's: the most likely tokens whose mass before them is
    under top_p); greedy is the argmax."""
    assert torch.equal(draws([7, 11, 9], 5, "cpu")[1], draws([11], 5, "cpu")[0])
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    u = torch.tensor([0.1, 0.6, 0.9, 0.999])
    assert pick(logits, Sampling(1.0, 1.0), u).tolist() == [0, 1, 2, 3]
    assert pick(logits, Sampling(1.0, 0.7), u).tolist() == [0, 0, 1, 1]  # {0, 1}, renormalised 0.625
    assert pick(logits, Sampling(1.0, 0.1), u).tolist() == [0, 0, 0, 0]
    assert pick(logits, None, None).tolist() == [0, 0, 0, 0]
    hot = pick(logits, Sampling(100.0, 1.0), torch.tensor([0.2, 0.4, 0.6, 0.8]))  # ~uniform
    assert hot.tolist() == [0, 1, 2, 3]
    mask, truncated = completion_mask(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8]]), [2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]] and truncated.tolist() == [False, True]
    # the rule: CUDA on a static cache, compiled where torch.compile runs; CPU and sharded weights not
    assert decode_settings("cpu", False, False, None, 96) == DecodeSettings()
    assert decode_settings("cuda", True, False, None, 96) == DecodeSettings()
    assert decode_settings("cuda", False, False, None, 96) == DecodeSettings(True, True, 96)
    assert decode_settings("cuda", False, True, None, 96) == DecodeSettings(True, False, 96)
    assert decode_settings("cuda", False, False, "no Triton", 96) == DecodeSettings(True, False, 96)


def test_one_prefill_a_group_gives_generate_s_completions(lm):
    """4 completions of each of 3 prompts, sampled and greedy, against ``generate`` on the 12
    repeated prompts; and on the static cache (CUDA's path) the same again, twice (reused)."""
    from transformers import LogitsProcessorList

    model, tok, ids, mask = lm
    group, sampling, stop, pad = 4, Sampling(0.9, 0.95), [tok.eos_token_id], tok.pad_token_id
    seeds = [1000 + i for i in range(3 * group)]
    drawn = LogitsProcessorList([_DrawnByRow(seeds, sampling, 24)])
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids.repeat_interleave(group, 0), attention_mask=mask.repeat_interleave(group, 0),
            max_new_tokens=24, do_sample=False, logits_processor=drawn, pad_token_id=pad, eos_token_id=stop,
            temperature=None, top_p=None, top_k=None,
        )[:, ids.size(1):]  # fmt: skip
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                                pad_token_id=pad, eos_token_id=stop)[:, ids.size(1):]  # fmt: skip
    args = {"max_new_tokens": 24, "pad_id": pad, "stop": stop}
    got = generate(model, ids, mask, group=group, sampling=sampling, seeds=seeds, **args)
    m, _ = completion_mask(ref, stop)
    assert torch.equal(got.ids, ref.masked_fill(m == 0, pad)) and torch.equal(got.mask, m)
    texts = tok.batch_decode(got.ids, skip_special_tokens=True)
    assert len(set(texts)) > 3, texts  # the completions of a group differ
    g = generate(model, ids, mask, **args)
    m, _ = completion_mask(greedy, stop)
    assert torch.equal(g.ids, greedy.masked_fill(m == 0, pad))
    static = DecodeSettings(static=True, max_length=64)
    for _ in range(2):
        again = generate(model, ids, mask, group=group, sampling=sampling, seeds=seeds, settings=static,
                         **args)  # fmt: skip
        assert torch.equal(again.ids, got.ids)


def _no_cache(model, ids, mask, steps: int, seeds, sampling, stop, pad):
    """The plainest loop: the whole context through the model at every step (no cache)."""
    done = torch.zeros(ids.size(0), dtype=torch.bool)
    u, out = draws(seeds, steps, "cpu"), []
    for t in range(steps):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        token = torch.where(done, torch.full((ids.size(0),), pad), pick(logits, sampling, u[:, t]))
        out.append(token)
        ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, (~done).long()[:, None]], 1)
        done = done | torch.isin(token, torch.tensor(stop))
    return torch.stack(out, 1), ids, mask


@pytest.mark.parametrize("static", [False, True])
def test_a_multi_turn_episode_equals_a_loop_without_cache(lm, static):
    """decode 6 tokens, append 'tool results' of different lengths (left-padded), decode 5 more,
    drop a row, decode 4 more: each turn's tokens and the whole context equal the no-cache loop's
    over the same context."""
    model, tok, ids, mask = lm
    stop, pad, s = [tok.eos_token_id], tok.pad_token_id, Sampling(1.0, 1.0)
    settings = DecodeSettings(static=True, max_length=80) if static else None
    d = Decoder(model, pad, stop, settings=settings)
    d.prefill(ids, mask, group=2)
    seeds = [[7 * turn + row for row in range(6)] for turn in range(3)]
    first = d.decode(6, s, seeds[0])
    ref, ctx, ctx_mask = _no_cache(
        model, ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), 6, seeds[0], s, stop, pad
    )
    assert torch.equal(first.ids, ref.masked_fill(first.mask == 0, pad))
    tool = [tok(f" result {'x' * r}")["input_ids"][1:] for r in range(6)]
    width = max(map(len, tool))
    tool_ids = torch.tensor([[pad] * (width - len(t)) + t for t in tool])
    tool_mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in tool])
    d.extend(tool_ids, tool_mask)
    second = d.decode(5, s, seeds[1])
    ctx, ctx_mask = torch.cat([ctx, tool_ids], 1), torch.cat([ctx_mask, tool_mask], 1)
    ref, ctx, ctx_mask = _no_cache(model, ctx, ctx_mask, 5, seeds[1], s, stop, pad)
    assert torch.equal(second.ids, ref.masked_fill(second.mask == 0, pad))
    rows = torch.tensor([0, 2, 3, 5])
    d.keep(rows)
    third = d.decode(4, s, [seeds[2][r] for r in rows.tolist()])
    kept = [seeds[2][r] for r in rows.tolist()]
    ref, ctx, ctx_mask = _no_cache(model, ctx[rows], ctx_mask[rows], 4, kept, s, stop, pad)
    assert torch.equal(third.ids, ref.masked_fill(third.mask == 0, pad))
    seen, seen_mask = d.sequence()
    # the no-cache loop appended every drawn token; the decoder holds the same context, the tokens
    # of a row after its stop token as holes (mask 0) in both
    assert torch.equal(seen_mask, ctx_mask) and torch.equal(seen * seen_mask, ctx * ctx_mask)
