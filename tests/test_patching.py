"""models/inspect/patching.py and the ``edit`` argument (models/blocks/attention.py Intervention): activation patching
and
attention-sink ablation on tiny random models, each checked against a plain loop over a deep copy of the model
with ordinary PyTorch forward hooks (test-only code that shares nothing with the code under test), and one
measurement on the shipped gpt-tiny's induction heads."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from models.blocks.attention import Intervention, LayerEdit
from models.families.bert import BertClassifier, BertConfig
from models.families.classifier import ClassifierConfig, TextClassifier
from models.families.gpt import GPT, GPTConfig
from models.inspect.patching import patch_sweep, repeated_pair, sink_ablation

torch.set_num_threads(2)

ROOT = Path(__file__).resolve().parents[1]
VOCAB, T = 64, 12


def _build(kind: str) -> nn.Module:
    """A tiny random model in float64 (so that batched and looped runs agree far below the tolerance), with
    weights larger than the usual init, so that two inputs give clearly different answers."""
    torch.manual_seed(0)
    if kind == "llama-gqa":
        model = GPT(GPTConfig(recipe="llama", vocab_size=VOCAB, max_len=48, d_model=48, n_layers=2, n_heads=6,
                              n_kv_heads=2))
    elif kind == "llama-qkv-bias":
        model = GPT(GPTConfig(recipe="llama", vocab_size=VOCAB, max_len=48, d_model=48, n_layers=3, n_heads=6,
                              n_kv_heads=3, qkv_bias=True))
    elif kind == "gpt2":
        model = GPT(GPTConfig(recipe="gpt2", vocab_size=VOCAB, max_len=48, d_model=32, n_layers=2, n_heads=4))
    elif kind in ("pre-norm", "post-norm"):
        model = TextClassifier(ClassifierConfig(vocab_size=VOCAB, n_classes=3, d_model=32, n_heads=4, n_layers=2,
                                                d_ff=64, dropout=0.0, max_len=32, norm_first=kind == "pre-norm"))
    else:
        model = BertClassifier(BertConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                          max_positions=64, max_len=32, dropout=0.0, attention_dropout=0.0,
                                          n_classes=3))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model.double().eval()


KINDS = ["llama-gqa", "llama-qkv-bias", "gpt2", "pre-norm", "post-norm", "bert"]


@pytest.fixture(scope="module", params=KINDS)
def model(request: pytest.FixtureRequest) -> nn.Module:
    return _build(request.param)


def _pair(seed: int = 1) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(4, VOCAB, (T,), generator=g).tolist()
    corrupted = list(clean)
    corrupted[2:6] = torch.randint(4, VOCAB, (4,), generator=g).tolist()
    return clean, corrupted


# ---------------------------------------------------------------------------------------------- hooked reference


def _parts(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module], list[nn.Module]]:
    """(layers, their attention's output projection, value projection) of any of the models."""
    if isinstance(model, GPT):
        return list(model.blocks), [b.attn.o_proj for b in model.blocks], [b.attn.v_proj for b in model.blocks]
    layers = list(model.bert.layers if isinstance(model, BertClassifier) else model.layers)
    return layers, [m.self_attn.out_proj for m in layers], [m.self_attn.v_proj for m in layers]


def _scores(model: nn.Module, ids: list[int]) -> Tensor:
    """The metric's logits of one input: next-token logits at the last position, or the class logits."""
    x = torch.tensor([ids])
    with torch.no_grad():
        if isinstance(model, GPT):
            return model(x).logits[0, -1]
        return model(x, torch.zeros_like(x, dtype=torch.bool))[0]


def _capture(model: nn.Module, ids: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Each layer's input (1, T, D) and its output projection's input (1, T, H·d) on ``ids``, by hooks."""
    layers, projs, _ = _parts(model)
    xs: dict[int, Tensor] = {}
    os_: dict[int, Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, a, i=i: xs.__setitem__(i, a[0].clone()))
             for i, m in enumerate(layers)]
    hooks += [m.register_forward_pre_hook(lambda _m, a, i=i: os_.__setitem__(i, a[0].clone()))
              for i, m in enumerate(projs)]
    _scores(model, ids)
    for h in hooks:
        h.remove()
    return [xs[i] for i in range(len(layers))], [os_[i] for i in range(len(layers))]


def _reference_sweep(model: nn.Module, clean: list[int], corrupted: list[int], sweep: str, target: int,
                     foil: int) -> np.ndarray:
    """One plain forward per (layer, head) or (layer, position), patched by a forward pre-hook on a copy."""
    ref = copy.deepcopy(model)
    layers, projs, _ = _parts(ref)
    c = ref.config
    d = c.d_model // c.n_heads
    clean_x, clean_o = _capture(ref, clean)

    def ld(s: Tensor) -> float:
        return float(s[target] - s[foil])

    ld_clean, ld_corrupt = ld(_scores(ref, clean)), ld(_scores(ref, corrupted))
    width = c.n_heads if sweep == "heads" else len(clean)
    out = np.zeros((c.n_layers, width))
    for layer in range(c.n_layers):
        for u in range(width):
            if sweep == "heads":
                def swap_head(_m: nn.Module, args: tuple, layer: int = layer, u: int = u) -> tuple:
                    x = args[0].clone()
                    x[..., u * d:(u + 1) * d] = clean_o[layer][..., u * d:(u + 1) * d]
                    return (x, *args[1:])
                hook = projs[layer].register_forward_pre_hook(swap_head)
            else:
                def swap_position(_m: nn.Module, args: tuple, layer: int = layer, u: int = u) -> tuple:
                    x = args[0].clone()
                    x[:, u] = clean_x[layer][:, u]
                    return (x, *args[1:])
                hook = layers[layer].register_forward_pre_hook(swap_position)
            out[layer, u] = (ld(_scores(ref, corrupted)) - ld_corrupt) / (ld_clean - ld_corrupt)
            hook.remove()
    return out


# ------------------------------------------------------------------------------------------------- patching


@pytest.mark.parametrize("sweep", ["heads", "positions"])
def test_batched_sweep_equals_hooked_loop(model: nn.Module, sweep: str) -> None:
    clean, corrupted = _pair()
    calls: list[tuple[float, str]] = []
    res = patch_sweep(model, clean, corrupted, sweep, progress=lambda f, text: calls.append((f, text)))
    c = model.config
    assert res.restored.dtype == np.float32
    assert res.restored.shape == (c.n_layers, c.n_heads if sweep == "heads" else T)
    ref = _reference_sweep(model, clean, corrupted, sweep, res.target, res.foil)
    np.testing.assert_allclose(res.restored, ref, atol=1e-5, rtol=0)
    assert np.abs(ref).max() > 0.05  # the test measures something
    # defaults: target = the clean top answer; foil = the corrupted top answer unless that is the target
    s_clean, s_corrupt = _scores(model, clean), _scores(model, corrupted)
    assert res.target == int(s_clean.argmax())
    want_foil = int(s_corrupt.argmax())
    assert res.foil == (want_foil if want_foil != res.target else int(s_clean.topk(2).indices[1]))
    assert res.logit_diff_clean == pytest.approx(float(s_clean[res.target] - s_clean[res.foil]), abs=1e-9)
    assert res.logit_diff_corrupted == pytest.approx(float(s_corrupt[res.target] - s_corrupt[res.foil]), abs=1e-9)
    assert [f for f, _ in calls] == pytest.approx([(i + 1) / c.n_layers for i in range(c.n_layers)])
    assert len(res.clean_tokens) == len(res.corrupted_tokens) == T
    if isinstance(model, GPT):
        assert res.target_label == model.piece(res.target)
    else:
        assert res.target_label == model.labels[res.target]


def test_explicit_target_and_foil(model: nn.Module) -> None:
    clean, corrupted = _pair()
    res = patch_sweep(model, clean, corrupted, "heads", target=1, foil=2)
    assert (res.target, res.foil) == (1, 2)
    np.testing.assert_allclose(res.restored, _reference_sweep(model, clean, corrupted, "heads", 1, 2),
                               atol=1e-5, rtol=0)


def _recorded(model: nn.Module, ids: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Each layer's per-head outputs and residual input, recorded through the edit argument."""
    x = torch.tensor([ids])
    with torch.no_grad():
        if isinstance(model, GPT):
            out = model(x, keep_hidden=True, edit=Intervention(record=True))
            return out.heads, out.hidden[:-1]
        run = model.forward_edited(x, torch.zeros_like(x, dtype=torch.bool), Intervention(record=True))
        return run.heads, run.residual


def _edited_scores(model: nn.Module, ids: list[int], edit: Intervention) -> Tensor:
    x = torch.tensor([ids])
    with torch.no_grad():
        if isinstance(model, GPT):
            return model(x, edit=edit).logits[0, -1]
        return model(x, torch.zeros_like(x, dtype=torch.bool), edit)[0]


def test_whole_residual_restores_everything_and_nothing_restores_nothing(model: nn.Module) -> None:
    clean, corrupted = _pair()
    res = patch_sweep(model, clean, corrupted, "positions")
    heads, residual = _recorded(model, clean)
    corrupt_heads, _ = _recorded(model, corrupted)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads

    def restored(edit: Intervention) -> float:
        s = _edited_scores(model, corrupted, edit)
        ld = float(s[res.target] - s[res.foil])
        return (ld - res.logit_diff_corrupted) / (res.logit_diff_clean - res.logit_diff_corrupted)

    every_position = torch.ones(1, T, dtype=torch.bool)
    for layer in (0, n_layers - 1):  # the whole residual stream entering a layer: the corrupted run is the clean one
        edit = Intervention({layer: LayerEdit(resid_values=residual[layer], resid_select=every_position)})
        assert restored(edit) == pytest.approx(1.0, abs=1e-9)
    assert restored(Intervention()) == pytest.approx(0.0, abs=1e-9)  # nothing patched
    no_head = torch.zeros(1, n_heads, dtype=torch.bool)
    assert restored(Intervention({0: LayerEdit(head_values=heads[0], head_select=no_head)})) == \
        pytest.approx(0.0, abs=1e-9)
    # every head from the corrupted run itself changes nothing; every head from the clean run, in every layer,
    # equals the hooked copy doing the same (not 1: the token embeddings stay corrupted in the residual stream)
    every_head = torch.ones(1, n_heads, dtype=torch.bool)
    own = Intervention({i: LayerEdit(head_values=corrupt_heads[i], head_select=every_head) for i in range(n_layers)})
    assert restored(own) == pytest.approx(0.0, abs=1e-9)
    ref = copy.deepcopy(model)
    _, clean_o = _capture(ref, clean)
    _, projs, _ = _parts(ref)
    hooks = [p.register_forward_pre_hook(lambda _m, a, i=i: (clean_o[i], *a[1:])) for i, p in enumerate(projs)]
    want = _scores(ref, corrupted)
    for h in hooks:
        h.remove()
    got = _edited_scores(model, corrupted, Intervention({i: LayerEdit(head_values=heads[i], head_select=every_head)
                                                          for i in range(n_layers)}))
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_different_lengths_and_equal_inputs_are_refused(model: nn.Module) -> None:
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match="clean has 12 tokens, corrupted has 14; patching needs the same length"):
        patch_sweep(model, clean, corrupted + [5, 6])
    with pytest.raises(ValueError, match="same logit difference"):
        patch_sweep(model, clean, clean)
    with pytest.raises(ValueError, match="sweep must be one of"):
        patch_sweep(model, clean, corrupted, "layers")
    with pytest.raises(ValueError, match="same answer"):
        patch_sweep(model, clean, corrupted, target=1, foil=1)


# --------------------------------------------------------------------------------------- the edit argument


def _full_edit(model: nn.Module, b: int, t: int) -> Intervention:
    """Every kind of edit at once on a batch of b rows: heads patched in some rows, residual positions in
    others, and keys forbidden (key 0 for head 0, which leaves a causal query 0 with no key of its own)."""
    c = model.config
    g = torch.Generator().manual_seed(3)
    d = c.d_model // c.n_heads
    heads = torch.randn(1, c.n_heads, t, d, generator=g, dtype=torch.float64)
    head_select = torch.zeros(b, c.n_heads, dtype=torch.bool)
    head_select[0, 1] = head_select[1, 0] = True
    resid = torch.randn(b, t, c.d_model, generator=g, dtype=torch.float64)
    resid_select = torch.zeros(b, t, dtype=torch.bool)
    resid_select[1, 3] = True
    forbid = torch.zeros(c.n_heads, t, dtype=torch.bool)
    forbid[0, 0] = forbid[1, 2:4] = True
    last = c.n_layers - 1
    return Intervention({0: LayerEdit(head_values=heads, head_select=head_select, forbid=forbid),
                         last: LayerEdit(resid_values=resid, resid_select=resid_select)})


def test_fused_equals_explicit_with_an_edit_and_none_changes_nothing(model: nn.Module) -> None:
    ids = torch.randint(4, VOCAB, (2, T), generator=torch.Generator().manual_seed(5))
    edit = _full_edit(model, 2, T)
    with torch.no_grad():
        if isinstance(model, GPT):
            fused, explicit = model(ids, edit=edit).logits, model(ids, need_weights=True, edit=edit).logits
            plain, none, empty = model(ids).logits, model(ids, edit=None).logits, model(ids, edit=Intervention()).logits
            recording = model(ids, edit=Intervention(record=True)).logits
        else:
            pad = torch.zeros_like(ids, dtype=torch.bool)
            pad[1, -3:] = True  # a padded row too: forbidden keys combine with the padding mask
            fused, explicit = model(ids, pad, edit), model.forward_with_attention(ids, pad, edit)[0]
            plain, none, empty = model(ids, pad), model(ids, pad, None), model(ids, pad, Intervention())
            recording = model(ids, pad, Intervention(record=True))
            emb = model.token_embeddings(ids)
            torch.testing.assert_close(model.forward_embedded(emb, pad, False, edit)[0], fused, atol=1e-10, rtol=0)
    assert bool(torch.isfinite(fused).all())
    torch.testing.assert_close(explicit, fused, atol=1e-10, rtol=0)
    assert not torch.allclose(fused, plain)
    assert torch.equal(none, plain) and torch.equal(empty, plain) and torch.equal(recording, plain)


def test_bad_edits_are_refused() -> None:
    model = _build("llama-gqa")
    with pytest.raises(ValueError, match="come together"):
        LayerEdit(head_values=torch.zeros(1, 6, 4, 8))
    with pytest.raises(ValueError, match="must be bool"):
        LayerEdit(head_values=torch.zeros(1, 6, 4, 8), head_select=torch.zeros(1, 6))
    with pytest.raises(ValueError, match="the model has 2"):
        model(torch.tensor([[5, 6]]), edit=Intervention({2: LayerEdit()}))


# ------------------------------------------------------------------------------------------- sink ablation


def _reference_sink(model: nn.Module, ids: list[int], layer: int, head: int) -> tuple[Tensor, np.ndarray]:
    """The metric's logits with the head's attention renormalised without key 0, on a hooked copy: the head's
    slice of the output projection's input becomes renorm(A_h) · V_h (layers below are unchanged, so A_h and V
    are those of the plain run). Also the renormalised attention (T, T)."""
    ref = copy.deepcopy(model)
    c = ref.config
    n_kv = getattr(c, "kv_heads", c.n_heads)
    d = c.d_model // c.n_heads
    _, projs, vprojs = _parts(ref)
    values: dict[str, Tensor] = {}
    hook = vprojs[layer].register_forward_hook(lambda _m, _a, out: values.__setitem__("v", out.clone()))
    x = torch.tensor([ids])
    with torch.no_grad():
        if isinstance(ref, GPT):
            w = ref(x, need_weights=True).attention[layer][0, head]
        else:
            w = ref.forward_with_attention(x, torch.zeros_like(x, dtype=torch.bool))[1][0, layer, head]
    hook.remove()
    causal = isinstance(ref, GPT)
    renorm = w.clone()
    renorm[:, 0] = 0.0
    renorm = renorm / renorm.sum(-1, keepdim=True)
    if causal:
        renorm[0] = w[0]  # query 0 sees key 0 only and keeps it
    v = values["v"][0].view(len(ids), n_kv, d)[:, head // (c.n_heads // n_kv)]  # (T, d) of this head's kv head

    def swap(_m: nn.Module, args: tuple) -> tuple:
        z = args[0].clone()
        z[0, :, head * d:(head + 1) * d] = renorm @ v
        return (z, *args[1:])

    projs[layer].register_forward_pre_hook(swap)
    return _scores(ref, ids), renorm.numpy()


@pytest.mark.parametrize("layer, head", [(0, 1), (1, 0)])
def test_sink_ablation(model: nn.Module, layer: int, head: int) -> None:
    ids = torch.randint(4, VOCAB, (T,), generator=torch.Generator().manual_seed(7)).tolist()
    res = sink_ablation(model, ids, layer, head)
    after, before = res.attention_after, res.attention_before
    assert after.shape == before.shape == (T, T) and after.dtype == np.float32
    np.testing.assert_allclose(after[1:, 0], 0.0, atol=0)  # no weight on key 0 for any query but 0
    np.testing.assert_allclose(after.sum(-1), 1.0, atol=1e-6)
    assert before[1:, 0].min() > 0
    want_scores, want_attention = _reference_sink(model, ids, layer, head)
    np.testing.assert_allclose(after, want_attention, atol=1e-6)
    # the other heads of that layer, and every layer below, attend as before (within one forward pass)
    x = torch.tensor([ids])
    forbid = torch.zeros(model.config.n_heads, 1, dtype=torch.bool)
    forbid[head, 0] = True
    edit = Intervention({layer: LayerEdit(forbid=forbid)})
    with torch.no_grad():
        if isinstance(model, GPT):
            plain, edited = model(x, need_weights=True).attention, model(x, need_weights=True, edit=edit).attention
        else:
            pad = torch.zeros_like(x, dtype=torch.bool)
            plain = list(model.forward_with_attention(x, pad)[1].unbind(1))
            edited = list(model.forward_with_attention(x, pad, edit)[1].unbind(1))
    for i in range(layer + 1):
        others = [h for h in range(model.config.n_heads) if i < layer or h != head]
        torch.testing.assert_close(edited[i][:, others], plain[i][:, others], atol=1e-12, rtol=0)
    p_after = torch.softmax(want_scores, -1)
    assert res.target_prob_after == pytest.approx(float(p_after[res.target]), abs=1e-9)
    if isinstance(model, GPT):
        assert res.target == int(_scores(model, ids).argmax())
        assert res.target_loss_after == pytest.approx(-float(torch.log(p_after[res.target])), abs=1e-9)
        assert res.loss_before is not None and res.loss_after is not None and res.loss_before > 0
        assert res.loss_after != res.loss_before
    else:
        np.testing.assert_allclose(res.probs_after, p_after.numpy(), atol=1e-6)
        np.testing.assert_allclose(res.probs_before.sum(), 1.0, atol=1e-6)
        assert res.labels == model.labels and res.loss_before is None


def test_sink_ablation_everywhere() -> None:
    """``everywhere``: key 0 forbidden to every head of every layer (lesson 5, step 3). Every layer's attention then
    puts nothing on key 0 past query 0, and the loss is that of the forward pass with those layers edited, whose
    logits are recomputed here from the model's own cross-entropy; one head alone changes it less."""
    import torch.nn.functional as F

    model = _build("llama-gqa")
    ids = torch.randint(4, VOCAB, (T,), generator=torch.Generator().manual_seed(3)).tolist()
    res = sink_ablation(model, ids, 1, 0, everywhere=True)
    one = sink_ablation(model, ids, 1, 0)
    x = torch.tensor([ids])
    c = model.config
    forbid = torch.zeros(c.n_heads, 1, dtype=torch.bool)
    forbid[:, 0] = True
    with torch.no_grad():
        out = model(x, need_weights=True, edit=Intervention({i: LayerEdit(forbid=forbid) for i in range(c.n_layers)}))
    for layer in out.attention:
        assert float(layer[0, :, 1:, 0].abs().max()) == 0.0
    np.testing.assert_allclose(res.attention_after, out.attention[1][0, 0].float().numpy(), atol=1e-9)
    want = float(F.cross_entropy(out.logits[0, :-1].float(), x[0, 1:]))
    assert res.loss_after == pytest.approx(want, abs=1e-6) and res.loss_before == one.loss_before
    assert abs(res.loss_after - res.loss_before) > abs(one.loss_after - one.loss_before)


def test_query_with_no_other_key_keeps_its_own() -> None:
    """Key 0 forbidden for every head of a causal model: query 0 has nothing else and keeps key 0 (no NaN)."""
    model = _build("llama-gqa")
    ids = torch.randint(4, VOCAB, (1, T))
    forbid = torch.zeros(model.config.n_heads, T, dtype=torch.bool)
    forbid[:, 0] = True
    edit = Intervention({i: LayerEdit(forbid=forbid) for i in range(model.config.n_layers)})
    with torch.no_grad():
        explicit = model(ids, need_weights=True, edit=edit)
        fused = model(ids, edit=edit).logits
    assert bool(torch.isfinite(fused).all())
    torch.testing.assert_close(explicit.logits, fused, atol=1e-10, rtol=0)
    for w in explicit.attention:
        assert torch.equal(w[0, :, 0, 0], torch.ones(model.config.n_heads))
        assert float(w[0, :, 1:, 0].abs().max()) == 0.0


# ------------------------------------------------------------------------------------------ the shipped model


def test_repeated_pair() -> None:
    model = _build("llama-gqa")
    clean, corrupted = repeated_pair(model, 10, seed=3)
    assert len(clean) == len(corrupted) == 20
    a, b = clean[1:11], corrupted[1:11]
    assert clean[0] == corrupted[0] == model.config.bos_id
    assert clean[11:] == corrupted[11:] == a[:-1] and not set(a) & set(b) and len(set(a)) == 10
    with pytest.raises(ValueError, match="n must be between"):
        repeated_pair(model, 40)


def test_gpt_tiny_induction_head_restores_the_copy() -> None:
    """clean = BOS + A + A[:-1] predicts A[-1] by induction; corrupted = BOS + B + A[:-1] has no earlier copy.
    The strongest induction head as /head_roles reports it (its defaults: N = 50, seed 0) is the sweep's top head
    or restores at least half."""
    import models
    from models.analysis import induction_score

    model = models.load("gpt-tiny")
    clean, corrupted = repeated_pair(model, 20, seed=0)
    res = patch_sweep(model, clean, corrupted, "heads", target=clean[20])
    assert res.target_label == model.piece(clean[20])
    n = 50
    score = induction_score(model.token_losses(model.repeated_tokens(n, seed=0))[1], n)
    best = np.unravel_index(int(score.argmax()), score.shape)
    top = np.unravel_index(int(res.restored.argmax()), res.restored.shape)
    assert top == best or res.restored[best] >= 0.5, (best, top, res.restored)


def test_bench_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/patching.py over a tiny random gpt-tiny checkpoint: the keys of its last line (never the times)."""
    import json

    from bench.patching import main
    from tests.tiny import make_checkpoints

    make_checkpoints(tmp_path, ("gpt-tiny",))
    report = main(["--checkpoint", str(tmp_path / "gpt-tiny"), "--no-gpt2", "--repeats", "1"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    for key in ("gpt_tiny_forward_s", "gpt_tiny_heads_s", "gpt_tiny_heads_ratio", "gpt_tiny_positions_s",
                "gpt_tiny_positions_ratio"):
        assert report[key] > 0
    assert report["tokens"] == 40
