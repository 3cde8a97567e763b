"""models.decoding.packed: fp16-packed linear layers give F.linear's numbers (up to summation order) for weights that
fp16 holds exactly, leave training and everything else on plain F.linear, and the shipped translator
decodes the same with and without them."""

from __future__ import annotations

import copy
import pickle
import platform

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.decoding.packed import MIN_WEIGHTS, PackedLinear, fp16_exact, pack_linears, supported

X86 = platform.machine().lower() in ("x86_64", "amd64")


def fp16_linear(d_in: int, d_out: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(d_in, d_out, bias=bias)
    with torch.no_grad():  # what a checkpoint stored in fp16 loads as
        lin.weight.copy_(lin.weight.half().float())
        if bias:
            lin.bias.copy_(lin.bias.half().float())
    return lin


def test_fbgemm_is_there_on_x86() -> None:
    # the speed-up needs fbgemm; x86 torch builds (CI, Spaces) have it, others fall back to F.linear
    assert supported() or not X86


def test_packs_only_large_fp16_exact_linears() -> None:
    big, small, inexact = fp16_linear(256, 1024), fp16_linear(256, 256), nn.Linear(256, 1024)
    model = nn.Sequential(big, nn.ReLU(), small, inexact)
    keys = set(model.state_dict())
    n = pack_linears(model)
    if not supported():
        assert n == 0 and type(big) is nn.Linear
        return
    assert n == 1 and big.weight.numel() >= MIN_WEIGHTS
    assert type(big) is PackedLinear and type(small) is nn.Linear and type(inexact) is nn.Linear
    assert not fp16_exact(inexact.weight) and fp16_exact(big.weight)
    assert set(model.state_dict()) == keys  # same parameters under the same names


@pytest.mark.skipif(not supported(), reason="fbgemm is not in this torch build (not x86)")
@pytest.mark.parametrize("shape", [(5, 256), (2, 7, 256), (1, 1, 256)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_forward_matches_f_linear(shape: tuple[int, ...], bias: bool) -> None:
    lin = fp16_linear(256, 1024, bias=bias)
    ref = copy.deepcopy(lin)
    assert pack_linears(lin) == 1
    x = torch.randn(*shape)
    with torch.no_grad():
        got, want = lin(x), F.linear(x, ref.weight, ref.bias)
    assert got.shape == want.shape == (*shape[:-1], 1024)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert lin._packed is not None  # the packed path ran


@pytest.mark.skipif(not supported(), reason="fbgemm is not in this torch build (not x86)")
def test_training_uses_plain_linear_and_weight_updates_repack() -> None:
    lin = fp16_linear(256, 1024)
    pack_linears(lin)
    x = torch.randn(3, 256)
    out = lin(x)  # grad enabled: exactly F.linear, and differentiable
    assert torch.equal(out, F.linear(x, lin.weight, lin.bias))
    out.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    with torch.no_grad():
        before = lin(x)
        lin.weight.mul_(-1.0)  # an optimiser step changes the weight in place
        after = lin(x)
    torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias), atol=2e-5, rtol=1e-5)
    assert not torch.allclose(before, after)


@pytest.mark.skipif(not supported(), reason="fbgemm is not in this torch build (not x86)")
def test_copies_and_pickles_repack() -> None:
    lin = fp16_linear(256, 1024)
    pack_linears(lin)
    x = torch.randn(4, 256)
    with torch.no_grad():
        want = lin(x)
        for other in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
            assert type(other) is PackedLinear and other._packed is None
            torch.testing.assert_close(other(x), want)


def test_shipped_translator_decodes_the_same_packed_or_not() -> None:
    import models

    plain = models.load("translator-en-de")  # models.load never packs: the app's model store does
    packed = models.load("translator-en-de")
    pack_linears(packed)
    n_packed = sum(type(m) is PackedLinear for m in packed.modules())
    assert n_packed == (2 * (plain.config.n_enc_layers + plain.config.n_dec_layers) + 1 if supported() else 0)
    assert sum(type(m) is PackedLinear for m in plain.modules()) == 0
    for text in ["A man in a blue shirt is riding a bike down a busy street while two dogs run behind him.",
                 "Two children play in the snow."]:
        a, b = plain.translate(text, beam_size=5), packed.translate(text, beam_size=5)
        assert a.text == b.text and a.target_tokens == b.target_tokens
        assert abs(a.score - b.score) < 1e-4
        for kind in a.attention:
            np.testing.assert_allclose(a.attention[kind].weights, b.attention[kind].weights, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
def test_joined_layers_give_each_layers_output(bias: bool) -> None:
    from models.decoding.packed import joined

    q, k, v = fp16_linear(256, 1024, bias, seed=1), fp16_linear(256, 256, bias, seed=2), fp16_linear(256, 256, bias, 3)
    x = torch.randn(3, 256)
    with torch.no_grad():
        want = torch.cat([F.linear(x, m.weight, m.bias) for m in (q, k, v)], -1)
        plain = joined(q, k, v)(x)  # nothing packed: each layer's own F.linear
        assert torch.equal(plain, want)
        assert torch.equal(joined(k)(x), F.linear(x, k.weight, k.bias))
        pack_linears(q)  # only the large one qualifies, as in a grouped-query model
        packed = joined(q, k, v)(x)  # one multiply on one packed copy of all three, where fbgemm is there
        torch.testing.assert_close(packed, want, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(joined(q)(x), F.linear(x, q.weight, q.bias), atol=2e-5, rtol=1e-5)
        inexact = nn.Linear(256, 256, bias=bias)  # not exact in fp16: never packed, its own F.linear
        torch.testing.assert_close(joined(q, inexact)(x), torch.cat([q(x), inexact(x)], -1))
    assert q.weight.shape == (1024, 256) and (q.weight.grad is None)  # the layers themselves are untouched
