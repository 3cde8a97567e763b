"""models/inspect/attribution.py: integrated gradients' completeness on the shipped models, gradients against central
finite differences, Chefer relevance against the formula written out here, batched == alone, packed models,
Swin's refusal, deletion curves, and bench/faithfulness.py end to end on the tiny checkpoints."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from examples.sentences import SENTIMENT, TOPIC
from models import registry
from models.analysis import pooled_rollout
from models.families.bert import BertClassifier, BertConfig
from models.families.classifier import ClassifierConfig, TextClassifier
from models.families.swin import Swin, SwinConfig
from models.families.vit import ViT, ViTConfig
from models.inspect import attribution as A

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FASHION_EXAMPLES = sorted((ROOT / "examples" / "fashion").glob("*.png"))
DATA = ROOT.parent / "shared" / "data"


def text_model(pooling: str = "cls", layers: int = 2, heads: int = 4, d: int = 32, classes: int = 3) -> TextClassifier:
    torch.manual_seed(0)
    cfg = ClassifierConfig(
        vocab_size=40,
        n_classes=classes,
        d_model=d,
        n_heads=heads,
        n_layers=layers,
        d_ff=2 * d,
        dropout=0.0,
        pooling=pooling,
        max_len=32,
    )
    model = TextClassifier(cfg).eval()
    with torch.no_grad():  # a head that separates the classes, so gradients are not tiny
        model.head.weight.mul_(30.0)
    return model


def bert_model(pooling: str = "mean") -> BertClassifier:
    torch.manual_seed(1)
    model = BertClassifier(
        BertConfig(
            vocab_size=40,
            d_model=32,
            n_layers=2,
            n_heads=4,
            d_ff=64,
            max_positions=32,
            max_len=32,
            dropout=0.0,
            attention_dropout=0.0,
            n_classes=2,
            pooling=pooling,
        )
    )
    with torch.no_grad():
        model.head.weight.mul_(30.0)
    return model.eval()


def vit_model(depth: int = 2, heads: int = 4) -> ViT:
    torch.manual_seed(2)
    model = ViT(ViTConfig(dim=32, depth=depth, heads=heads, mlp_dim=64, dropout=0.0))
    with torch.no_grad():
        model.head.weight.mul_(30.0)
    return model.eval()


def swin_model() -> Swin:
    torch.manual_seed(3)
    return Swin(SwinConfig(embed_dim=24, depths=(2, 2), heads=(2, 4), drop_path=0.0)).eval()


TEXTS = [[1, 5, 6, 7, 8, 9, 2], [1, 11, 12, 2], [1, 13, 14, 15, 16, 17, 18, 19, 20, 2]]  # <s> ... </s>


def images(n: int = 3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    return torch.randn(n, 1, 28, 28, generator=g, dtype=dtype)


MODELS = {
    "text-cls": lambda: text_model("cls"),
    "text-mean": lambda: text_model("mean"),
    "bert": bert_model,
    "bert-pooler": lambda: bert_model("pooler"),
    "vit": vit_model,
    "swin": swin_model,
}


def inputs_for(name: str, dtype: torch.dtype = torch.float32) -> list:
    return TEXTS if name.startswith(("text", "bert")) else list(images(3, dtype))


# ----------------------------------------------------------------------------------------------------
# Integrated gradients: completeness on the shipped models, as the app holds them (fp16-packed)


def shipped(name: str) -> torch.nn.Module:
    from models.decoding.packed import pack_linears

    if not (models.CHECKPOINTS / name / "config.json").is_file():
        pytest.skip(f"checkpoints/{name} is not there")
    model = models.load(name)
    pack_linears(model)  # as tabs.common's model store serves it
    return model


@pytest.mark.parametrize("name", ["sst2", "agnews", "minilm-sst2", "vit-fashion"])
def test_integrated_gradients_completeness_on_shipped_models(name: str) -> None:
    model = shipped(name)
    inputs = FASHION_EXAMPLES[:3] if name.startswith("vit") else (TOPIC if "agnews" in name else SENTIMENT)[:3]
    assert inputs
    inputs = [str(p) for p in inputs] if name.startswith("vit") else inputs
    for x, attr in zip(inputs, A.explain_batch(model, inputs, "integrated_gradients")):
        assert attr.completeness_gap is not None and attr.completeness_gap <= 0.01, (name, attr.completeness_gap)
        assert np.isfinite(attr.values).all() and np.all(attr.values[attr.special] == 0)  # specials: exactly 0
        probs = model.classify(x).probs
        assert attr.target == int(np.argmax(probs)) and attr.prob == pytest.approx(float(probs.max()), abs=1e-4)


def test_integrated_gradients_sum_to_the_logit_difference() -> None:
    """Σ attributions = f(x) − f(baseline), the baseline built here: [PAD] at every non-special position."""
    model = text_model("mean").double()  # ReLU feed-forward and a sharp head: a hard path to integrate
    ids = TEXTS[0]
    x = torch.tensor([ids])
    base = x.clone()
    base[0, 1:-1] = model.config.pad_id
    with torch.no_grad():  # the baseline's ids equal pad_id, so say explicitly that nothing is padding
        no_pad = torch.zeros_like(x, dtype=torch.bool)
        delta = float(model(x, no_pad)[0, 2] - model(base, no_pad)[0, 2])
    gaps = []
    for steps in (32, 1024):
        attr = A.explain(model, ids, "integrated_gradients", target=2, steps=steps)
        gap = abs(float(attr.values.astype(np.float64).sum()) - delta) / abs(delta)
        assert attr.completeness_gap == pytest.approx(gap, rel=1e-3, abs=1e-6)  # the gap reported is the true one
        gaps.append(gap)
    assert gaps[0] < 0.01 and gaps[1] < 1e-3


# ----------------------------------------------------------------------------------------------------
# Gradients against central finite differences (float64)


def _logit(model: torch.nn.Module, x: torch.Tensor, target: int) -> float:
    with torch.no_grad():
        if isinstance(model, (TextClassifier, BertClassifier)):
            return float(model.forward_embedded(x[None], need_weights=False)[0][0, target])
        return float(model(x[None])[0, target])


@pytest.mark.parametrize("name", ["text-cls", "text-mean", "bert", "vit", "swin"])
def test_gradient_times_input_matches_central_differences(name: str) -> None:
    """gradxinput of token (patch) i is d/dt f(x with token i's embedding (patch i's pixels) scaled by 1 + t)
    at t = 0; here by central differences in float64."""
    model = MODELS[name]().double()
    x_in = inputs_for(name, torch.float64)[0]
    attr = A.explain(model, x_in, "gradxinput", target=1)
    h = 1e-5
    if isinstance(model, (TextClassifier, BertClassifier)):
        emb = model.token_embeddings(torch.tensor([x_in]))[0].detach()  # (N, D)
        units = range(emb.shape[0])

        def scaled(i: int, s: float) -> torch.Tensor:
            e = emb.clone()
            e[i] *= s
            return e
    else:
        emb = x_in  # (1, 28, 28) normalised pixels
        p, cols = attr.patch, attr.grid[1]
        units = range(attr.grid[0] * cols)

        def scaled(i: int, s: float) -> torch.Tensor:
            e = emb.clone()
            r, c = divmod(i, cols)
            e[:, r * p : (r + 1) * p, c * p : (c + 1) * p] *= s
            return e

    fd = np.array([(_logit(model, scaled(i, 1 + h), 1) - _logit(model, scaled(i, 1 - h), 1)) / (2 * h) for i in units])
    values = attr.values.ravel().astype(np.float64)
    assert np.abs(fd).max() > 1e-3  # not a vacuous comparison
    np.testing.assert_allclose(values, fd, rtol=1e-4, atol=1e-4 * np.abs(fd).max())


# ----------------------------------------------------------------------------------------------------
# Chefer relevance, one layer and one head, against the formula written out here


def _softmax_leaf(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, -1).detach().requires_grad_(True)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_relevance_one_layer_one_head_by_hand(pooling: str) -> None:
    model = text_model(pooling, layers=1, heads=1, d=16).double()
    ids = torch.tensor(TEXTS[0])
    n = len(ids)
    layer, att = model.layers[0], model.layers[0].self_attn
    with torch.no_grad():
        e = model.embed(ids) + model.positions.embedding.weight[:n]  # (N, D): tokens + learned positions
        h = layer.norm1(e)  # pre-norm
        q, k, v = att.q_proj(h), att.k_proj(h), att.v_proj(h)
    a = _softmax_leaf(q @ k.T / math.sqrt(q.shape[-1]))  # A (N, N), the one head's attention
    x = e + att.out_proj(a @ v)
    x = x + layer.ff(layer.norm2(x))
    x = model.norm(x)
    logits = model.head(x[0] if pooling == "cls" else x.mean(0))
    target = 1
    (grad,) = torch.autograd.grad(logits[target], a)  # ∇A = ∂f/∂A
    # Chefer et al. (2021): R = I + mean_h (∇A ⊙ A)⁺ · I for one layer; one head, so no mean; R − I read at
    # [CLS] (row 0) or averaged over the rows (mean pooling)
    added = (grad * a).clamp(min=0).detach()
    expected = added[0] if pooling == "cls" else added.mean(0)
    with torch.no_grad():
        assert torch.allclose(logits, model(ids[None])[0])  # the forward written out is the model's
    attr = A.explain(model, ids.tolist(), "relevance", target=target)
    assert float(expected.abs().max()) > 1e-4
    np.testing.assert_allclose(attr.values, expected.numpy(), rtol=1e-5, atol=1e-7)


def test_relevance_one_layer_one_head_vit_by_hand() -> None:
    model = vit_model(depth=1, heads=1).double()
    img = images(1, torch.float64)[0]
    blk, att = model.blocks[0], model.blocks[0].attn
    with torch.no_grad():
        patches = model.patch_embed(img[None])[0].flatten(1).T  # (49, D), row-major
        t = torch.cat([model.cls_token[0], patches]) + model.pos_embed[0]  # (50, D)
        hn = blk.ln_1(t)
        q, k, v = att.q_proj(hn), att.k_proj(hn), att.v_proj(hn)
    a = _softmax_leaf(q @ k.T / math.sqrt(q.shape[-1]))
    x = t + att.out_proj(a @ v)
    x = x + blk.mlp(blk.ln_2(x))
    logits = model.head(model.norm(x)[0])
    (grad,) = torch.autograd.grad(logits[3], a)
    expected = (grad * a).clamp(min=0)[0, 1:].detach().reshape(7, 7)  # Chefer et al.: R[CLS, patches]
    attr = A.explain(model, img, "relevance", target=3)
    assert float(expected.abs().max()) > 1e-5
    np.testing.assert_allclose(attr.values, expected.numpy(), rtol=1e-5, atol=1e-8)


# ----------------------------------------------------------------------------------------------------
# Batched == alone, for every model kind and method


@pytest.mark.parametrize("name", list(MODELS))
def test_every_method_gives_the_same_alone_or_batched(name: str) -> None:
    model = MODELS[name]()
    xs = inputs_for(name)
    for method in A.methods_for(model):
        batched = A.explain_batch(model, xs, method)
        for x, b in zip(xs, batched):
            alone = A.explain(model, x, method)
            assert alone.target == b.target and alone.values.shape == b.values.shape
            np.testing.assert_allclose(alone.values, b.values, rtol=0, atol=1e-5, err_msg=f"{name} {method}")
            if method == "integrated_gradients":
                assert abs(alone.completeness_gap - b.completeness_gap) < 1e-3


def test_shapes_labels_and_specials() -> None:
    model = text_model("cls")
    attrs = {m: A.explain(model, TEXTS[1], m) for m in A.METHODS}
    for m, a in attrs.items():
        assert a.method == m and a.values.dtype == np.float32 and a.values.shape == (4,)
        assert a.special.tolist() == [True, False, False, True] and a.grid is None and a.pooling == "cls"
        assert (a.completeness_gap is not None) == (m == "integrated_gradients")
    for m in ("attention", "rollout", "relevance"):
        assert (attrs[m].values >= 0).all()
    img = vit_model()
    a = A.explain(img, images(1)[0], "rollout", target=4)
    assert a.values.shape == (7, 7) and a.grid == (7, 7) and a.patch == 4 and a.target == 4 and len(a.tokens) == 49
    np.testing.assert_allclose(
        a.values.sum(),
        1 - pooled_rollout(img(images(1), need_weights=True)[1][0].detach().numpy(), "cls")[0],
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="target class 7"):
        A.explain(model, TEXTS[0], "gradxinput", target=7)
    with pytest.raises(ValueError, match="unknown attribution method"):
        A.explain(model, TEXTS[0], "saliency")


def test_swin_offers_the_gradient_methods_only() -> None:
    model = swin_model()
    assert A.methods_for(model) == registry.FAMILIES["swin"].methods == ("gradxinput", "integrated_gradients")
    assert A.methods_for(text_model()) == registry.FAMILIES["classifier"].methods == tuple(A.METHODS)
    assert A.methods_for(vit_model()) == registry.FAMILIES["vit"].methods == tuple(A.METHODS)
    for method in ("attention", "rollout", "relevance"):
        with pytest.raises(ValueError, match="windows"):
            A.explain(model, images(1)[0], method)
    a = A.explain(model, images(1)[0], "integrated_gradients")
    assert a.values.shape == (14, 14) and a.patch == 2 and a.completeness_gap < 0.01


# ----------------------------------------------------------------------------------------------------
# The shared model: packed layers, no change to the model, concurrent requests


def test_packed_model_gives_the_same_attributions_and_is_left_unchanged() -> None:
    from models.decoding.packed import PackedLinear, pack_linears, supported

    plain = bert_model()
    with torch.no_grad():  # fp16-exact weights, as the shipped checkpoints store them
        for p in plain.parameters():
            p.copy_(p.half().float())
    packed = copy.deepcopy(plain)
    n = pack_linears(packed, min_weights=1)
    if supported():
        assert n > 0 and any(isinstance(m, PackedLinear) for m in packed.modules())
    for method in A.METHODS:
        for a, b in zip(A.explain_batch(plain, TEXTS, method), A.explain_batch(packed, TEXTS, method)):
            np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-5, err_msg=method)
    before = {k: v.clone() for k, v in packed.state_dict().items()}
    with torch.no_grad():  # a caller under no_grad (or inference_mode) gets gradients all the same
        A.explain(packed, TEXTS[0], "relevance")
    with torch.inference_mode():
        A.explain(packed, TEXTS[0], "integrated_gradients")
    assert all(p.grad is None for p in packed.parameters())
    assert all(torch.equal(before[k], v) for k, v in packed.state_dict().items())
    assert not packed.training
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks for m in packed.modules())


def test_concurrent_requests_on_one_model_agree_with_sequential_ones() -> None:
    model = vit_model()
    xs = list(images(4))
    expected = [A.explain(model, x, m).values for x in xs for m in ("relevance", "gradxinput")]
    got: list = [None] * len(expected)

    def work(i: int) -> None:
        got[i] = A.explain(model, xs[i // 2], ("relevance", "gradxinput")[i % 2]).values

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(expected))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e, g in zip(expected, got):
        np.testing.assert_allclose(e, g, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Deletion curves


def test_text_deletion_curve_deletes_top_tokens_and_keeps_specials() -> None:
    model = text_model("mean")
    ids = TEXTS[2]  # 8 removable tokens
    attr = A.explain(model, ids, "gradxinput")
    curve = A.deletion_curve(model, ids, attr, seed=1)
    assert len(curve.fractions) <= 10 and curve.fractions[0] == 0 and curve.fractions[-1] == 1
    assert curve.removed.tolist() == sorted(set(curve.removed.tolist())) and curve.removed[-1] == 8
    assert curve.probs[0] == pytest.approx(attr.prob, abs=1e-5)
    order = A.ranking(attr)
    assert 0 not in order and len(ids) - 1 not in order and len(order) == 8
    assert attr.values[order[0]] == attr.values[1:-1].max()
    k = int(curve.removed[3])
    expected = A.probabilities(model, [[t for i, t in enumerate(ids) if i not in set(order[:k].tolist())]])
    assert curve.probs[3] == pytest.approx(float(expected[0, attr.target]), abs=1e-6)
    everything = A.probabilities(model, [[ids[0], ids[-1]]])[0, attr.target]  # the specials alone are left
    assert curve.probs[-1] == pytest.approx(float(everything), abs=1e-6)
    assert curve.random[-1] == pytest.approx(float(everything), abs=1e-6)
    again = A.deletion_curve(model, ids, attr, seed=1)
    np.testing.assert_array_equal(curve.random, again.random)  # seeded
    assert curve.auc == pytest.approx(float(np.trapezoid(curve.probs, curve.fractions)), rel=1e-6)
    # several methods in one run share one random baseline; each curve equals its own deletion_curve
    attrs = [A.explain(model, ids, m) for m in A.METHODS]
    curves, random = A.deletion_curves(model, ids, attrs, seed=1)
    assert [c.method for c in curves] == list(A.METHODS)
    np.testing.assert_array_equal(random, curves[-1].random)
    np.testing.assert_allclose(random, curve.random, atol=1e-6)
    np.testing.assert_allclose(curves[3].probs, curve.probs, atol=1e-6)  # gradxinput, as above


def test_image_deletion_curve_fills_patches_with_the_mean_pixel() -> None:
    model = vit_model()
    x = images(1)[0]
    curve = A.deletion_curve(model, x, method="relevance", mean_pixel=0.5)
    assert len(curve.fractions) == 10 and curve.removed[-1] == 49
    fill = (0.5 - 0.2860) / 0.3530  # a pixel of 0.5 in the Fashion-MNIST normalisation
    assert float(A.mean_fill(model, 0.5)) == pytest.approx(fill, rel=1e-6)
    assert float(A.mean_fill(model)) == 0.0  # default: the training mean, 0 after normalisation
    flat = A.probabilities(model, torch.full((1, 1, 28, 28), fill))[0, curve.target]
    assert curve.probs[-1] == pytest.approx(float(flat), abs=1e-6)
    assert curve.random[-1] == pytest.approx(float(flat), abs=1e-6)
    assert A.curve_counts(3).tolist() == [0, 1, 2, 3] and A.curve_counts(49).tolist()[:3] == [0, 5, 11]


# ----------------------------------------------------------------------------------------------------
# bench/faithfulness.py end to end on the tiny checkpoints (keys and ranges; never times)


@pytest.mark.skipif(not (DATA / "sst2" / "dev.tsv").is_file(), reason="../shared/data is not there")
def test_faithfulness_bench_runs_end_to_end(tiny_checkpoints: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "bench/faithfulness.py",
            "--checkpoints",
            str(tiny_checkpoints),
            "--data-dir",
            str(DATA),
            "--limit",
            "4",
            "--sanity",
            "2",
            "--bootstrap",
            "50",
            "--steps",
            "8",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report["models"]) == {"sst2", "minilm-sst2", "agnews", "vit-fashion"}
    for name, r in report["models"].items():
        assert r["examples"] == 4
        methods = r["methods"]
        assert set(methods) == {*A.METHODS, "random"}
        keys = ("deletion_auc", "insertion_auc") if name == "vit-fashion" else ("comprehensiveness", "sufficiency")
        for m in methods.values():
            for key in keys:
                lo, hi = m[key]["ci"]
                assert lo <= m[key]["mean"] <= hi
        assert set(r["agreement"]) == {
            f"{a}|{b}" for i, a in enumerate([*A.METHODS, "random"]) for b in [*A.METHODS, "random"][i + 1 :]
        }
        assert r["sanity"]["steps"][0] == "head" and r["sanity"]["steps"][-1] == "embeddings"
        assert set(r["sanity"]["spearman"]) == set(A.METHODS)
    assert "wall_s" in report


def test_rgb_imagenet_kind_vit_from_an_uploaded_image() -> None:
    """Three channels, the ImageNet preprocessing (an uploaded uint8 photo), its normalisation for the fill."""
    torch.manual_seed(5)
    model = ViT(
        ViTConfig(
            image_size=32,
            in_channels=3,
            patch=8,
            dim=32,
            depth=2,
            heads=4,
            mlp_dim=64,
            num_classes=5,
            dropout=0.0,
            input="imagenet",
            resize=40,
        )
    ).eval()
    photo = (np.random.default_rng(0).random((50, 60, 3)) * 255).astype(np.uint8)
    for method in A.METHODS:
        a = A.explain(model, photo, method)
        assert a.values.shape == (4, 4) and np.isfinite(a.values).all()
    a = A.explain(model, photo, "integrated_gradients")
    assert a.completeness_gap < 0.01
    assert torch.allclose(A.mean_fill(model, (0.485, 0.456, 0.406)), torch.zeros(3, 1, 1), atol=1e-7)
    curve = A.deletion_curve(model, photo, a)
    assert curve.removed[-1] == 16 and curve.probs[0] == pytest.approx(a.prob, abs=1e-5)


@pytest.mark.parametrize("shape,sigma", [((2, 1, 28, 28), None), ((1, 3, 224, 224), None), ((1, 3, 16, 20), 1.3),
                                         ((1, 1, 8, 8), 5.0)])
def test_the_image_baseline_blur_is_torchvisions_gaussian_blur(shape, sigma) -> None:
    """The integrated-gradients image baseline (its own two 1-D convolutions, issue 48 item 11: torchvision's
    transforms cost the first explanation a second to import) against torchvision's gaussian_blur, the reference:
    the same kernel size rule, sigma and reflect padding."""
    from torchvision.transforms.functional import gaussian_blur

    from models.inspect.attribution import blur

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    side = min(shape[-2:])
    s = side / 10.0 if sigma is None else sigma
    k = min(2 * math.ceil(3 * s) + 1, 2 * (side - 1) + 1)
    torch.testing.assert_close(blur(x, sigma), gaussian_blur(x, [k, k], [s, s]), atol=2e-6, rtol=0)
    assert torch.equal(blur(x, 0.0), x)
