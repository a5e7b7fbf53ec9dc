"""A start's adapters on a model (``model.start``'s ``Start``), as peft adapters side by side:
for training a stage, for its reference, and for running or merging a chained result.

Training a stage (``attach``): each earlier adapter is loaded under its own name (``chain<i>``),
frozen, and stays a separate adapter on every layer (never merged into the base: on a 4-bit base
that would round it). A **new** adapter (the default) is made as a plain run makes it (the
task's own LoRA, same seed) and trains on top; with ``lora.continue_adapter`` the start's last
adapter itself is loaded trainable as ``default``, and a frozen copy of it, ``ref``, is kept
where it started. Active in the forward: every earlier adapter and ``default`` (their outputs
add). peft 0.21's ``set_adapter`` with a list makes every listed adapter trainable, so the
earlier ones are frozen again by hand after it.

The reference of preference tuning and GRPO (``reference``) is exactly the start: the active
adapters switched to the earlier ones (new adapter: ``default`` off; continued: ``ref`` in its
place) for the forward, then back. peft's ``disable_adapter`` would switch them all off (the
base without the earlier stages: the peers' bug); a run without a chain keeps it (the base is
the start then).

A result is run or merged (``load``) as base + every adapter in order, all active, in eval mode:
``xtrain predict``, ``chat`` and ``export`` (``model.merge``) see the chain's model.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError
from xtrain.model.start import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CHAIN_DIR,
    Start,
    StartAdapter,
    check_unchanged,
)

if TYPE_CHECKING:
    from peft import PeftModel
    from torch.nn import Module

TRAINED = "default"  # the adapter a stage trains (peft's default name: saved as the adapter folder)
REFERENCE = "ref"  # a continued adapter's frozen copy, where it started (TRL's name)
ATTRIBUTE = "xtrain_chain"  # the ``Chain`` kept on the peft model


@dataclass(frozen=True)
class Chain:
    """The adapters of a chained model: ``active`` in the forward (earlier ones, then the trained
    one), ``reference`` the start's (earlier ones, and ``ref`` for a continued adapter), and the
    adapters to keep beside the trained one when it is saved (``kept``: their folders, by lineage
    index)."""

    active: tuple[str, ...]
    reference: tuple[str, ...]
    kept: tuple[StartAdapter, ...]


def name_of(adapter: StartAdapter) -> str:
    return f"chain{adapter.index}"


def attach(
    model: Module, start: Start, continued: bool, new_adapter: Callable[[Module], PeftModel]
) -> PeftModel:
    """``model`` (the base, checked and prepared) with the start's adapters: the earlier ones
    frozen, then a new adapter made by ``new_adapter`` (the task's LoRA) or, ``continued``, the
    last one trained on. Each adapter's weights are checked against its record first."""
    from peft import PeftModel

    for adapter in start.adapters:
        check_unchanged(adapter)
    earlier = start.adapters[:-1] if continued else start.adapters
    if continued:
        last = start.adapters[-1].path
        peft_model = PeftModel.from_pretrained(model, last, adapter_name=TRAINED, is_trainable=True)
        peft_model.load_adapter(last, adapter_name=REFERENCE, is_trainable=False)
    else:
        peft_model = new_adapter(model)  # made first: its initialisation is a plain run's
    for adapter in earlier:
        load_as_saved(peft_model, adapter.path, name_of(adapter))
    _check_whole_modules(peft_model, earlier)
    names = tuple(name_of(a) for a in earlier)
    chain = Chain((*names, TRAINED), (*names, REFERENCE) if continued else names, earlier)
    _activate(peft_model, chain.active, trainable={TRAINED})
    _no_dropout(peft_model, {*names, REFERENCE})
    setattr(peft_model, ATTRIBUTE, chain)
    peft_model.train()  # (peft loads an adapter in float32: trained weights stay float32)
    return peft_model


def load_as_saved(peft_model: PeftModel, path: str, name: str) -> None:
    """peft's ``load_adapter`` (frozen) of the adapter in ``path`` as it was saved. A classifier's
    peft model (``PeftModelForSequenceClassification``: a reward model, a seq-cls stage) adds its
    head to every adapter it loads (``modules_to_save``), which an earlier stage that trained no
    head (the SFT adapter under a reward model) does not hold: its load would look for the head's
    weights in it. So the adapter is added by ``PeftModel``'s own ``add_adapter``, its config as
    saved (a classifier's saved adapter names its head itself)."""
    import types

    from peft import PeftModel

    if type(peft_model).add_adapter is PeftModel.add_adapter:
        peft_model.load_adapter(path, adapter_name=name, is_trainable=False)
        return
    peft_model.add_adapter = types.MethodType(PeftModel.add_adapter, peft_model)  # this call only
    try:
        peft_model.load_adapter(path, adapter_name=name, is_trainable=False)
    finally:
        del peft_model.add_adapter


def _check_whole_modules(peft_model: PeftModel, earlier: tuple[StartAdapter, ...]) -> None:
    """Only one adapter may train a module whole (peft's ``modules_to_save``: one copy active at
    a time): a new adapter that would train again one an earlier stage trained is one line."""
    mine = set(peft_model.peft_config[TRAINED].modules_to_save or ())
    for adapter in earlier:
        theirs = set(peft_model.peft_config[name_of(adapter)].modules_to_save or ())
        if mine & theirs:
            raise XtrainError(
                f"the new adapter would train {sorted(mine & theirs)} whole, which the start's adapter "
                f"{adapter.path} trained whole already (peft keeps one copy of such a module active)",
                "set lora.continue_adapter=true to train that adapter on, or leave the module out",
            )


def _activate(peft_model: PeftModel, names: tuple[str, ...], trainable: set[str]) -> None:
    """``names`` active on every layer (their outputs add); only ``trainable`` of them train
    (peft's ``set_adapter`` with a list makes every one of them trainable)."""
    peft_model.base_model.set_adapter(list(names))
    for name in names:
        peft_model.set_requires_grad(name, requires_grad=name in trainable)


def _no_dropout(peft_model: PeftModel, frozen: set[str]) -> None:
    """The frozen adapters compute as the start did at its end, in training too: no LoRA dropout
    (a regulariser of the weights that train; the reference is then the same function as the
    start whatever the mode)."""
    import torch
    from peft.tuners.lora import LoraLayer

    for module in peft_model.modules():
        if isinstance(module, LoraLayer):
            for name in frozen & set(module.lora_dropout.keys()):
                module.lora_dropout[name] = torch.nn.Identity()


def chain_of(model: Module) -> Chain | None:
    """The ``Chain`` of a model ``attach`` built (the unwrapped peft model), else None."""
    return getattr(model, ATTRIBUTE, None)


@contextlib.contextmanager
def reference(model: Module) -> Iterator[None]:
    """Inside: ``model`` (the unwrapped peft model) computes as the stage's start: its earlier
    adapters alone (and a continued adapter's frozen copy); a model without a chain with its
    adapters off (peft's ``disable_adapter``: its start is the base). Gradients are the caller's
    to switch off; which weights train is as it was after."""
    chain = chain_of(model)
    if chain is None:
        with model.disable_adapter():
            yield
        return
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.base_model.set_adapter(list(chain.reference))
    try:
        yield
    finally:
        model.base_model.set_adapter(list(chain.active))
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])


def load(model: Module, start: Start) -> PeftModel:
    """The base ``model`` with every adapter of ``start`` applied in order, all active, frozen,
    in eval mode: the chain's model (``xtrain predict``, ``chat``, the merge of ``export``)."""
    from peft import PeftModel

    *earlier, last = start.adapters
    for adapter in start.adapters:
        check_unchanged(adapter)
    peft_model = PeftModel.from_pretrained(model, last.path)  # the result's own adapter: peft's default
    for adapter in earlier:
        load_as_saved(peft_model, adapter.path, name_of(adapter))
    if earlier:
        _activate(peft_model, (*(name_of(a) for a in earlier), TRAINED), trainable=set())
    peft_model.eval()
    return peft_model


def keep_earlier(chain: Chain | None, folder: Path) -> None:
    """The earlier adapters of a chained stage copied byte for byte beside the adapter saved in
    ``folder`` (``lineage/<i>``: their record's hashes stay true), so the result stands alone."""
    for adapter in chain.kept if chain is not None else ():
        target = folder / CHAIN_DIR / str(adapter.index)
        target.mkdir(parents=True, exist_ok=True)
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copyfile(Path(adapter.path) / name, target / name)
