"""GGUF's 4/5/6-bit types (xtrain/export/kquants.py): Q4_K, Q5_K and Q6_K written by xtrain in numpy
and read by the ``gguf`` package's own dequantizer (written apart from this writer: it is the
format's reader), each tensor's type in a q4_0 / q4_k_m / q5_k_m / q6_k file as llama.cpp's
``llama-quantize`` chooses it, and a K-quant export read back by transformers within its tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

from xtrain.export import kquants  # noqa: E402

K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def _round_trip(x: np.ndarray, qtype: str) -> np.ndarray:
    data = kquants.quantize(x, qtype)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert data.dtype == np.uint8 and data.shape == (*x.shape[:-1], x.shape[-1] // block * size)
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])


def _rel_rms(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(((y - x) ** 2).mean() / (x**2).mean()))


def test_block_sizes_are_the_formats():
    for name, (block, size) in kquants.SIZES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (block, size), name


@pytest.mark.parametrize("qtype", K_TYPES)
def test_values_on_the_formats_grid_come_back_exactly(qtype):
    """Levels times a step the file holds exactly (every sub-block using the whole range) come back
    exactly: the search must find that scale, and the packing must put each level back."""
    levels = {"Q4_K": np.arange(16), "Q5_K": np.arange(32), "Q6_K": np.arange(-32, 32)}[qtype]
    rng = np.random.default_rng(0)
    sub = 32 if qtype != "Q6_K" else 16
    x = rng.choice(levels, size=(4, 512)).astype(np.float32)
    x = x.reshape(-1, sub)
    x[:, 0], x[:, 1] = levels.min(), levels.max()  # each sub-block spans the levels
    # a step whose 6-bit scale (d x 63; Q6_K: d x -128) is exact in the block's f16 d
    x = x.reshape(4, 512) * np.float32(2**-6 if qtype == "Q6_K" else 63 * 2**-12)
    np.testing.assert_array_equal(_round_trip(x, qtype), x)


@pytest.mark.parametrize("qtype", K_TYPES)
def test_round_trip_within_the_formats_step(qtype):
    """Gaussian and shifted uniform weights: every value within 1.5 steps of its sub-block's range
    (a perfect rounding is half a step; the scales and mins, rounded to 6 or 8 bits against the
    super-block's largest, add up to one more: measured 0.6-1.3); all-zero, constant and one-signed
    blocks too."""
    rng = np.random.default_rng(1)
    sub, nmax = (16, 63) if qtype == "Q6_K" else (32, 15 if qtype == "Q4_K" else 31)
    for x in (
        rng.standard_normal((64, 512)).astype(np.float32) * 0.02,
        rng.uniform(-1, 3, (64, 512)).astype(np.float32),
    ):
        x[0, :256] = 0  # an all-zero super-block
        x[1, :256] = 0.25  # a constant one
        x[2] = np.abs(x[2])  # only positive values
        x[3] = -np.abs(x[3])  # only negative ones
        y = _round_trip(x, qtype)
        assert np.isfinite(y).all()
        assert np.array_equal(y[0, :256], np.zeros(256, dtype=np.float32))
        np.testing.assert_allclose(y[1, :256], 0.25, rtol=2e-3)
        s = x.reshape(-1, sub)
        span = s.max(1) - np.minimum(s.min(1), 0) if qtype != "Q6_K" else 2 * np.abs(s).max(1)
        error = np.abs(y - x).reshape(-1, sub).max(1)
        assert (error <= 1.5 * span / nmax).all()


def _q4_k_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q4_K_ref + dequantize_row_q4_K, value by value in float32 as the C
    reads (make_qkx2_quants with its running min; ties to even), for checking the vectorized one."""
    f = np.float32

    def qkx2(v: np.ndarray, w: np.ndarray) -> tuple[float, float, list[int]]:
        lo, hi = min(f(0), v.min()), v.max()
        sum_w, sum_x = f(0), f(0)
        for a, b in zip(v, w, strict=True):
            sum_w, sum_x = f(sum_w + b), f(sum_x + b * a)
        if hi == lo:
            return f(0), -lo, [0] * 32
        iscale = f(15) / (hi - lo)
        scale = f(1) / iscale
        levels = [int(min(15, max(0, np.rint(iscale * (a - lo))))) for a in v]
        best = f(0)
        for a, b, q in zip(v, w, levels, strict=True):
            best = f(best + b * (scale * q + lo - a) ** 2)
        for step in range(21):
            iscale = f(f(-1) + f(0.1) * step + f(15)) / (hi - lo)
            aux = [int(min(15, max(0, np.rint(iscale * (a - lo))))) for a in v]
            sl = sl2 = sxl = f(0)
            for a, b, q in zip(v, w, aux, strict=True):
                sl, sl2, sxl = f(sl + b * q), f(sl2 + b * q * q), f(sxl + b * q * a)
            det = f(sum_w * sl2 - sl * sl)
            if det > 0:
                this_scale, this_min = f((sum_w * sxl - sum_x * sl) / det), f((sl2 * sum_x - sl * sxl) / det)
                if this_min > 0:
                    this_scale, this_min = f(sxl / sl2), f(0)
                error = f(0)
                for a, b, q in zip(v, w, aux, strict=True):
                    error = f(error + b * (this_scale * q + this_min - a) ** 2)
                if error < best:
                    levels, best, scale, lo = aux, error, this_scale, this_min
        return scale, -lo, levels

    out = []
    for block in x.reshape(-1, 256):
        subs = block.reshape(8, 32)
        found = [qkx2(v, np.sqrt((v * v).sum() / f(32)) + np.abs(v)) for v in subs]
        scales, mins = np.array([s for s, _, _ in found], f), np.array([m for _, m, _ in found], f)
        ms, mm = max(f(0), scales.max()), max(f(0), mins.max())
        ls = np.minimum(63, np.rint((f(63) / ms if ms > 0 else f(0)) * scales))
        lm = np.minimum(63, np.rint((f(63) / mm if mm > 0 else f(0)) * mins))
        d, dmin = f(np.float16(ms / f(63))), f(np.float16(mm / f(63)))
        for v, (_, _, levels), a, b in zip(subs, found, ls, lm, strict=True):
            step, shift = d * a, dmin * b
            if step:
                levels = np.clip(np.rint((v + shift) / step), 0, 15)
            out.append(step * np.asarray(levels, f) - shift)
    return np.concatenate(out).reshape(x.shape)


def _q6_k_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q6_K_ref (make_qx_quants, rmse_type 1) + dequantize_row_q6_K."""
    f = np.float32

    def qx(v: np.ndarray) -> tuple[float, list[int]]:
        peak = v[np.abs(v).argmax()]
        if abs(peak) < 1e-15:
            return f(0), [-32] * 16

        def fit(iscale: np.float32) -> tuple[list[int], np.float32, np.float32]:
            levels = [int(min(31, max(-32, np.rint(iscale * a)))) for a in v]
            lx = l2 = f(0)
            for a, q in zip(v, levels, strict=True):
                lx, l2 = f(lx + a * a * a * q), f(l2 + a * a * q * q)
            return levels, lx, l2

        levels, lx, l2 = fit(f(-32) / peak)
        scale = f(lx / l2) if l2 else f(0)
        best = f(scale * lx)
        for step in (*range(-9, 0), *range(1, 10)):
            aux, lx, l2 = fit(-f(f(32) + f(0.1) * step) / peak)
            if l2 > 0 and lx * lx > best * l2:
                levels, scale = aux, f(lx / l2)
                best = f(scale * lx)
        return scale, levels

    out = []
    for block in x.reshape(-1, 256):
        subs = block.reshape(16, 16)
        found = [qx(v) for v in subs]
        scales = np.array([s for s, _ in found], f)
        top = scales[np.abs(scales).argmax()]
        if abs(top) < 1e-15:
            out.append(np.zeros(256, f))
            continue
        iscale = f(-128) / top
        d = f(np.float16(f(1) / iscale))
        for v, (_, levels), sc in zip(subs, found, np.minimum(127, np.rint(iscale * scales)), strict=True):
            step = d * f(sc)
            if step:
                levels = np.clip(np.rint(v / step), -32, 31)
            out.append(step * np.asarray(levels, f))
    return np.concatenate(out).reshape(x.shape)


def test_q4_k_and_q6_k_follow_llama_cpps_reference_value_by_value():
    """The vectorized Q4_K and Q6_K against value-by-value transcriptions of llama.cpp's reference: the
    same scales, mins and levels (identical on these values; numpy sums in another order than the
    C, which may flip a rare tie: at least 99.5% identical, the rest within one level)."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(1024) * 0.02, rng.uniform(-0.5, 2, 1024)]).astype(np.float32)
    x = x.reshape(8, 256)
    got, want = _round_trip(x, "Q4_K"), _q4_k_reference(x)
    assert (got == want).mean() >= 0.995
    np.testing.assert_allclose(got, want, rtol=0, atol=float(np.abs(x).max()) / 15 * 1.01)
    got, want = _round_trip(x, "Q6_K"), _q6_k_reference(x)
    assert (got == want).mean() >= 0.995
    np.testing.assert_allclose(got, want, rtol=0, atol=float(np.abs(x).max()) / 31 * 1.01)


def test_k_quants_beat_the_plain_types_of_their_width():
    """The searched scales and mins of Q4_K/Q5_K fit Gaussian weights better than the gguf
    package's min-max Q4_1/Q5_1 of the same width, and each K type is finer than the one below."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((128, 1024)).astype(np.float32) * 0.02

    def plain(name: str) -> float:
        t = gguf.GGMLQuantizationType[name]
        return _rel_rms(x, gguf.quants.dequantize(gguf.quants.quantize(x, t), t))

    q4, q5, q6 = (_rel_rms(x, _round_trip(x, t)) for t in K_TYPES)
    assert q4 < plain("Q4_1") and q5 < plain("Q5_1")
    assert plain("Q8_0") < q6 < q5 < q4 < 0.08


def test_a_misplaced_bit_fails_the_written_tensors_check():
    """The export's ``file`` check: the values the format's reader (gguf's dequantizer) gives back
    must be, exactly, the ones xtrain's quantizer computed; two levels swapped differ, where the
    rms error against the weights would hardly move."""
    from xtrain.export.gguf import Written, digest
    from xtrain.export.parity import ParityError, written

    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 512)).astype(np.float32) * 0.02
    for t in (*K_TYPES, "Q4_0", "Q8_0"):
        packed, meant = kquants.quantize_meant(x, t)
        assert kquants.read_back(x, packed, t, meant)[1] is None and (meant is None) == (t not in K_TYPES)
    packed, meant = kquants.quantize_meant(x, "Q4_K")
    wrong = packed.reshape(-1, 144).copy()
    wrong[1, 20] = (wrong[1, 20] >> 4) | ((wrong[1, 20] & 0xF) << 4)  # two 4-bit levels swapped
    error, at = kquants.read_back(x, wrong.reshape(16, -1), "Q4_K", meant)
    assert at is not None and error < 0.1
    name, shape = "blk.0.ffn_up.weight", (16, 512)
    found = {name: ("Q4_K", shape, digest(wrong))}
    with pytest.raises(ParityError, match=r"blk\.0\.ffn_up\.weight \(Q4_K\) reads back unlike xtrain's"):
        written([Written(name, "Q4_K", shape, digest(wrong), error, at)], found, "model.gguf")
    # the file holding other bytes than xtrain wrote: named too
    with pytest.raises(ParityError, match=r"blk\.0\.ffn_up\.weight reads back as other bytes"):
        written([Written(name, "Q4_K", shape, digest(packed), 0.07)], found, "model.gguf")
    checks = written([Written(name, "Q4_K", shape, digest(wrong), 0.07)], found, "model.gguf")
    assert [c.name for c in checks] == ["file", "quantized"] and "Q4_K 7.0e-02" in checks[1].detail


# -- the type of each tensor ---------------------------------------------------------------------


def _names(layers: int, tied: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    out = [("token_embd.weight", (32000, 4096))]
    for i in range(layers):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            out.append((f"blk.{i}.{part}.weight", (4096, 4096)))
        out += [(f"blk.{i}.ffn_down.weight", (4096, 11008)), (f"blk.{i}.attn_norm.weight", (4096,))]
    return out + ([] if tied else [("output.weight", (32000, 4096))])


def _types(kind: str, layers: int = 32, tied: bool = False) -> dict[str, str]:
    return {n: kquants.choose_type(n, s, kind, layers, tied) for n, s in _names(layers, tied)}


def test_q4_k_m_gives_the_head_and_half_the_v_and_down_layers_q6_k():
    """A Llama-2-7B shape: llama.cpp's Q4_K_M puts output in Q6_K and attn_v / ffn_down in Q6_K in
    the layers ``use_more_bits`` picks (the first 4, the last 4, every third between: 16 of 32)."""
    types = _types("q4_k_m")
    more = [i for i in range(32) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert more == [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert {types[f"blk.{i}.{p}.weight"] for i in range(32) for p in ("attn_q", "ffn_up")} == {"Q4_K"}
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert {t for n, t in types.items() if "attn_v" in n} == {"Q4_K", "Q6_K"}
    # tied embeddings: the token embedding is the head
    assert _types("q4_k_m", tied=True)["token_embd.weight"] == "Q6_K"
    q5 = _types("q5_k_m")
    assert (q5["blk.5.attn_v.weight"], q5["blk.6.attn_v.weight"]) == ("Q5_K", "Q6_K")


def test_q4_0_and_q6_k_and_the_16_bit_types():
    q4_0 = _types("q4_0")
    assert q4_0["output.weight"] == "Q6_K"  # llama-quantize keeps the head in Q6_K in a Q4_0 file
    assert {t for n, t in q4_0.items() if n != "output.weight" and not n.endswith("norm.weight")} == {"Q4_0"}
    assert {t for n, t in _types("q6_k").items() if not n.endswith("norm.weight")} == {"Q6_K"}
    assert set(_types("f16").values()) == {"F16", "F32"}
    assert _types("q8_0")["output.weight"] == "Q8_0"


@pytest.mark.parametrize(
    ("kind", "name", "width", "expected"),
    [
        ("q4_k_m", "blk.0.attn_q.weight", 576, "Q5_0"),  # SmolLM2-135M's width: not a multiple of 256
        ("q4_k_m", "blk.1.attn_v.weight", 576, "Q8_0"),  # Q6_K (last layer) -> Q8_0
        ("q5_k_m", "blk.1.attn_q.weight", 576, "Q5_1"),
        ("q4_k_m", "output.weight", 576, "Q8_0"),
        ("q4_k_m", "blk.0.attn_q.weight", 100, "F16"),  # not even a multiple of 32
        ("q4_0", "blk.0.attn_q.weight", 100, "F16"),
        ("q4_0", "output.weight", 576, "Q8_0"),  # Q6_K -> Q8_0
    ],
)
def test_rows_too_narrow_for_the_block_fall_back_as_llama_cpp(kind, name, width, expected):
    assert kquants.choose_type(name, (64, width), kind, 2, False) == expected


# -- a K-quant export, read back -------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A chat model 256 wide (every matrix in its K type), built from a config: a full model folder."""
    import torch
    from test_export import CHATML
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from xtrain import builtin

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"  # test_export's
    tokenizer = AutoTokenizer.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-llama", cache))
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wide") / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "xtrain_run.json").write_text(json.dumps({"task": "causal-lm", "chat": True, "data": {}}))
    return folder


def test_a_q4_k_m_export_holds_llama_cpps_mix_and_reads_back(wide_model, tmp_path):
    from xtrain.export.pipeline import ExportRequest, export

    result = export(ExportRequest(str(wide_model), "gguf", tmp_path / "g", gguf_type="q4_k_m"))
    assert [c.name for c in result.checks] == ["file", "quantized", "template"]
    assert "Q4_K" in result.checks[1].detail and "Q6_K" in result.checks[1].detail
    assert result.costs[0].logits < 0.8  # read back by transformers: measured 0.36 (docs/export.md#types)
    reader = gguf.GGUFReader(str(tmp_path / "g" / "model-q4_k_m.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    # 2 layers: use_more_bits picks the last (7 * 2 // 8 = 1)
    assert (types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]) == ("Q4_K", "Q6_K")
    assert (types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]) == ("Q4_K", "Q6_K")
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["blk.0.attn_norm.weight"] == "F32"
    field = reader.fields["general.file_type"]
    assert int(field.parts[field.data[0]][0]) == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    size = result.files["model-q4_k_m.gguf"]
    params = sum(np.prod(t.shape) for t in reader.tensors)
    assert size < params * 0.7  # about 4.5-6.6 bits a weight, not 16
