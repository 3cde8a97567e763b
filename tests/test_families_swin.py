"""Hugging Face Swin folders (models/io/hf_vision.py) read into models.families.swin.Swin: random-weight
SwinForImageClassification folders written by transformers (tests/parity_folders.py: three stages of 3, 1 and 1
blocks, heads 3/2/4, a 16×16 grid in 4×4 windows, so regular, shifted and whole-grid windows all occur; and grids that
are not a multiple of the window, which the model pads), whose pixels, probabilities and every block's window attention
equal transformers' in tests/test_parity.py. Here: the Swin views' data (window shifts, bias tables, the cells of each
window that are padding and the distance view over them), and the refusal of a grid smaller than its window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.families import photo

torch.set_num_threads(2)


def test_swin_windows_and_bias_tables(hf_folders) -> None:
    """Regular, shifted and regular windows, the last grid one window (no shift); the Swin tab's bias tables are
    transformers' tables, (heads, 2w − 1, 2w − 1) per block."""
    built = hf_folders.get("swin")
    ours, hf = built.model, built.ref.model
    result = ours.classify(photo(1))
    shifts = [w.shift for w in result.windows]
    assert len(shifts) == 5 and shifts[:3] == [0, 2, 0] and shifts[-1] == 0
    tables = ours.relative_position_bias_tables()
    table = hf.swin.encoder.layers[0].blocks[1].attention.relative_position_bias.relative_position_bias_table
    assert len(tables) == 5 and tables[1].shape == (3, 7, 7)
    np.testing.assert_allclose(tables[1], table.detach().numpy().T.reshape(3, 7, 7))
    assert all(w.image_cells().all() for w in result.windows)  # multiples of the window: no padding


def test_padded_windows_map_back_onto_the_image(hf_folders) -> None:
    """A grid that is not a multiple of the window (18 × 18 in windows of 5, then 9 × 9, then 5 × 5): each block's
    windows cover the padded grid, ``image_cells`` marks the cells that are tokens (each token exactly once, the
    shift undone), every window row still sums to 1 (padding keys take part, as in transformers), and a centre
    token's map back onto the grid leaves its padding share out; the distance view drops padding."""
    from models.analysis import window_attention_distance
    from viz.swin import window_attention_map

    result = hf_folders.get("swin-padded").model.classify(photo(0))
    grids = [(w.grid, w.shift) for w in result.windows]
    assert grids == [((18, 18), 0), ((18, 18), 2), ((9, 9), 0), ((9, 9), 2), ((5, 5), 0), ((5, 5), 0)]
    for w in result.windows:
        side = -(-w.grid[0] // w.window) * w.window
        cells = w.image_cells()
        assert cells.shape == ((side // w.window) ** 2, w.window ** 2) and cells.sum() == w.grid[0] * w.grid[1]
        np.testing.assert_allclose(w.weights.sum(-1), 1.0, atol=1e-5)
        for query in ((0, 0), (w.grid[0] // 2, w.grid[1] // 2), (w.grid[0] - 1, w.grid[1] - 1)):
            amap, info = window_attention_map(w.weights, w.grid, w.window, w.shift, query, 0)
            assert len(info["cells"]) == cells[info["window"]].sum() and cells[info["window"], info["token"]]
            row = w.weights[info["window"], 0, info["token"]]
            assert info["padding_share"] == pytest.approx(float(row[~cells[info["window"]]].sum()), abs=1e-6)
            assert np.nansum(amap) + info["padding_share"] == pytest.approx(1.0, abs=1e-5)
        if side != w.grid[0] and not w.shift:  # the bottom-right token's window holds padding, which it attends to
            assert 0.0 < info["padding_share"] and len(info["cells"]) < w.window ** 2
    padded = result.windows[0]
    with_cells = window_attention_distance([(padded.weights, padded.window, padded.patch, padded.image_cells())])
    without = window_attention_distance([(padded.weights, padded.window, padded.patch)])
    assert with_cells.shape == without.shape == (1, 2) and np.all(np.isfinite(with_cells))
    assert not np.allclose(with_cells, without)  # padding queries and keys left out change the mean


def test_vision_tab_draws_a_padded_swin(hf_folders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A configured Swin whose grids are not a multiple of the window goes through Vision's handler: every block's
    overlay, its every-head grid, a clicked patch's window and the distance view are drawn; the overlay of the last
    block of stage 1 (9 × 9 in windows of 5, padded to 10) is the window map with the padding left out and its share
    said, and the every-head grid of stage 2 (5 × 5 tokens of 8 pixels, 40 over a 36-pixel image) keeps the image's
    scale."""
    from serving import catalogue, store
    from tabs import vision
    from viz.swin import window_attention_map

    where = hf_folders.get("swin-padded").path
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(where)])
    image = str(tmp_path / "photo.png")
    photo(0).save(image)
    out = vision.classify_image(image, where.name, 3, 3, "0", "CLS → patches", "gradxinput", "", progress=None)
    state = out[7]
    result = state["result"]
    block = result.windows[3]
    assert block.grid == (9, 9) and block.shift == 2
    want, info = window_attention_map(block.weights, block.grid, block.window, block.shift, (4, 4), 0)
    z = np.asarray([t for t in out[1].data if getattr(t, "z", None) is not None][-1].z, dtype=float)
    np.testing.assert_allclose(z, want, atol=1e-6)
    assert out[3] is not None and out[4] is not None
    for layer in range(len(result.windows)):
        overlay, grid_fig = vision.draw_image(result, layer, "mean", "CLS → patches")
        assert overlay is not None and grid_fig is not None
        assert vision.draw_query(result, layer, "max", (17, 17)) is not None  # the bottom-right patch
    _, grid_fig = vision.draw_image(result, 5, "0", "CLS → patches")
    assert result.windows[5].grid == (5, 5) and result.windows[5].patch == 8
    assert grid_fig.data[0].source != vision.vi.image_attention_grid(
        result.image, np.zeros((4, 25)), (5, 5), titles=[f"head {h}" for h in range(4)],
        title="stretched").data[0].source  # not stretched over the image


def test_grid_smaller_than_the_window_is_refused(hf_folders, tmp_path: Path) -> None:
    """transformers shrinks the window to a smaller grid but keeps the full window's bias table (and fails on the
    shapes), torchvision pads: nothing defines what such a folder computes, so it is refused by name."""
    import models
    from models.io.checkpoint import CheckpointError

    bad = Path(shutil.copytree(hf_folders.get("swin-padded").path, tmp_path / "bad"))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "window_size": 7}))  # stage 2: 5 × 5 tokens
    with pytest.raises(CheckpointError, match="stage 2's grid of 5×5 tokens is smaller than the 7-token window"):
        models.load(str(bad))
    (bad / "config.json").write_text(json.dumps({**config, "image_size": 35}))
    with pytest.raises(CheckpointError, match="not a whole number of 2-pixel patches"):
        models.load(str(bad))
