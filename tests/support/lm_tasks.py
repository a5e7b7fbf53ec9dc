"""lm-eval tasks the tests write from local JSON lines (offline): one generate_until scored by
exact match and one multiple_choice scored by acc, on the built-in chat questions; and the chat LoRA
that tests/test_evaluate.py and tests/gpu/test_evaluate_gpu.py score with them."""

from __future__ import annotations

import random
from pathlib import Path

from support.gradients import jsonl

LIMIT = 8
GEN, MC = "qa_gen", "qa_mc"
GEN_YAML = """task: qa_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 10
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
"""
MC_YAML = """task: qa_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_tasks(folder: Path) -> Path:
    """``qa_gen.yaml`` and ``qa_mc.yaml`` with their data in ``folder`` (16 questions, seed 77)."""
    from xtrain.builtin import chat as builtin_chat

    pairs = [
        (r["messages"][0]["content"], r["messages"][1]["content"]) for r in builtin_chat.chat_examples(16, 77)
    ]
    answers = sorted({a for _, a in pairs})
    rng = random.Random(0)
    mc = []
    for q, a in pairs:
        choices = [*rng.sample([x for x in answers if x != a], 2), a]
        rng.shuffle(choices)
        mc.append({"question": q, "choices": choices, "label": choices.index(a)})
    gen = jsonl(folder / "qa.jsonl", [{"question": q, "answer": a} for q, a in pairs])
    choice = jsonl(folder / "qa_mc.jsonl", mc)
    (folder / "qa_gen.yaml").write_text(GEN_YAML.format(data=gen.as_posix()), encoding="utf-8")
    (folder / "qa_mc.yaml").write_text(MC_YAML.format(data=choice.as_posix()), encoding="utf-8")
    return folder


def sft_overrides(tmp_path_factory, tasks: Path) -> list[str]:  # noqa: ANN001
    """A chat LoRA on the built-in tiny chat llama (4 steps), its benchmarks scored at its end, its
    start too (``eval.at_start``)."""
    from support.gradients import jsonl
    from xtrain.builtin import chat as builtin_chat

    data = jsonl(tmp_path_factory.mktemp("chat-data") / "train.jsonl", builtin_chat.chat_examples(64, 5))
    return ["model.name_or_path=builtin:tiny-llama-chat", f"data.train={data}", "data.eval=null",
            "data.max_length=48", "lora.r=16", "lora.alpha=32", "lora.target_modules=all-linear",
            "optim.lr=1e-2", "batch.per_device=16", "run.max_steps=4", "run.log_every=4",
            f"eval.benchmarks={tasks}", f"eval.limit={LIMIT}", "eval.at_start=true"]  # fmt: skip
