"""The chunked cross-entropy (xtrain/model/chunked_loss.py) is the model's own loss: the same value
and the same gradients as the plain forward's ``.loss`` to float32 tolerance, for a frozen head, a
head trained whole (peft's modules_to_save), a LoRA-adapted head, Gemma 2's soft-capped logits and
an encoder-decoder's decoder; evaluation and generation see the model untouched. The built-in tasks
through the real loop: tests/test_gradients.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from xtrain.model import chunked_loss
from xtrain.model.chunked_loss import ChunkedLoss, LogitMap, chunked_cross_entropy, logit_map
from xtrain.model.memory import MIN_CHUNK_ROWS

VOCAB = 97


def _llama(**more):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         **more)  # fmt: skip
    return LlamaForCausalLM(config)


def _adapted(model, head: str):
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "v_proj"] + (["lm_head"] if head == "lora" else [])
    save = ["lm_head"] if head == "whole" else None
    # gaussian: lora_B is not zero, so the adapters pass a gradient back through themselves
    config = LoraConfig(r=4, target_modules=targets, modules_to_save=save, lora_dropout=0.0,
                        init_lora_weights="gaussian")  # fmt: skip
    return get_peft_model(model, config)


def _batch(rows: int = 2, length: int = 24):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    labels = ids.clone()
    labels[:, : length // 2] = -100  # a masked prompt
    labels[-1, length - 3 :] = -100  # and padding
    return ids, labels


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name, want in a.items():
        torch.testing.assert_close(b[name], want, rtol=1e-5, atol=1e-6 * float(want.abs().max()) + 1e-9)


@pytest.mark.parametrize("how", chunked_loss.HOWS)
@pytest.mark.parametrize("head", ["frozen", "whole", "lora"])
def test_a_causal_lms_loss_and_gradients_equal_the_plain_loss(head, how):
    ids, labels = _batch()
    plain, chunked = _adapted(_llama(), head), _adapted(_llama(), head)
    plain.train(), chunked.train()
    want = plain(input_ids=ids, labels=labels).loss
    want.backward()
    hooks = ChunkedLoss(chunked, "next-token", LogitMap(), rows=5, how=how).attach()
    out = chunked(input_ids=ids, labels=labels)
    assert out.logits.shape[-1] == 0  # no logits were made
    out.loss.backward()
    torch.testing.assert_close(out.loss, want, rtol=1e-6, atol=0)
    trained = _grads(plain)
    assert any("lm_head" in n for n in trained) == (head != "frozen")
    _assert_same(trained, _grads(chunked))
    chunked.eval()
    with torch.no_grad():  # evaluation: the model as it is, logits and its own loss
        seen = chunked(input_ids=ids, labels=labels)
    assert seen.logits.shape == (*ids.shape, VOCAB)
    hooks.detach()
    chunked.train()
    assert chunked(input_ids=ids, labels=labels).logits.shape[-1] == VOCAB  # detached: plain again


@pytest.mark.parametrize("how", chunked_loss.HOWS)
def test_the_head_module_runs_once_and_its_output_gets_the_gradient_first(how):
    """What hooks the head's module sees is one call, as under the plain loss: FSDP2 hooks it
    (accelerate's group of final norm and head) and registers its pre-backward all-gather on the
    head's output. Called once a chunk, the group's post-forward fired on a chunk's logits, the
    eager chunk's backward inside the forward fired the pre-backward and its end-of-backward
    callback resharded the group: a full fine-tune under FSDP2 crashed (SIGSEGV). The output's
    gradient comes before any gradient of the head's or the final norm's weights."""
    model = _llama()
    model.train()
    ids, labels = _batch()
    events: list[str] = []

    def on_forward(module, args, out):
        events.append("forward")
        out.register_hook(lambda grad: events.append("output gradient"))

    model.lm_head.register_forward_hook(on_forward)
    model.lm_head.weight.register_post_accumulate_grad_hook(lambda p: events.append("head"))
    model.model.norm.weight.register_post_accumulate_grad_hook(lambda p: events.append("norm"))
    ChunkedLoss(model, "next-token", LogitMap(), rows=5, how=how).attach()  # 19 positions: 4 chunks
    loss = model(input_ids=ids, labels=labels).loss
    assert events == ["forward"]
    loss.backward()
    assert events[:2] == ["forward", "output gradient"] and sorted(events[2:]) == ["head", "norm"], events


def test_gemma2_soft_capped_logits_are_honoured():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          final_logit_softcapping=2.0)  # fmt: skip
    mapping = logit_map(config)
    assert mapping == LogitMap(softcap=2.0)
    ids, labels = _batch()
    torch.manual_seed(0)
    plain = Gemma2ForCausalLM(config)
    chunked = Gemma2ForCausalLM(config)
    chunked.load_state_dict(plain.state_dict())
    want = plain(input_ids=ids, labels=labels).loss
    want.backward()
    ChunkedLoss(chunked, "next-token", mapping, rows=7).attach()
    got = chunked(input_ids=ids, labels=labels).loss
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    _assert_same(_grads(plain), _grads(chunked))


def test_an_encoder_decoders_decoder_inputs_come_from_its_labels():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=16,
                           max_target_positions=32, pad_token_id=0, decoder_start_token_id=1,
                           suppress_tokens=[], begin_suppress_tokens=[])  # fmt: skip
    torch.manual_seed(0)
    plain = WhisperForConditionalGeneration(config)
    chunked = WhisperForConditionalGeneration(config)
    chunked.load_state_dict(plain.state_dict())
    features = torch.randn(2, 8, 32)
    _, labels = _batch(2, 10)
    want = plain(input_features=features, labels=labels).loss
    want.backward()
    ChunkedLoss(chunked, "decoder", logit_map(config), rows=4).attach()
    got = chunked(input_features=features, labels=labels).loss
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    _assert_same(_grads(plain), _grads(chunked))


def test_model_configs_it_cannot_reproduce_are_named():
    from transformers import CohereConfig, GraniteConfig, MixtralConfig

    assert logit_map(CohereConfig(logit_scale=0.25)) == LogitMap(scale=0.25)
    assert logit_map(GraniteConfig(logits_scaling=4.0)) == LogitMap(scale=0.25)
    why = logit_map(MixtralConfig(output_router_logits=True))
    assert isinstance(why, str) and "output_router_logits" in why


def test_the_chunks_follow_the_vocabulary():
    assert chunked_loss.chunk_rows(152_064) == 220  # 128 MiB of float32 logits a chunk
    assert chunked_loss.chunk_rows(32_000) == 1048
    assert chunked_loss.chunk_rows(10**9) == MIN_CHUNK_ROWS


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 3),
    length=st.integers(1, 9),
    chunk=st.integers(1, 12),
    shift=st.booleans(),
    how=st.sampled_from(chunked_loss.HOWS),
    mask=st.lists(st.booleans(), min_size=27, max_size=27),
)
def test_any_label_mask_gives_the_mean_cross_entropy(rows, length, chunk, shift, how, mask):
    """Whatever positions carry a label (none: NaN, as the plain mean), any chunk size."""
    g = torch.Generator().manual_seed(rows * 100 + length)
    head = torch.nn.Linear(6, 11)
    hidden = torch.randn(rows, length, 6, generator=g, requires_grad=True)
    labels = torch.randint(0, 11, (rows, length), generator=g)
    labels[torch.tensor(mask[: rows * length]).view(rows, length)] = -100
    logits, target = head(hidden), labels
    if shift:
        logits, target = logits[:, :-1], labels[:, 1:]
    want = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=-100)
    got = chunked_cross_entropy(head, hidden, labels, shift=shift, rows=chunk, how=how)
    if math.isnan(float(want.detach())):
        assert math.isnan(float(got))
        return
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want_grad = torch.autograd.grad(want, [hidden, head.weight])
    got_grad = torch.autograd.grad(got, [hidden, head.weight])
    for w, h in zip(want_grad, got_grad, strict=True):
        torch.testing.assert_close(h, w, rtol=1e-5, atol=1e-6)
