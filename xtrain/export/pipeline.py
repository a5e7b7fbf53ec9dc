"""``export``: the steps of ``xtrain export`` in order, each refusal before anything heavy loads.

1. what is exported (``source.find_source``), the family and the tokenizer for a GGUF, the RAM
   the export needs against what the machine has (``memory``; all refused in one line before
   any weight loads), the chat template and, for Ollama, its turns;
2. the merged model: a fresh base on the CPU + the adapter (``model/merge.py``, the path
   ``run.save_merged`` takes), base + adapter's logits on the probe prompts first, then merged
   and compared (a full fine-tune's folder loads as it is);
3. the disk checked for what will be written; everything is written into ``OUTPUT.tmp`` and
   renamed to ``OUTPUT`` at the end: a failed check leaves nothing behind, and an existing
   ``OUTPUT`` is never touched;
4. merged safetensors (+ the tokenizer/processor files, chat template and run record saved
   with the result), and/or a GGUF file for each ``--type``; the run's eval prompts answered by
   the merged model; then the merged model freed (one model in memory at a time) and each file
   checked and measured (``file_checks``: read back exactly as written, its template in llama.cpp,
   its logits and answers against the merged model's), and the Modelfile.

Several targets in one call (``targets``) and several GGUF types (``types``) share steps 1-3:
one merge, one check of it, one GGUF per type for ``gguf`` and ``ollama`` (the Ollama folder is
the GGUF + its Modelfile: one type); the merged folder goes to ``OUTPUT/merged/`` when a GGUF is
written beside it.

Library code: progress goes through the ``Progress`` callbacks; nothing is printed.
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import atomic
from xtrain.data.rows import chat as chat_data
from xtrain.errors import XtrainError
from xtrain.export import answers, families, file_checks, gguf, memory, ollama, parity, source, templates
from xtrain.export.gguf import TYPES
from xtrain.export.parity import Check
from xtrain.export.vocab import read_vocab
from xtrain.model import load as models
from xtrain.model import merge

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TARGETS = ("merged", "gguf", "ollama")
MERGED_BESIDE_GGUF = "merged"  # the merged folder's name inside OUTPUT when a GGUF is written too


def targets(to: str | Sequence[str]) -> tuple[str, ...]:
    """What ``--to`` asks for (one target, a comma list, or several ``--to``), in the order they are
    written; ``gguf`` is left out beside ``ollama``, whose folder holds the same GGUF file."""
    found: list[str] = []
    for part in [to] if isinstance(to, str) else list(to):
        for one in (p.strip() for p in part.split(",")):
            if one not in TARGETS:
                raise XtrainError(f"--to {one}: not an export target", f"use one of {', '.join(TARGETS)}")
            found.append(one)
    if not found:
        raise XtrainError("--to: no export target given", f"use one of {', '.join(TARGETS)}")
    if "ollama" in found:
        found = [t for t in found if t != "gguf"]
    return tuple(t for t in TARGETS if t in found)


def types(given: str | Sequence[str]) -> tuple[str, ...]:
    """The GGUF types ``--type`` asks for (one, a comma list, or several ``--type``), each once, in
    the order given; an unknown one is refused in one line."""
    found: list[str] = []
    for part in [given] if isinstance(given, str) else list(given):
        for one in (p.strip() for p in part.split(",")):
            if one not in TYPES:
                raise XtrainError(f"--type {one}: not a GGUF type", f"use one or more of {', '.join(TYPES)}")
            if one not in found:
                found.append(one)
    if not found:
        raise XtrainError("--type: no GGUF type given", f"use one or more of {', '.join(TYPES)}")
    return tuple(found)


@dataclass
class ExportRequest:
    path: str
    to: str | Sequence[str]  # merged | gguf | ollama, or several ("merged,ollama", ["merged", "gguf"])
    output: Path
    base: str | None = None
    # gguf.TYPES: f16 | bf16 | q8_0 | q4_0 | q4_k_m | q5_k_m | q6_k, or several ("q8_0,q4_k_m", [...])
    gguf_type: str | Sequence[str] = "q8_0"
    name: str | None = None  # the Ollama model's name
    system: str | None = None  # the Modelfile's system prompt
    eval_prompts: int = answers.ANSWERED  # the run's eval prompts answered by the merged model and each file

    @property
    def targets(self) -> tuple[str, ...]:
        return targets(self.to)

    @property
    def types(self) -> tuple[str, ...]:
        return types(self.gguf_type)

    @property
    def writes_gguf(self) -> bool:
        return any(t in ("gguf", "ollama") for t in self.targets)


@dataclass
class ExportResult:
    output: Path
    files: dict[str, int]  # file path inside output ("merged/config.json") -> bytes
    checks: list[Check]
    ollama: dict[str, str] | None = None  # shell -> ollama create line
    notes: list[str] = field(default_factory=list)
    costs: list[parity.Cost] = field(default_factory=list)  # what each GGUF type costs the model
    warnings: list[str] = field(default_factory=list)
    prompts: answers.Prompts | None = None  # eval prompts answered by the merged model and each file


class Progress:
    """What the CLI shows: a stage starts, a long one advances (bytes or steps). No-ops here."""

    def stage(self, text: str) -> None:
        pass

    def advance(self, done: int, total: int) -> None:
        pass


def _check_request(req: ExportRequest) -> None:

    targets(req.to)  # an unknown target is refused here
    types(req.gguf_type)  # and an unknown type
    if len(req.types) > 1 and "ollama" in req.targets:
        raise XtrainError(
            f"--to ollama writes one model and --type names {len(req.types)} ({', '.join(req.types)})",
            "pass one --type for ollama, or --to gguf for a file of each type",
        )
    if req.output.exists() and (not req.output.is_dir() or any(req.output.iterdir())):
        raise XtrainError(
            f"{req.output} already exists and is not empty: export writes a new folder",
            "pass --output with a folder name that does not exist yet",
        )


@dataclass
class _Plan:
    """What step 1 found: the source, its tokenizer and template, Ollama's turns."""

    src: source.Source
    tokenizer: PreTrainedTokenizerBase
    template: str | None
    render: chat_data.Render | None  # the training renderer, None for a plain run
    turns: ollama.OllamaTurns | None = None
    eot: int | None = None
    chat_bos: bool | None = None  # a chat run's: whether its template writes the bos token first
    add_bos: bool = False  # the GGUF adds bos to what it tokenizes (``vocab.read_vocab``)
    context: int = 2048  # the model's positions


def prepare(req: ExportRequest) -> _Plan:
    """Step 1: every refusal that needs no weights."""

    _check_request(req)
    src = source.find_source(req.path, req.base)
    tokenizer = source.load_tokenizer(src)
    template = source.chat_template(src, tokenizer)
    kwargs = (src.record.get("data") or {}).get("chat_template_kwargs")  # as training rendered
    kwargs = kwargs if isinstance(kwargs, dict) else None
    render = chat_data.renderer(tokenizer, template, None, kwargs) if template else None
    plan = _Plan(src, tokenizer, template, render)

    config = models.load_config(src.load_from(), False)
    if not req.writes_gguf:
        memory.check_memory(memory.model_sizes(src.model_class, config), memory.available_bytes())
        return plan

    if source.is_classifier(src):
        raise XtrainError(
            f"{src.folder} is a {src.task or 'sequence classifier'} result: a classifier has no GGUF or "
            "Ollama form (llama.cpp runs it as a language model)",
            "export it with --to merged: transformers' AutoModelForSequenceClassification loads it",
        )
    gguf.require_gguf()
    families.family_of(config)
    families.rope_scaling(config, families.family_of(config))
    memory.check_memory(memory.model_sizes(src.model_class, config), memory.available_bytes())
    plan.eot = _end_of_turn(render, tokenizer)
    plan.context = int(getattr(config, "max_position_embeddings", None) or plan.context)
    if render is not None:
        bos = tokenizer.bos_token
        plan.chat_bos = bool(bos) and render(list(parity.PROBES[0]), True).startswith(bos)
    vocab = read_vocab(tokenizer, int(config.vocab_size), plan.eot, plan.chat_bos)
    plan.add_bos = vocab.add_bos
    if "ollama" in req.targets:
        plan.turns = _ollama_turns(req, plan, vocab.add_bos)
    return plan


def _end_of_turn(render: chat_data.Render, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The template's end-of-turn token when it is one whole special token (``<|im_end|>``): llama.cpp
    ends generation there. A template whose turn end is ordinary text gets none (stopping at its
    first piece, say ``<``, would cut answers short)."""
    if render is None:
        return None
    found = chat_data.end_of_turn(render, tokenizer)
    return (
        found
        if found is not None and found in set(tokenizer.all_special_ids) | _added_ids(tokenizer)
        else None
    )


def _added_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    return {
        i
        for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
        if getattr(t, "special", False)
    }


def _ollama_turns(req: ExportRequest, plan: _Plan, add_bos: bool) -> ollama.OllamaTurns | None:

    if plan.render is None:
        if req.system is not None:
            raise XtrainError(
                "--system: this run trained on plain text, not conversations", "leave out --system"
            )
        return None
    found = templates.derive(plan.render)
    if found is None:
        raise XtrainError(
            "the run's chat template cannot be written as an Ollama template (its turns change by position)",
            "export --to gguf and load it in LM Studio or llama.cpp, which read the template from the file",
        )
    if req.system is not None and found.system_prefix is None:
        raise XtrainError("--system: the run's chat template has no system turn", "leave out --system")
    tools = templates.tool_family(plan.template, found)
    return ollama.ollama_turns(found, plan.tokenizer.bos_token, add_bos, tools)


def merged_model(
    plan: _Plan, prompts: list[list[int]], progress: Progress
) -> tuple[PreTrainedModel, list[Tensor], list[Check]]:
    """Step 2: (the merged model, its logits on ``prompts``, the merge check)."""
    src = plan.src
    if not src.adapter:
        progress.stage(f"loading {src.folder}")
        model = merge.fresh_base(src.model_class, str(src.folder), source.head_config(src))
        model.eval()
        return model, parity.logits(model, prompts), []
    progress.stage(f"loading the base {src.base} on the CPU")
    base = merge.fresh_base(src.model_class, src.load_from(), source.head_config(src))
    adapted = merge.with_adapter(base, src.folder)
    expected = parity.logits(adapted, prompts)
    probe = parity.MergeProbe(adapted)
    progress.stage("merging the adapter")
    model = merge.merge(adapted)
    got = parity.logits(model, prompts)
    kind = str(next(model.parameters()).dtype).removeprefix("torch.")
    weights = probe.check(model)
    check = parity.compare("merged", "merged vs base + adapter logits", expected, got, kind)
    return model, got, [weights, check]


def _weights_bytes(model: PreTrainedModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.state_dict().values())


def export(req: ExportRequest, progress: Progress | None = None) -> ExportResult:
    """The whole export; see the module docstring for the order."""
    progress = progress or Progress()
    plan = prepare(req)
    prompts = parity.prompt_ids(plan.tokenizer, plan.render)
    model, _, checks = merged_model(plan, prompts, progress)
    kinds = req.types if req.writes_gguf else ()
    need = _weights_bytes(model) if "merged" in req.targets else 0
    need += sum(gguf.estimate_bytes(model, kind) for kind in kinds)
    req.output.parent.mkdir(parents=True, exist_ok=True)
    gguf.check_disk(req.output.parent, need)
    tmp = req.output.with_name(req.output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    notes: list[str] = []
    costs: list[parity.Cost] = []
    asked = None
    try:
        if "merged" in req.targets:
            folder = tmp / MERGED_BESIDE_GGUF if req.writes_gguf else tmp
            checks += _write_merged(plan, model, folder, progress)
        if kinds:
            files = {}
            for kind in kinds:
                path = gguf.gguf_name(tmp, kind)
                progress.stage(f"writing {path.name}")
                files[kind] = path, gguf.write_gguf(
                    model, plan.tokenizer, path, kind, plan.template, plan.eot, plan.src.name,
                    progress.advance, plan.chat_bos,
                )  # fmt: skip
            # in float32, as the reader computes the file's (a bf16 forward on the CPU is ~2% off
            # float32 on a 300M Llama: bf16 arithmetic, not the file), one module upcast at a time
            reference = parity.logits_float32(model, prompts)
            asked, why = answers.eval_prompts(plan.src, req.eval_prompts)
            notes += [why] if why else []
            if asked is not None:
                progress.stage(f"answering {len(asked.examples)} eval prompts with the merged model")
                with parity.float32_forward(model):  # as the reference logits: the float32 model's answers
                    asked.merged = answers.with_model(model, plan.tokenizer, plan.src, asked)
            del model  # the last reference: the files are read back without the merged model held
            gc.collect()
            for kind, (path, written) in files.items():
                progress.stage(f"checking {path.name}")
                found, cost = file_checks.check_file(
                    path, kind, written, plan.src, plan.tokenizer, plan.render, plan.add_bos,
                    reference, prompts, asked, plan.context,
                )  # fmt: skip
                checks += found
                costs.append(cost)
        else:
            del model
        lines = _write_modelfile(req, plan, tmp, checks) if "ollama" in req.targets else None
        if req.output.exists():
            req.output.rmdir()  # empty (checked first)

        atomic.replace(tmp, req.output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files_out = {
        p.relative_to(req.output).as_posix(): p.stat().st_size
        for p in sorted(req.output.rglob("*"))
        if p.is_file()
    }
    if plan.turns is not None and plan.turns.tools is None:
        notes.append(ollama.tools_note(plan.template))
    if plan.src.quantization:
        notes.append(
            f"the run trained on a {plan.src.quantization} base; the export merged into its 16-bit weights"
        )
    warnings = [w for w in (c.warning() for c in costs) if w]
    return ExportResult(req.output, files_out, checks, lines, notes, costs, warnings, asked)


def _write_merged(plan: _Plan, model: PreTrainedModel, tmp: Path, progress: Progress) -> list[Check]:
    """Safetensors shards + the files saved with the result, and the template check."""
    progress.stage("writing merged safetensors")
    # shards of at most 5 GB: safetensors 0.8 writes from the tensors' memory, but older versions
    # copy a whole shard to bytes first (transformers' default shard is 50 GB: a 7B model at once)
    model.save_pretrained(str(tmp), safe_serialization=True, max_shard_size="5GB")
    for path in plan.src.files():
        shutil.copy2(path, tmp / path.name)
    if plan.render is None:
        return []

    saved = models.load_tokenizer(str(tmp), False)
    kwargs = getattr(plan.render, "kwargs", None)  # data.chat_template_kwargs, as training rendered
    again = chat_data.renderer(saved, chat_data.require_template(saved, None, str(tmp)), None, kwargs)
    conversations = parity.probe_conversations(plan.render)
    expected = parity.rendered(plan.render, conversations)
    return [
        parity.same_text("template", "the merged folder", expected, parity.rendered(again, conversations))
    ]


def _write_modelfile(req: ExportRequest, plan: _Plan, tmp: Path, checks: list[Check]) -> dict[str, str]:
    """The Modelfile next to the GGUF, its template checked against training's rendering."""
    template = None
    stops: list[str] = []
    if plan.turns is not None:
        template = ollama.go_template(plan.turns)
        stops = _stops(plan)
        checks.append(_ollama_check(plan))
    modelfile = ollama.Modelfile(
        gguf.gguf_name(tmp, req.types[0]).name, template, stops, req.system,
        ollama.sampling(source.generation_config(plan.src)),
    )  # fmt: skip
    atomic.write_text(tmp / ollama.MODELFILE, modelfile.text())
    name = req.name or ollama.model_name(plan.src.name)
    return ollama.create_lines(name, str(req.output))


def _stops(plan: _Plan) -> list[str]:
    """Where Ollama stops: the text that ends an assistant turn in the template (``<|im_end|>``,
    ``<|eot_id|>``), and the eos token."""
    out = []
    end = plan.turns.format.assistant[1].strip() if plan.turns is not None else ""
    eos = plan.tokenizer.eos_token
    for text in (end, eos):
        if text and text not in out:
            out.append(text)
    return out


def _ollama_check(plan: _Plan) -> Check:
    """Ollama's rendering (bos added by llama.cpp) against training's, for the probes."""
    conversations = parity.probe_conversations(plan.render)
    expected = parity.rendered(plan.render, conversations)
    got = []
    for c in conversations:
        system = c[0]["content"] if c and c[0]["role"] == "system" else None
        turns = [m for m in c if m["role"] != "system"]
        got.append(plan.turns.bos_text + plan.turns.render(system, turns))
    return parity.same_text("template", "the Modelfile", expected, got)
