"""Mamba (models/families/mamba.py): its implicit attention (Ali, Zimerman & Wolf 2024) against the scan it is read
from, on the random-weight folder whose parity with transformers' MambaForCausalLM is tests/test_parity.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.families.mamba import Mamba, heatmap, implicit_attention

IDS = [5, 17, 33, 2, 40, 41, 7, 9, 11, 12, 13, 14]


@pytest.fixture(scope="module")
def pair(hf_folders):
    """transformers' MambaForCausalLM and ours, read from tests/parity_folders.py's folder (their logits, hidden
    states and greedy ids against each other are tests/test_parity.py's)."""
    built = hf_folders.get("mamba")
    return built.ref.model, built.model


def test_implicit_attention_reproduces_the_scan(pair) -> None:
    """Σ_j α[d, t, j] · u_j[d] + D[d] · u_t[d] equals the scan's output y_t[d] within 1e-4, every layer, channel and
    position; α is causal (zero above the diagonal); one channel alone is that channel's slice."""
    _, ours = pair
    with torch.no_grad():
        out = ours(torch.tensor([IDS]), keep_trace=True)
        for layer, trace in enumerate(out.traces):
            alpha = implicit_attention(trace, ours._a(layer), chunk=7)  # (E, T, T), 7: chunks that do not divide E
            assert alpha.shape == (120, len(IDS), len(IDS))
            y = torch.einsum("dtj,jd->td", alpha, trace.u) + trace.u * ours.blocks[layer].mixer.D
            torch.testing.assert_close(y, trace.y, atol=1e-4, rtol=0)
            assert alpha.triu(1).abs().max() == 0
            one = implicit_attention(trace, ours._a(layer), channel=33)
            torch.testing.assert_close(one[0], alpha[33], atol=1e-6, rtol=0)
            assert trace.y.abs().max() > 0.1  # a real signal, not zeros agreeing


def test_implicit_attention_heatmaps(pair) -> None:
    """Generate's maps are (L, 1, T, T): per layer |α| averaged over channels, rows summing to 1, causal; one
    channel's map differs from the average."""
    _, ours = pair
    result = ours.generate(IDS, max_new_tokens=4)
    maps = result.attention["decoder"].weights
    t = len(result.ids)
    assert maps.shape == (3, 1, t, t)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(maps[:, 0], 1)).max() == 0
    with torch.no_grad():
        traces = ours(torch.tensor([result.ids]), keep_trace=True).traces
        want = heatmap(implicit_attention(traces[2], ours._a(2))).numpy()
    np.testing.assert_allclose(maps[2, 0], want, atol=1e-6)
    one = ours.implicit_attention(result.ids, channel=5)
    assert one.shape == maps.shape and not np.allclose(one, maps)
    with pytest.raises(ValueError, match="channel"):
        ours.implicit_attention(IDS, channel=120)


def test_mamba_logit_lens_and_refusals(pair) -> None:
    """The logit lens's last layer is the model's own prediction; a head mask is refused in words."""
    _, ours = pair
    lens = ours.logit_lens(IDS)
    assert lens.top_probs.shape == (3, len(IDS))
    with torch.no_grad():
        final = torch.softmax(ours(torch.tensor([IDS])).logits[0], -1)
    np.testing.assert_allclose(lens.top_probs[-1], final.max(-1).values.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="no attention heads"):
        ours.next_token_probs(IDS, head_mask=torch.ones(3, 1))


def test_mamba_context_is_capped(pair) -> None:
    """A prompt longer than MAX_TOKENS keeps its last tokens, with the notice saying so (the implicit attention
    grows as T²·d_state per channel); the chunked α equals the unchunked one."""
    from models.families.recurrent import MAX_TOKENS

    _, ours = pair
    ids, new, notice = ours.prepare_prompt(list(range(1, 300)), 5)
    assert len(ids) + new == MAX_TOKENS and ids[-1] == 299 and "shortened" in notice
    with torch.no_grad():
        trace = ours(torch.tensor([IDS]), keep_trace=True).traces[0]
        torch.testing.assert_close(implicit_attention(trace, ours._a(0), chunk=1),
                                   implicit_attention(trace, ours._a(0)), atol=1e-7, rtol=0)


def test_wide_mamba_averages_a_channel_sample() -> None:
    """With more than MAP_CHANNELS channels the averaged map reads MAP_CHANNELS of them, evenly spaced from the first
    to the last: the map equals the heatmap of exactly those channels, and differs from the all-channel average."""
    from models.families.mamba import MAP_CHANNELS, MambaConfig

    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=50, d_model=96, n_layers=1, d_state=4)).eval()  # E = 192
    chans = model.map_channels()
    assert len(chans) == MAP_CHANNELS and chans[0] == 0 and chans[-1] == 191 and chans == sorted(set(chans))
    ids = [3, 7, 9, 11, 4, 8]
    with torch.no_grad():
        trace = model(torch.tensor([ids]), keep_trace=True).traces[0]
        want = heatmap(implicit_attention(trace, model._a(0), channels=chans)).numpy()
        everything = heatmap(implicit_attention(trace, model._a(0))).numpy()
    got = model.implicit_attention(ids)[0, 0]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert not np.allclose(got, everything, atol=1e-6)
