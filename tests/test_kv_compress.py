"""models/decoding/compress.py: KV-cache presses and generation from the cut cache (issue 72).

kvpress 0.5.5 (the reference named by the issue) requires transformers < 5.3 and cannot be installed beside the
project's transformers 5.24, so the reference here is transformers itself on random-weight LLaMA and Qwen2 folders:
each press's score written out after kvpress's definitions (its documented formulas: ScorerPress.compress's
``max(1, int(T·(1 − ratio)))`` top-k per key-value head, SnapKV's window attention recomputed from the layer's
normed input and transformers' own RoPE, ExpectedAttention's averaged rotation built as a matrix from transformers'
rotary embedding, AdaKV's safeguard and cross-head ranking, PyramidKV's budget formula) over transformers' eager
attention, its DynamicCache's keys and values and its hidden states; our scores equal them within 1e-5 and the kept
positions are the same. The compressed-cache answer is checked against transformers decoding from a DynamicCache
cut to the kept positions (kvpress's pipeline: the question at the original positions, then greedy); the full-cache
arm against plain ``GPT.generate`` (ids and every attention weight); ratio 0 against the full arm."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models
from models.decoding import compress as C
from tests import tiny_families
from tests.test_decoder_spec import planted
from tests.test_decoder_spec import tiny as tiny_gpt

CONTEXT, QUESTION, NEW = 80, 6, 6
WINDOW = 16  # SnapKV's observation window (kvpress's 64 would not fit a test context with room to spare)


def _llama_folder(folder: Path):
    """A random LLaMA: 3 layers, 6 query heads over 2 key-value heads, std 0.1 (clear greedy winners)."""
    import transformers

    tiny_families.borrowed_tokenizer(folder)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                                   rope_theta=700.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False,
                                   initializer_range=0.1)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv") / request.param
    if request.param == "llama":
        hf = _llama_folder(folder)
    else:
        hf = tiny_families.decoder_folder(folder, "qwen2", max_position_embeddings=256)
    ours = models.load(str(folder))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 300, (CONTEXT + QUESTION,), generator=g).tolist()
    return hf, ours, ids[:CONTEXT], ids[CONTEXT:]


# ------------------------------------------------------------------------------------------- the reference
class Reference:
    """transformers' side of a context: eager attention, the cache's keys and values, the layers' normed inputs."""

    def __init__(self, hf, ctx: list[int]) -> None:
        from transformers import DynamicCache

        self.hf, self.t = hf, len(ctx)
        self.ids = torch.tensor([ctx])
        cache = DynamicCache(config=hf.config)
        with torch.no_grad():
            out = hf.model(self.ids, past_key_values=cache, output_attentions=True, output_hidden_states=True)
        self.attn = [a[0].float() for a in out.attentions]  # (H, T, T)
        self.keys = [layer.keys[0].float() for layer in cache.layers]  # (H_kv, T, d), after RoPE
        self.values = [layer.values[0].float() for layer in cache.layers]
        self.normed = [hf.model.layers[i].input_layernorm(out.hidden_states[i]) for i in range(len(self.attn))]
        self.cfg = hf.config
        self.group = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        self.d = self.keys[0].size(-1)

    def queries(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """kvpress's ``get_prerope_query_states``: q_proj of the normed input, (H, r, d)."""
        attn = self.hf.model.layers[layer].self_attn
        return attn.q_proj(h)[0].view(h.size(1), -1, self.d).transpose(0, 1)

    def rope(self, positions: torch.Tensor):
        cos, sin = self.hf.model.rotary_emb(self.normed[0], positions[None])
        return cos[0], sin[0]  # (r, d)

    def by_group(self, s: torch.Tensor) -> torch.Tensor:
        return s.view(-1, self.group, s.size(-1)).mean(1)

    def window_attention(self, layer: int, w: int) -> torch.Tensor:
        """SnapKV's ``compute_window_attention``: the last w queries recomputed and RoPE'd, softmax over every key
        (causal inside the window), the window's own columns dropped: (H, w, T − w)."""
        from transformers.models.llama.modeling_llama import rotate_half

        t = self.t
        q = self.queries(layer, self.normed[layer][:, -w:])
        cos, sin = self.rope(torch.arange(t))
        q = q * cos[-w:] + rotate_half(q) * sin[-w:]
        k = self.keys[layer].repeat_interleave(self.group, 0)
        s = q @ k.transpose(1, 2) / math.sqrt(self.d)
        s = s + torch.triu(torch.full_like(s, float("-inf")), diagonal=t - w + 1)
        return torch.softmax(s, -1)[..., :-w]

    def score(self, layer: int, p: C.Press) -> torch.Tensor:
        t = self.t
        with torch.no_grad():
            if p.name == "streaming_llm":
                s = torch.ones(self.keys[layer].shape[:2])
                s[:, p.sinks:p.sinks + t - int(t * (1 - p.ratio))] = 0
                return s
            if p.name == "observed_attention":
                return self.by_group(self.attn[layer].sum(1) / torch.arange(t, 0, -1))
            if p.name in ("snapkv", "pyramidkv"):
                s = self.window_attention(layer, p.window).mean(1)
                s = F.avg_pool1d(s[None], p.kernel, padding=p.kernel // 2, stride=1)[0]
                s = self.by_group(s)
                return F.pad(s, (0, p.window), value=s.max().item() + 1)
            if p.name == "tova":
                s = self.window_attention(layer, 1).mean(0)  # (1, T − 1): every head's last row, averaged
                s = s.repeat(self.keys[layer].size(0), 1)
                return F.pad(s, (0, 1), value=s.max().item() + 1)
            if p.name == "knorm":
                return -torch.linalg.vector_norm(self.keys[layer], dim=-1)
            return self.expected(layer, p)

    def expected(self, layer: int, p: C.Press) -> torch.Tensor:
        """ExpectedAttentionPress.score: R = cos·I + sin·P averaged over the next positions, as a matrix."""
        t, d, n = self.t, self.d, p.sinks
        q = self.queries(layer, self.normed[layer][:, n:])
        mu = q.mean(1, keepdim=True)
        centred = q - mu
        cov = torch.einsum("nsi,nsj->nij", centred, centred) / (t - n)
        cos, sin = self.rope(torch.arange(t, t + p.future))
        eye = torch.eye(d)
        perm = torch.zeros(d, d)
        perm[d // 2:, : d // 2], perm[: d // 2, d // 2:] = torch.eye(d // 2), -torch.eye(d // 2)
        rot = (cos[:, None] * eye + sin[:, None] * perm).mean(0)
        mu = mu[:, 0] @ rot.T
        cov = rot @ cov @ rot.T
        k = self.keys[layer][:, n:].repeat_interleave(self.group, 0)  # (H, T', d)
        s = torch.einsum("hd,htd->ht", mu, k) / math.sqrt(d)
        s = s + torch.einsum("hti,hij,htj->ht", k, cov, k) / d / 2
        s = self.by_group(torch.softmax(s, -1)) * self.values[layer][:, n:].norm(dim=-1)
        return F.pad(s, (n, 0), value=s.max().item() + 1)

    def kept(self, p: C.Press) -> np.ndarray:
        """(L, H_kv, T): ScorerPress's top-k, PyramidKV's budgets, AdaKV's safeguard and cross-head ranking."""
        layers, t, out = len(self.attn), self.t, []
        for i in range(layers):
            s = self.score(i, p)
            h = s.size(0)
            n = max(1, int(t * (1 - p.ratio)))
            mask = torch.zeros(h, t, dtype=torch.bool)
            if p.per_head:
                safe = max(1, int(n * p.alpha))
                s = s.clone().scatter(-1, s.topk(safe, -1).indices, torch.finfo(s.dtype).max)
                pruned = torch.topk(-s.reshape(-1), h * (t - n)).indices
                mask = torch.ones(h * t, dtype=torch.bool)
                mask[pruned] = False
                out.append(mask.view(h, t).numpy())
                continue
            if p.name == "pyramidkv":
                n = pyramid(t, i, layers, p)
            out.append(mask.scatter(-1, s.topk(n, -1).indices, True).numpy())
        return np.stack(out)

    def cut(self, kept: np.ndarray | None):
        """The prefilled DynamicCache, cut to the kept positions of each layer and key-value head."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.cfg)
        with torch.no_grad():
            self.hf.model(self.ids, past_key_values=cache)
        if kept is not None:
            for i, layer in enumerate(cache.layers):
                idx = torch.stack([torch.from_numpy(np.flatnonzero(m)) for m in kept[i]])[None, :, :, None]
                layer.keys = layer.keys.gather(2, idx.expand(-1, -1, -1, self.d)).contiguous()
                layer.values = layer.values.gather(2, idx.expand(-1, -1, -1, self.d)).contiguous()
        return cache

    def logits(self, kept: np.ndarray | None, read: list[int]) -> torch.Tensor:
        """The next-token logits (V,) after ``read`` from the (cut) cache, ``read`` at the original positions."""
        with torch.no_grad():
            pos = torch.arange(self.t, self.t + len(read))[None]
            return self.hf(torch.tensor([read]), past_key_values=self.cut(kept), position_ids=pos).logits[0, -1]

    def generate(self, kept: np.ndarray | None, question: list[int], new: int) -> list[int]:
        """kvpress's pipeline: prefill, the cache cut to the kept positions, the question at the original positions,
        then greedy decoding (stopping at eos)."""
        cache = self.cut(kept)
        with torch.no_grad():
            pos = torch.arange(self.t, self.t + len(question))[None]
            out = self.hf(torch.tensor([question]), past_key_values=cache, position_ids=pos)
            got = [int(out.logits[0, -1].argmax())]
            pos = pos[:, -1:] + 1
            for i in range(new - 1):
                if got[-1] == self.cfg.eos_token_id:
                    break
                out = self.hf(torch.tensor([[got[-1]]]), past_key_values=cache, position_ids=pos + i)
                got.append(int(out.logits[0, -1].argmax()))
        return got


def pyramid(t: int, layer: int, layers: int, p: C.Press) -> int:
    """PyramidKVPress.get_layer_budget (after KVCache-Factory's formula), written out again."""
    cap = p.window + t * (1 - p.ratio)
    lo = (cap - p.window) / p.beta
    hi = (cap - p.window) * 2 - lo
    if hi >= t - p.window:
        hi = t - p.window
        lo = (cap - p.window) * 2 - hi
    if not (t >= hi >= lo >= p.window):
        return max(1, round(t * (1 - p.ratio)))
    return round(hi - layer * (hi - lo) / (layers - 1))


def _press(name: str, ratio: float = 0.5, **kw) -> C.Press:
    return C.Press(name, ratio, window=WINDOW, **kw)


CASES = [(name, 0.5, False) for name in C.PRESSES] + [("snapkv", 0.75, False), ("knorm", 0.25, False),
                                                      ("expected_attention", 0.5, True), ("tova", 0.5, True)]


@pytest.fixture(scope="module")
def reference(pair):
    hf, _, ctx, _ = pair
    return Reference(hf, ctx)


# ------------------------------------------------------------------------------------------- the presses
@pytest.mark.parametrize("name,ratio,per_head", CASES)
def test_scores_and_kept_positions_equal_the_reference(pair, reference, name, ratio, per_head) -> None:
    _, ours, ctx, question = pair
    press = _press(name, ratio, per_head=per_head)
    cmp = C.compare(ours, ctx, question, press, max_new_tokens=NEW)
    for i in range(len(reference.attn)):
        np.testing.assert_allclose(cmp.kept.scores[i], reference.score(i, press).numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name} layer {i}")
    want = reference.kept(press)
    np.testing.assert_array_equal(cmp.kept.mask, want)
    counts = cmp.kept.mask.sum(-1)
    if name == "pyramidkv":  # budgets fall from the first layer to the last, the ratio's on average
        assert list(counts[:, 0]) == [pyramid(CONTEXT, i, 3, press) for i in range(3)]
        assert counts[0, 0] > counts[-1, 0]
    elif per_head:
        assert (counts.sum(1) == counts.shape[1] * C.n_kept(CONTEXT, ratio)).all()
    else:
        assert (counts == C.n_kept(CONTEXT, ratio)).all()
    if name == "streaming_llm":
        assert list(cmp.kept.positions(0, 0)) == list(range(4)) + list(range(CONTEXT - C.n_kept(CONTEXT, ratio) + 4,
                                                                             CONTEXT))


@pytest.mark.parametrize("name", [n for n in C.PRESSES])
def test_the_compressed_answer_is_transformers_from_the_cut_cache(pair, reference, name) -> None:
    _, ours, ctx, question = pair
    press = _press(name, 0.6)
    cmp = C.compare(ours, ctx, question, press, max_new_tokens=NEW)
    assert cmp.compressed.new_ids == reference.generate(cmp.kept.mask, question, NEW)
    assert cmp.full.new_ids == reference.generate(None, question, NEW)


# ------------------------------------------------------------------------------------------- the two arms
def test_the_full_arm_is_plain_generation_and_ratio_zero_changes_nothing(pair) -> None:
    _, ours, ctx, question = pair
    cmp = C.compare(ours, ctx, question, _press("snapkv", 0.0), max_new_tokens=NEW)
    plain = ours.generate(ctx + question, max_new_tokens=NEW)
    assert cmp.full.ids == plain.ids and cmp.full.text == plain.text
    np.testing.assert_allclose(cmp.full.attention.full(), plain.attention["decoder"].weights, atol=1e-5)
    assert [s.chosen for s in cmp.full.steps] == [s.chosen for s in plain.steps]
    assert cmp.kept.mask.all() and cmp.compressed.ids == cmp.full.ids and cmp.parted is None
    np.testing.assert_allclose(cmp.kl, 0, atol=1e-9)
    assert cmp.agree.all()


def test_kl_and_agreement_equal_transformers_along_the_full_answer(pair, reference) -> None:
    """Step s's KL and top-token agreement are those of transformers' next-token distributions after the question and
    the full answer's first s tokens, from the full cache and from the cut one."""
    _, ours, ctx, question = pair
    cmp = C.compare(ours, ctx, question, _press("knorm", 0.8), max_new_tokens=NEW)
    assert cmp.kl.shape == cmp.agree.shape == (len(cmp.full.steps),) and cmp.kl.max() > 1e-4
    for s in range(len(cmp.full.steps)):
        read = question + cmp.full.new_ids[:s]
        full = reference.logits(None, read).double().log_softmax(-1)
        cut = reference.logits(cmp.kept.mask, read).double().log_softmax(-1)
        assert cmp.kl[s] == pytest.approx(float((full.exp() * (full - cut)).sum()), abs=1e-5)
        assert bool(cmp.agree[s]) == (int(full.argmax()) == int(cut.argmax()))
    if cmp.parted is not None:
        assert cmp.full.new_ids[:cmp.parted] == cmp.compressed.new_ids[:cmp.parted]
        assert cmp.full.new_ids[cmp.parted] != cmp.compressed.new_ids[cmp.parted]


def test_several_presses_from_one_prompt_pass_are_each_alone(pair) -> None:
    _, ours, ctx, question = pair
    presses = [_press("snapkv", 0.7), _press("knorm", 0.5), _press("expected_attention", 0.6, per_head=True)]
    many = C.compare_many(ours, ctx, question, presses, max_new_tokens=NEW)
    for press, got in zip(presses, many):
        alone = C.compare(ours, ctx, question, press, max_new_tokens=NEW)
        np.testing.assert_array_equal(got.kept.mask, alone.kept.mask)
        assert got.compressed.ids == alone.compressed.ids and got.parted == alone.parted
        np.testing.assert_allclose(got.kl, alone.kl, atol=1e-9)
        np.testing.assert_allclose(got.compressed.attention.full(), alone.compressed.attention.full(), atol=1e-6)


def test_no_question_answers_from_the_context_and_the_first_step_is_shared(pair) -> None:
    _, ours, ctx, _ = pair
    cmp = C.compare(ours, ctx, "", _press("tova", 0.7), max_new_tokens=NEW)
    assert cmp.kl[0] == pytest.approx(0, abs=1e-9) and cmp.agree[0]
    assert cmp.full.new_ids[0] == cmp.compressed.new_ids[0]
    assert cmp.full.ids[:CONTEXT] == ctx


# ------------------------------------------------------------------------------------------- refusals
def test_bad_settings_are_refused_in_words(pair) -> None:
    _, ours, ctx, question = pair
    with pytest.raises(ValueError, match="press must be one of"):
        C.compare(ours, ctx, question, C.Press("h3o"))
    with pytest.raises(ValueError, match="below 1"):
        C.compare(ours, ctx, question, C.Press("knorm", 1.0))
    with pytest.raises(ValueError, match="window of 64 needs a context longer"):
        C.compare(ours, ctx[:40], question, C.Press("snapkv"))
    with pytest.raises(ValueError, match="AdaKV"):
        C.compare(ours, ctx, question, C.Press("observed_attention", per_head=True))
    with pytest.raises(ValueError, match="exceed the model"):
        C.compare(ours, ctx * 4, question, C.Press("knorm"))
    with pytest.raises(ValueError, match="context is empty"):
        C.compare(ours, [], question, C.Press("knorm"))


def test_a_setting_the_store_does_not_know_is_refused() -> None:
    model = tiny_gpt()
    assert C.compare(model, list(range(1, 30)), [3, 4], C.Press("knorm", 0.5), max_new_tokens=2).kept.mask.any()
    model.spec = planted(model.spec, "qk_norm")
    with pytest.raises(ValueError, match="qk_norm"):
        C.compare(model, list(range(1, 30)), [3, 4], C.Press("knorm", 0.5), max_new_tokens=2)


# ------------------------------------------------------------------------------------------- the view
def test_the_section_answers_through_its_api_action_and_redraws_by_layer(pair) -> None:
    import gradio as gr

    from tabs.common import Error
    from tabs.sections import kvcache

    _, ours, _, _ = pair
    assert kvcache.CHOICES == {label: name for name, label in C.LABELS.items()}  # the page's labels, without torch
    with gr.Blocks() as demo:
        model = gr.Dropdown(["m"], value="m")
        new = gr.Slider(1, 8, value=NEW)
        kvcache.section(model, new, lambda name: ours)
    action = next(f for f in demo.fns.values() if f.api_name == "compress_cache")
    context = "The secret word is apple. Two dogs play in the snow. A man is riding a bicycle down the street."
    out = action.fn(context, " The secret word is", "m", "TOVA", 0.5, False, 8, NEW)
    note, answers, shaded, heat, kl, _, state, numbers = out
    want = C.compare(ours, context, " The secret word is", C.Press("tova", 0.5, window=8), max_new_tokens=NEW)
    assert numbers == C.summary(want) and "TOVA" in note and "ratio 0.50" in note
    assert 'data-arm="full"' in answers and 'data-arm="compressed"' in answers
    np.testing.assert_allclose(np.asarray(heat.data[0].z, dtype=np.float32), want.kept.mask.mean(1))
    np.testing.assert_allclose(np.asarray(kl.data[0].y, dtype=np.float32), want.kl.astype(np.float32))
    assert shaded.count("<span title=") == want.context_len
    layer_html, layer_heat = kvcache.redraw(state, "layer 1")
    assert np.asarray(layer_heat.data[0].z).shape == want.kept.mask[1].shape
    np.testing.assert_array_equal(np.asarray(layer_heat.data[0].z), want.kept.mask[1].astype(np.float32))
    assert f"of {want.kept.mask.shape[1]}" in layer_html
    with pytest.raises(Error, match="Give a context"):
        action.fn("  ", "", "m", "TOVA", 0.5, False, 8, NEW)
    with pytest.raises(Error, match="press must be one of"):
        action.fn(context, "", "m", "H3O", 0.5, False, 8, NEW)
    with pytest.raises(Error, match="below 1"):
        action.fn(context, "", "m", "TOVA", 1.0, False, 8, NEW)
    with pytest.raises(Error, match="not one of the model's 3 layers"):
        kvcache.redraw(state, "layer 7")


def test_the_figures_refuse_mismatched_arrays_and_mark_the_parting_step() -> None:
    from viz import kvcache as vk

    mask = np.zeros((2, 3, 5), bool)
    mask[0, :, :2] = mask[1, 0] = True
    z, rows = vk.kept_rows(mask)
    np.testing.assert_allclose(z, [[1, 1, 0, 0, 0], [1 / 3] * 5])
    assert rows == ["L0", "L1"]
    with pytest.raises(ValueError, match="5 positions"):
        vk.kept_map(mask, ["a"] * 4)
    with pytest.raises(ValueError, match="layers, key-value heads, positions"):
        vk.kept_rows(mask[0])
    long = np.ones((1, 1, 3000), bool)
    long[0, 0, :1500] = False
    fig = vk.kept_map(long, ["t"] * 3000)
    z = np.asarray(fig.data[0].z)
    assert z.shape[1] <= vk.MAX_COLUMNS and z[0, 0] == 0 and z[0, -1] == 1
    fig = vk.divergence(np.array([0.0, 0.2, 0.5]), np.array([True, True, False]), 2, ["a", "b", "c"])
    assert fig.layout.shapes[0].x0 == 1.5 and "step 2" in fig.layout.annotations[0].text
    html = vk.answers(["a", "<b>"], ["a", "c"], 1)
    assert "&lt;b&gt;" in html and "part at step 1" in html
    with pytest.raises(ValueError, match="one value per step"):
        vk.divergence(np.zeros(3), np.zeros(2, bool), None)


def test_the_measured_figure_draws_the_committed_bench_results(tmp_path) -> None:
    """Generate's measured view (tabs/sections/kvcache.py): one line per press from docs/kv-compression.json (what
    bench/kv_compression.py wrote), each starting at ratio 0 from the full cache's accuracy, the command stated; a
    missing or unreadable file says how to make it."""
    import json

    from tabs.sections import kvcache
    from viz import kvcache as vk

    data = json.loads(kvcache.MEASURED.read_text(encoding="utf-8"))
    results = kvcache.measured()
    assert set(data["models"]) >= {"smollm2"} and next(iter(results)).startswith("SmolLM2-135M-Instruct")
    for label, (_entry, res, command) in results.items():
        fig, note = kvcache.measured_view(label, results)
        assert command.startswith("python bench/kv_compression.py") and command in note
        traces = fig.to_plotly_json()["data"]
        assert len(traces) == len(C.PRESSES)
        for tr in traces:
            rows = sorted((r for r in res["rows"] if r["kvpress"] == tr["name"]), key=lambda r: r["ratio"])
            assert list(tr["x"]) == [0.0] + [r["ratio"] for r in rows]
            assert list(tr["y"]) == [res["full_accuracy"]] + [r["accuracy"] for r in rows]
            assert all(0 <= r["kept_share"] <= 1 - r["ratio"] + 0.02 for r in rows)  # the press kept what it says
    (tmp_path / "bad.json").write_text("{not json")
    assert kvcache.measured(tmp_path / "bad.json") == {} and kvcache.measured(tmp_path / "none.json") == {}
    fig, note = kvcache.measured_view(None, {})
    assert fig is None and "python bench/kv_compression.py --out docs/kv-compression.json" in note
    with pytest.raises(ValueError, match="full cache's accuracy"):
        vk.accuracy_curves(res["rows"], 1.5)
