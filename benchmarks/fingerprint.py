"""Start-up cost of the tokenizer fingerprint (the datasets cache key of the tokenized data),
which every training start and every resume pays once.

Compares ``xtrain.data.tokenize.tokenizer_fingerprint`` (sha256 of the tokenizer's canonical JSON)
with the earlier implementation (``datasets.fingerprint.Hasher`` over the parsed JSON, kept here
as ``hasher_fingerprint``) on byte-level BPE tokenizers of growing vocabularies, built in-process
(no download): 1k (xtrain's built-in), 32k (Llama-2-sized) and 128k (Llama-3-sized).

    python benchmarks/fingerprint.py [--repeats 10] [--json]

Each figure is the best of ``--repeats`` calls (interleaved before/after), timed in a fresh
process that has imported torch, transformers, datasets, accelerate and peft first, as a
training process has when it fingerprints.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, bench_env, emit, machine, run_json  # noqa: E402

SIZES = (32_000, 128_000)  # synthetic vocabularies (besides the built-in 1k)


def hasher_fingerprint(tokenizer: Any) -> str:
    """The implementation before: datasets' Hasher over the parsed tokenizer JSON."""
    from datasets.fingerprint import Hasher

    body: Any = json.loads(tokenizer.backend_tokenizer.to_str())
    body.pop("truncation", None)
    body.pop("padding", None)
    specials = sorted((str(k), str(v)) for k, v in tokenizer.special_tokens_map.items())
    return Hasher.hash([type(tokenizer).__name__, body, specials, getattr(tokenizer, "add_bos_token", None)])


def synthetic_bpe(vocab_size: int, seed: int = 0) -> Any:
    """A byte-level BPE tokenizer with ``vocab_size`` tokens and as many merges (random merges of
    existing tokens: the size of a real vocabulary, without training one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(sorted(alphabet) + ["<pad>", "<unk>"])}
    tokens = sorted(alphabet)
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size:
        a, b = rng.choice(tokens), rng.choice(tokens)
        if len(a) + len(b) > 12 or a + b in vocab:
            continue
        vocab[a + b] = len(vocab)
        tokens.append(a + b)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


def measure(repeats: int = 10, log: Any = None, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Runs the timings in a fresh worker process (see ``timings``)."""
    cmd = [PYTHON, str(Path(__file__).resolve()), "--worker", "--repeats", str(repeats)]
    result = run_json([*cmd, "--sizes", ",".join(str(n) for n in sizes)], bench_env(1))
    if log:
        for name, r in result["rows"].items():
            log(f"fingerprint {name}: Hasher {r['hasher_s']:.3f} s, current {r['current_s']:.3f} s")
    return result


def timings(repeats: int, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """In a process that has imported what a training process has (torch, transformers,
    datasets, accelerate, peft) when it fingerprints: a big heap makes the garbage collector's
    passes during JSON parsing cost more, as they do in a real start."""
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from xtrain.builtin import build_tokenizer
    from xtrain.data.tokenize import tokenizer_fingerprint

    hasher_fingerprint(build_tokenizer("llama"))  # imports out of the timings
    tokenizers = {"1k (built-in)": build_tokenizer("llama")}
    for n in sizes:
        tokenizers[f"{n // 1000}k"] = synthetic_bpe(n)
    rows = {}
    for name, tok in tokenizers.items():
        before, after = [], []
        for _ in range(repeats):  # interleaved
            t0 = time.perf_counter()
            hasher_fingerprint(tok)
            t1 = time.perf_counter()
            tokenizer_fingerprint(tok)
            after.append(time.perf_counter() - t1)
            before.append(t1 - t0)
        # best of N: the function is deterministic, so the fastest call is the least disturbed one
        rows[name] = {"vocab": len(tok), "hasher_s": min(before), "current_s": min(after)}
    return {"repeats": repeats, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(str(n) for n in SIZES), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        emit(timings(a.repeats, tuple(int(n) for n in a.sizes.split(",") if n)))
        return
    result = measure(a.repeats)
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for name, r in result["rows"].items():
        print(f"{name:14} vocab {r['vocab']:>7}: Hasher {r['hasher_s']:.3f} s, "
              f"current {r['current_s']:.3f} s ({r['hasher_s'] / r['current_s']:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
