"""fp16-packed linear layers for CPU inference (fbgemm).

The shipped checkpoints store their weights in fp16. On the CPU, fbgemm's fp16 GEMM
(``torch.ops.quantized.linear_dynamic_fp16``) multiplies float32 activations by a pre-packed fp16 copy of
the weight and accumulates in float32, so for weights that fp16 holds exactly the result equals
``F.linear``'s up to summation order. For the few rows of a decoding step it is much faster than the
float32 GEMM on these machines: about 5-7x for the translator's 256x8000 output layer and 1.4-1.8x for
its 256x1024 feed-forward layers, but slower for small square matrices, so only large layers are packed
(``bench/packed.py`` measures it end to end).

``pack_linears(model)`` turns each qualifying ``nn.Linear`` into a :class:`PackedLinear` in place: the
same module object, parameters and state-dict names; only its no-grad float32 CPU forward changes.
Training (grad enabled), other devices and other dtypes run plain ``F.linear``, and a weight changed in
place is packed again on its next use.

``joined(*linears)``: one function computing several layers that read the same input (a query, key and value
projection; a gate and an up projection) in one multiply, packed when the layers are (``models/decoding/fastgen.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_WEIGHTS = 1 << 18  # 256 x 1024: smaller matrices are as fast or faster in float32


@functools.cache
def supported() -> bool:
    """Whether this torch build has fbgemm's fp16 linear (x86 builds do; ARM builds usually not)."""
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(torch.zeros(2, 2), None)
        torch.ops.quantized.linear_dynamic_fp16(torch.zeros(1, 2), packed)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose no-grad float32 CPU forward runs on an fp16-packed copy of its weight."""

    _packed: object | None = None
    _packed_key: tuple[int, ...] | None = None

    def _key(self) -> tuple[int, ...]:
        b = self.bias
        return (self.weight._version, self.weight.data_ptr(), -1 if b is None else b._version,
                0 if b is None else b.data_ptr())

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32 or not x.numel():
            return F.linear(x, self.weight, self.bias)
        return torch.ops.quantized.linear_dynamic_fp16(x, self.prepacked())

    def prepacked(self) -> object:
        """The fp16-packed copy of the current weight and bias (packed again after an in-place change)."""
        key = self._key()
        packed = self._packed
        if packed is None or self._packed_key != key:
            bias = None if self.bias is None else self.bias.detach().float()
            packed = torch.ops.quantized.linear_prepack_fp16(self.weight.detach().float(), bias)
            self._packed, self._packed_key = packed, key
        return packed

    def __getstate__(self) -> dict:  # copies and pickles re-pack on first use
        state = self.__dict__.copy()
        state.pop("_packed", None)
        state.pop("_packed_key", None)
        return state


def fp16_exact(t: Tensor) -> bool:
    return bool(torch.equal(t.detach().float(), t.detach().half().float()))


def pack_linears(model: nn.Module, min_weights: int = MIN_WEIGHTS) -> int:
    """Make every CPU float32 ``nn.Linear`` of ``model`` with at least ``min_weights`` weights, all exactly
    representable in fp16, a :class:`PackedLinear`; returns how many. No-op without fbgemm."""
    if not supported():
        return 0
    n = 0
    for m in model.modules():
        if type(m) is not nn.Linear or m.weight.numel() < min_weights or m.weight.device.type != "cpu":
            continue
        if m.weight.dtype != torch.float32 or not fp16_exact(m.weight):
            continue
        if m.bias is not None and not fp16_exact(m.bias):
            continue
        m.__class__ = PackedLinear
        n += 1
    return n


def joined(*linears: nn.Linear) -> Callable[[Tensor], Tensor]:
    """x -> torch.cat([lin(x) for lin in linears], -1), for inference, on the weights as they are now. Packed layers
    (:class:`PackedLinear`) read their fp16-packed copy; several layers that read the same input (a query, key and
    value projection; a gate and an up projection) are then one multiply, on one packed copy of their concatenated
    weights when every weight and bias is exact in fp16 (the same numbers up to summation order). Plain layers run
    ``F.linear`` on their own weights."""

    def plain(lin: nn.Linear) -> Callable[[Tensor], Tensor]:
        bias = None if lin.bias is None else lin.bias.detach()
        return functools.partial(F.linear, weight=lin.weight.detach(), bias=bias)

    def side_by_side(parts: list[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
        return parts[0] if len(parts) == 1 else lambda x: torch.cat([f(x) for f in parts], -1)

    cpu32 = all(lin.weight.device.type == "cpu" and lin.weight.dtype == torch.float32 for lin in linears)
    if not cpu32 or not any(isinstance(lin, PackedLinear) for lin in linears):
        return side_by_side([plain(lin) for lin in linears])
    if len(linears) == 1:  # its own packed copy
        return functools.partial(torch.ops.quantized.linear_dynamic_fp16, W_prepack=linears[0].prepacked())
    weight = torch.cat([lin.weight.detach() for lin in linears])
    zero = [lin.weight.new_zeros(lin.out_features) for lin in linears]
    bias = None if all(lin.bias is None for lin in linears) else torch.cat(
        [z if lin.bias is None else lin.bias.detach() for lin, z in zip(linears, zero)])
    if fp16_exact(weight) and (bias is None or fp16_exact(bias)):
        packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        return functools.partial(torch.ops.quantized.linear_dynamic_fp16, W_prepack=packed)
    return side_by_side([lin if isinstance(lin, PackedLinear) else plain(lin) for lin in linears])
