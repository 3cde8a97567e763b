"""Hugging Face Swin folders (models/io/hf_vision.py) read into models.families.swin.Swin: random-weight
SwinForImageClassification folders written by transformers (tests/parity_folders.py: three stages of 3, 1 and 1
blocks, heads 3/2/4, a 16×16 grid in 4×4 windows, so regular, shifted and whole-grid windows all occur), whose pixels,
probabilities and every block's window attention equal transformers' in tests/test_parity.py. Here: the Swin views'
data (window shifts, bias tables), and the refusal of a grid that is not a multiple of the window."""

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


def test_grid_not_a_multiple_of_the_window_is_refused(hf_folders, tmp_path: Path) -> None:
    import models
    from models.io.checkpoint import CheckpointError

    bad = Path(shutil.copytree(hf_folders.get("swin").path, tmp_path / "bad"))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "window_size": 3}))
    with pytest.raises(CheckpointError, match="not a multiple of the 3-token window"):
        models.load(str(bad))
