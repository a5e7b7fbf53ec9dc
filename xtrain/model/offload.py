"""Activation offloading (``model.activation_offload``): what autograd saves for the backward pass
moved to host memory during the forward, brought back when the backward needs it.

Through ``torch.autograd.graph.saved_tensors_hooks`` (the mechanism torchtune's and TRL's
offloading use), entered for a model's training forward by two module hooks (``attach``; the
forward hook runs even when the forward raised, so the hooks never outlive the call):

- pack: a saved tensor that is a parameter or buffer of the model (a frozen weight, or a view of
  one such as ``weight.T``: same storage) or smaller than ``min_bytes`` stays where it is; any
  other is copied to host memory. On CUDA the copy goes to pinned memory (``pin``, the plan's
  ``pin_memory``: off on WSL2, whose pinned memory is limited) on a side stream that first waits
  for the compute stream, so the forward goes on while it copies; the device tensor is marked as
  used by that stream (``record_stream``), so the caching allocator hands its memory out again
  only after the copy;
- unpack: the host copy goes back to the device on the compute stream after the copy's event
  (pinned: asynchronously to the host). Not prefetched: the backward waits for each copy back.

Gradient checkpointing composes: a checkpointed layer's own saved tensors go through the
checkpoint's hooks (innermost wins), so only each layer's input, which the checkpoint saves
under the hooks around it, moves: "only the checkpoints move".

On the CPU the tensors are copied within host memory: nothing is saved, but the path is the same
(the tests compare its gradients bit for bit with the plain run's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

MIN_BYTES = 1024  # torchtune's min_offload_size: a smaller tensor costs more to move than it frees


class Offloaded:
    """A saved tensor in host memory: the copy, where it came from and the copy's event."""

    __slots__ = ("device", "event", "host")

    def __init__(self, host: torch.Tensor, device: torch.device, event: torch.cuda.Event | None) -> None:
        self.host, self.device, self.event = host, device, event


class ActivationOffload:
    """Saved activations of ``model``'s training forward in host memory (``attach``/``detach``)."""

    def __init__(self, model: torch.nn.Module, pin: bool = True, min_bytes: int = MIN_BYTES) -> None:
        self.model, self.pin, self.min_bytes = model, pin, min_bytes
        self.kept: set[int] = set()  # storages of the parameters and buffers: never moved
        self.active: list[torch.autograd.graph.saved_tensors_hooks] = []
        self.handles: list[RemovableHandle] = []
        self.stream: torch.cuda.Stream | None = None
        self.moved = 0  # bytes moved to the host in the last forward (tests, the benchmark)

    def attach(self) -> ActivationOffload:
        self.handles = [
            self.model.register_forward_pre_hook(self._enter),
            self.model.register_forward_hook(self._exit, always_call=True),
        ]
        return self

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The saved-tensor hooks themselves, for a forward run by hand (tests, the benchmark)."""
        self._remember_weights()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _remember_weights(self) -> None:
        # every forward: accelerate moves the model after attach, and FSDP2 swaps in gathered weights
        tensors = [*self.model.parameters(), *self.model.buffers()]
        self.kept = {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta"}
        self.moved = 0

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        context = self.hooks()
        context.__enter__()
        self.active.append(context)

    def _exit(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        if self.active:
            self.active.pop().__exit__(None, None, None)

    def _keep(self, t: torch.Tensor) -> bool:
        if isinstance(t, torch.nn.Parameter) or t.numel() * t.element_size() < self.min_bytes:
            return True
        if t.layout != torch.strided or type(t) is not torch.Tensor:  # sparse, DTensor, 4-bit weights
            return True
        return t.untyped_storage().data_ptr() in self.kept

    def _pack(self, t: torch.Tensor) -> torch.Tensor | Offloaded:
        if self._keep(t):
            return t
        self.moved += t.numel() * t.element_size()
        if t.device.type != "cuda":
            return Offloaded(t.detach().to("cpu", copy=True), t.device, None)
        if self.stream is None:
            self.stream = torch.cuda.Stream(t.device)
        host = torch.empty_like(t, device="cpu", pin_memory=self.pin)  # its strides where dense
        self.stream.wait_stream(torch.cuda.current_stream(t.device))  # t is computed
        with torch.cuda.stream(self.stream):
            host.copy_(t.detach(), non_blocking=self.pin)
            event = torch.cuda.Event()
            event.record(self.stream)
        t.record_stream(self.stream)  # its memory is reused only after the copy
        return Offloaded(host, t.device, event)

    def _unpack(self, packed: torch.Tensor | Offloaded) -> torch.Tensor:
        if not isinstance(packed, Offloaded):
            return packed
        if packed.event is None:
            return packed.host.to(packed.device)
        torch.cuda.current_stream(packed.device).wait_event(packed.event)
        return packed.host.to(packed.device, non_blocking=self.pin)
