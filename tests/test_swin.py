"""models/families/swin.py: window geometry against the Swin paper's construction, fused = explicit attention,
and the ImageResult of the small Fashion-MNIST model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.families.swin import (
    Swin,
    SwinConfig,
    relative_position_index,
    shifted_window_mask,
    shifted_window_regions,
    window_geometry,
    window_partition,
    window_reverse,
)
from models.outputs import ImageResult

torch.set_num_threads(2)


# ------------------------------------------------------------------------------------------ geometry
@pytest.mark.parametrize("B, H, W, C, window", [(2, 14, 14, 3, 7), (1, 8, 12, 5, 4), (3, 6, 9, 2, 3)])
def test_window_partition_round_trip(B: int, H: int, W: int, C: int, window: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(B, H, W, C)
    windows = window_partition(x, window)
    nh, nw = H // window, W // window
    assert windows.shape == (B * nh * nw, window, window, C)
    # window k of image b is the block at row (k // nw), column (k % nw): row-major order
    b, k = B - 1, nh * nw - 1
    r, c = divmod(k, nw)
    expected = x[b, r * window : (r + 1) * window, c * window : (c + 1) * window]
    torch.testing.assert_close(windows[b * nh * nw + k], expected, rtol=0, atol=0)
    torch.testing.assert_close(window_reverse(windows, window, H, W), x, rtol=0, atol=0)


@pytest.mark.parametrize("window", [2, 3, 7])
def test_relative_position_index(window: int) -> None:
    index = relative_position_index(window)
    N, side = window * window, 2 * window - 1
    assert index.shape == (N, N) and index.dtype == torch.long
    for i in range(N):
        for j in range(N):
            (ri, ci), (rj, cj) = divmod(i, window), divmod(j, window)
            assert index[i, j] == (ri - rj + window - 1) * side + (ci - cj + window - 1)
    assert set(index.flatten().tolist()) == set(range(side * side))  # every table row is used


def paper_mask(H: int, W: int, window: int, shift: int) -> np.ndarray:
    """The reference construction (Liu et al. 2021, Fig. 4 and their code): label the shifted grid with
    3×3 slices, cut it into windows, and mask pairs with different labels by −100. Written with numpy
    and explicit loops, independent of models/families/swin.py."""
    Hp, Wp = -(-H // window) * window, -(-W // window) * window
    img = np.zeros((Hp, Wp))
    count = 0
    for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            img[hs, ws] = count
            count += 1
    masks = []
    for r in range(0, Hp, window):
        for c in range(0, Wp, window):
            ids = img[r : r + window, c : c + window].reshape(-1)
            masks.append(np.where(ids[:, None] == ids[None, :], 0.0, -100.0))
    return np.stack(masks)


def wrap_mask(H: int, W: int, window: int, shift: int) -> np.ndarray:
    """The meaning of the mask, stated directly: after rolling the grid by −shift, a token at shifted
    position (i, j) came from ((i + shift) mod Hp, (j + shift) mod Wp). Two tokens of one window may
    attend to each other only if neither or both wrapped around, in rows and in columns."""
    Hp, Wp = -(-H // window) * window, -(-W // window) * window
    masks = []
    for r in range(0, Hp, window):
        for c in range(0, Wp, window):
            tokens = [(i, j) for i in range(r, r + window) for j in range(c, c + window)]
            wrapped = [(i + shift >= Hp, j + shift >= Wp) for i, j in tokens]
            masks.append([[0.0 if a == b else -100.0 for b in wrapped] for a in wrapped])
    return np.array(masks)


SETTINGS = [(14, 14, 7, 3), (8, 8, 4, 2), (14, 21, 7, 3), (21, 14, 7, 2), (12, 8, 4, 1), (10, 13, 4, 2),
            (56, 56, 7, 3)]


@pytest.mark.parametrize("H, W, window, shift", SETTINGS)
def test_shifted_window_mask_equals_paper_construction(H: int, W: int, window: int, shift: int) -> None:
    mask = shifted_window_mask(H, W, window, shift)
    nW = (-(-H // window)) * (-(-W // window))
    assert mask.shape == (nW, window * window, window * window) and mask.dtype == torch.float32
    np.testing.assert_array_equal(mask.numpy(), paper_mask(H, W, window, shift))
    np.testing.assert_array_equal(mask.numpy(), wrap_mask(H, W, window, shift))
    assert set(np.unique(mask.numpy())) == {0.0, -100.0}


def test_region_ids() -> None:
    ids = shifted_window_regions(14, 14, 7, 3)
    assert ids.shape == (14, 14) and set(ids.unique().tolist()) == set(range(9))
    assert ids[0, 0] == 0 and ids[-1, -1] == 8 and ids[7, 0] == 3 and ids[0, 7] == 1
    # the first window holds no wrapped-around tokens: all of it is region 0
    assert (ids[:7, :7] == 0).all()


@pytest.mark.parametrize("grid, window, shift", [(8, 4, 2), (9, 4, 2), (7, 7, 3), (5, 1, 0)])
def test_window_geometry(grid: int, window: int, shift: int) -> None:
    geo = window_geometry(grid, window, shift)
    side = -(-grid // window) * window
    assert geo.side == side and geo.windows == (side // window) ** 2
    np.testing.assert_array_equal(geo.masks, shifted_window_mask(side, side, window, shift).numpy())
    np.testing.assert_array_equal(geo.regions, shifted_window_regions(side, side, window, shift).numpy())
    assert geo.rolled[0, 0] == geo.ids[shift, shift]  # torch.roll(x, -shift): row `shift` comes first
    for k in range(geo.windows):
        assert geo.blocked(k) == int((geo.masks[k] == -100.0).sum())
    if shift == 0:
        assert sum(geo.blocked(k) for k in range(geo.windows)) == 0


def test_window_geometry_counts_and_refusals() -> None:
    geo = window_geometry(8, 4, 2)
    # 2×2 windows; the last window mixes 4 regions of 2×2 tokens: 16 tokens, each blocked from 12 others
    assert geo.windows == 4 and geo.blocked(0) == 0 and geo.blocked(3) == 16 * 12
    assert geo.blocked(1) == geo.blocked(2) == 2 * 8 * 8  # two regions of 8 tokens
    for bad in [(8, 4, 4), (8, 0, 0), (0, 4, 1), (8, 4, -1)]:
        with pytest.raises(ValueError, match="shift < window"):
            window_geometry(*bad)


# ------------------------------------------------------------------------------------------- model
CONFIGS = {
    "fashion": SwinConfig(),  # 28 -> 14×14 tokens, 2×2 windows, then 7×7 in one window
    "padded": SwinConfig(image_size=20, patch=2, embed_dim=16, depths=(2, 2), heads=(2, 4), window=4),
    "odd-merge": SwinConfig(image_size=18, patch=2, embed_dim=16, depths=(2, 1), heads=(2, 2), window=3),
}


@pytest.fixture(scope="module")
def models() -> dict[str, Swin]:
    torch.manual_seed(0)
    return {name: Swin(cfg).eval() for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_equals_explicit(models: dict[str, Swin], name: str) -> None:
    model = models[name]
    torch.manual_seed(1)
    x = torch.randn(3, model.config.in_channels, model.config.image_size, model.config.image_size)
    with torch.no_grad():
        fused = model(x)
        explicit, attention = model(x, need_weights=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    assert len(attention) == sum(model.config.depths)
    for a in attention:
        torch.testing.assert_close(a.weights.sum(-1), torch.ones_like(a.weights[..., 0]), atol=1e-5, rtol=0)
        assert (a.weights >= 0).all()


def test_shifted_blocks_keep_regions_apart(models: dict[str, Swin]) -> None:
    """In a shifted block, keys of another region get weight ~e^−100: effectively zero."""
    model = models["fashion"]
    with torch.no_grad():
        _, attention = model(torch.randn(1, 1, 28, 28), need_weights=True)
    shifted = attention[1]
    assert shifted.shift == 3
    blocked = shifted_window_mask(14, 14, 7, 3) < 0  # (nW, N, N)
    assert shifted.weights[0][blocked.unsqueeze(1).expand_as(shifted.weights[0])].max() < 1e-30


def test_classify_returns_windows(models: dict[str, Swin]) -> None:
    model = models["fashion"]
    model.labels = [f"class {i}" for i in range(10)]
    img = np.zeros((40, 30), np.uint8)
    img[10:30, 5:25] = 200
    result = model.classify(img)
    assert isinstance(result, ImageResult)
    assert result.image.shape == (28, 28) and result.image.dtype == np.uint8
    assert result.labels == model.labels and result.probs.shape == (10,)
    assert abs(float(result.probs.sum()) - 1) < 1e-5
    assert result.grid == (14, 14) and result.patch == 2 and result.attention == {}
    geometry = [(w.stage, w.block, w.weights.shape, w.window, w.shift, w.grid, w.patch) for w in result.windows]
    assert geometry == [
        (0, 0, (4, 3, 49, 49), 7, 0, (14, 14), 2),
        (0, 1, (4, 3, 49, 49), 7, 3, (14, 14), 2),
        (1, 0, (1, 6, 49, 49), 7, 0, (7, 7), 4),
        (1, 1, (1, 6, 49, 49), 7, 0, (7, 7), 4),  # one window covers the 7×7 grid: no shift (as torchvision)
    ]
    for w in result.windows:
        assert w.weights.dtype == np.float32
        np.testing.assert_allclose(w.weights.sum(-1), 1.0, atol=1e-5)
    assert model.training is False


def test_a_first_stage_patch_maps_to_the_token_of_each_stage(models: dict[str, Swin]) -> None:
    result = models["fashion"].classify(np.zeros((28, 28), np.uint8))
    first, merged = result.windows[0], result.windows[2]  # 14×14 tokens of 2 px, then 7×7 of 4 px
    for patch in [(0, 0), (3, 1), (13, 13), (6, 9)]:
        y, x = result.patch_centre(patch)
        assert first.token_at(y, x) == patch
        assert merged.token_at(y, x) == (patch[0] // 2, patch[1] // 2)


def test_relative_position_bias_tables_are_the_looked_up_bias(models: dict[str, Swin]) -> None:
    model = models["fashion"]
    tables = model.relative_position_bias_tables()
    blocks = model.blocks()
    assert len(tables) == len(blocks) == sum(model.config.depths)
    w = model.config.window
    for table, block in zip(tables, blocks):
        assert table.shape == (block.attn.heads, 2 * w - 1, 2 * w - 1) and table.dtype == np.float32
        bias = block.attn.relative_position_bias().detach().numpy()  # (heads, N, N)
        # query token (0, 0), key token (r, c): offset (−r, −c) -> table entry [w−1−r, w−1−c]
        for r, c in [(0, 0), (0, 1), (2, 5), (w - 1, w - 1)]:
            np.testing.assert_array_equal(bias[:, 0, r * w + c], table[:, w - 1 - r, w - 1 - c])


def test_training_step_runs() -> None:
    torch.manual_seed(0)
    model = Swin(CONFIGS["padded"]).train()
    x, y = torch.randn(2, 1, 20, 20), torch.tensor([1, 2])
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert model.stages[0][1].attn.relative_position_bias_table.grad is not None
    assert torch.isfinite(loss)


def test_config_round_trips_through_json_lists() -> None:
    cfg = SwinConfig(depths=[2, 2], heads=[3, 6])  # type: ignore[arg-type]  # as read from config.json
    assert cfg.depths == (2, 2) and cfg.heads == (3, 6) and cfg.shift == 3
    with pytest.raises(ValueError):
        SwinConfig(depths=(2, 2), heads=(3,))
