"""What planning reads of a train config, as read-only Protocols.

The config's dataclasses live above planning (``xtrain.train.config.schema``); the resolver and
the batch arithmetic read only these fields of it, so they name them here and import nothing
from ``xtrain.train``. ``TrainConfig`` satisfies ``TrainConfigView`` (checked in
tests/test_config.py), and so does any object with the same fields.
"""

from __future__ import annotations

from typing import Protocol


class BatchView(Protocol):
    @property
    def per_device(self) -> int: ...
    @property
    def global_batch(self) -> int | None: ...


class OptimView(Protocol):
    @property
    def lr(self) -> float: ...
    @property
    def lr_scaling(self) -> str: ...  # none | linear | sqrt
    @property
    def base_global_batch(self) -> int | None: ...


class RunView(Protocol):
    @property
    def mixed_precision(self) -> str: ...  # auto | no | fp16 | bf16
    @property
    def report_to(self) -> str | list[str]: ...  # auto | a list of tracker names ([]: none)
    @property
    def tensorboard(self) -> bool: ...  # report_to: auto's shorthand
    @property
    def compile(self) -> bool: ...  # torch.compile the model (refused where the plan says it cannot)


class ModelView(Protocol):
    @property
    def dtype(self) -> str: ...  # the weights' load dtype: bfloat16 weights prefer bf16


class DataView(Protocol):
    @property
    def num_workers(self) -> int | None: ...  # None: the plan's DataLoader workers


class TrainConfigView(Protocol):
    @property
    def batch(self) -> BatchView: ...
    @property
    def optim(self) -> OptimView: ...
    @property
    def run(self) -> RunView: ...
    @property
    def model(self) -> ModelView: ...
    @property
    def data(self) -> DataView: ...
