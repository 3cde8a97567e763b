"""The playground's numpy formula against the model package and against first principles."""

from __future__ import annotations

import numpy as np
import pytest

from viz import playground as pg


@pytest.mark.parametrize("mask", pg.MASKS)
@pytest.mark.parametrize("scale", [True, False])
def test_steps_match_model_attention(mask: str, scale: bool) -> None:
    torch = pytest.importorskip("torch")
    from models.blocks.attention import scaled_dot_product

    s = pg.compute_steps(seq_len=7, d_k=5, seed=3, mask=mask, scale=scale)
    out, weights = scaled_dot_product(torch.tensor(s.q), torch.tensor(s.k), torch.tensor(s.v),
                                      mask=torch.tensor(s.allowed), scale=s.scale)
    np.testing.assert_allclose(s.weights, weights.numpy(), atol=1e-10)
    np.testing.assert_allclose(s.out, out.numpy(), atol=1e-10)
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(s.q), torch.tensor(s.k), torch.tensor(s.v), attn_mask=torch.tensor(s.allowed), scale=s.scale)
    np.testing.assert_allclose(s.out, ref.numpy(), atol=1e-10)


def test_masks_and_rows() -> None:
    s = pg.compute_steps(seq_len=6, d_k=4, seed=0, mask="causal")
    assert np.allclose(np.triu(s.weights, 1), 0)
    np.testing.assert_allclose(s.weights.sum(1), 1)
    p = pg.compute_steps(seq_len=8, d_k=4, seed=0, mask="padding")
    assert np.allclose(p.weights[:, -2:], 0) and np.all(p.weights[:, :-2] > 0)
    assert pg.compute_steps(seq_len=1, d_k=1, mask="padding").weights.tolist() == [[1.0]]


def test_scale_keeps_entropy_and_its_absence_collapses_it() -> None:
    c = pg.entropy_vs_dk(seq_len=16, dks=(1, 16, 256), trials=512)
    assert c["unscaled"][2] < 0.5 * c["scaled"][2]  # saturated softmax without 1/√d_k
    assert abs(c["scaled"][2] - c["scaled"][0]) < 0.15  # roughly flat with it
    assert np.all(c["scaled"] <= c["max"] + 1e-9)


@pytest.mark.parametrize("bad", [dict(seq_len=0), dict(seq_len=pg.MAX_LEN + 1), dict(d_k=0), dict(mask="diag")])
def test_bad_settings_raise_value_error(bad: dict) -> None:
    with pytest.raises(ValueError):
        pg.compute_steps(**bad)


def test_figures_label_every_step() -> None:
    fig = pg.playground_figure(pg.compute_steps(seq_len=5, d_k=3, mask="causal"))
    titles = [a.text for a in fig.layout.annotations]
    assert titles[4].startswith("1 · scores") and titles[7].startswith("4 · weights")
    masked = np.array(fig.data[6].z, dtype=float)
    assert np.isnan(masked[0, 1]) and not np.isnan(masked[1, 0])
    assert len(fig.to_json()) < 200_000
