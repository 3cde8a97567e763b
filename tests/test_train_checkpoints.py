"""Every shipped checkpoint folder in checkpoints/ loads through models.load, verifies its manifest, stays within
the size budget and produces attention of the documented shapes (docs/ARCHITECTURE.md §3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIVE = ["translator-en-de", "sst2", "agnews", "vit-fashion", "swin-fashion"]  # trained from scratch
MINILM = ["minilm-agnews", "minilm-sst2"]  # the pretrained encoder, fine-tuned
LM = ["gpt-tiny"]  # the decoder-only language model trained here
VLM = ["vlm-fashion"]  # the own small vision-language model (tests/test_vlm.py runs it)
SHIPPED = FIVE + MINILM + LM + VLM
MB = 1024 * 1024


def existing(name: str) -> Path:
    folder = ROOT / "checkpoints" / name
    assert (folder / "manifest.json").is_file(), f"checkpoints/{name} is missing: the app ships it"
    return folder


def rows_sum_to_one(w: np.ndarray) -> bool:
    return bool(np.allclose(w.sum(-1), 1.0, atol=1e-4))


@pytest.mark.parametrize("name", SHIPPED)
def test_checkpoint_verifies_and_fits_budget(name: str) -> None:
    from models.io.checkpoint import verify

    folder = existing(name)
    files = verify(folder)
    assert any(f.endswith(".safetensors") for f in files)
    for f in folder.iterdir():
        assert f.stat().st_size <= 25 * MB, f
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == 1
    if name in LM:
        assert sum(f.stat().st_size for f in folder.iterdir()) <= 20 * MB


def test_checkpoint_budgets() -> None:
    def size(names: list[str]) -> int:
        return sum(f.stat().st_size for n in names for f in (ROOT / "checkpoints" / n).iterdir())

    assert size(FIVE) <= 60 * MB
    everything = [p.name for p in (ROOT / "checkpoints").iterdir() if p.is_dir()]
    assert size(everything) <= 150 * MB


@pytest.mark.parametrize("name", MINILM)
def test_minilm_records_origin_and_licence(name: str) -> None:
    config = json.loads((existing(name) / "config.json").read_text())
    origin = json.dumps(config).lower()
    assert "all-minilm-l6-v2" in origin and "apache-2.0" in origin


def test_translator_attention_shapes() -> None:
    import models

    existing("translator-en-de")
    m = models.load("translator-en-de")
    c = m.config
    r = m.translate("A man in a red shirt is riding a bike.", beam_size=5)
    assert r.text.strip()
    s, t = len(r.source_tokens), len(r.target_tokens)
    assert r.source_tokens[0] == "<s>" and r.source_tokens[-1] == "</s>" and r.target_tokens[0] == "<s>"
    assert r.attention["encoder"].weights.shape == (c.n_enc_layers, c.n_heads, s, s)
    assert r.attention["decoder"].weights.shape == (c.n_dec_layers, c.n_heads, t, t)
    assert r.attention["cross"].weights.shape == (c.n_dec_layers, c.n_heads, t, s)
    assert all(rows_sum_to_one(a.weights) for a in r.attention.values())
    # the chosen path: one node per emitted token (the search may run on after it finished), each the
    # child of the previous one, ending in a finished </s>
    assert r.beam and len(r.chosen) == t <= len(r.beam)
    for step in range(1, t):
        assert r.beam[step].parents[r.chosen[step]] == r.chosen[step - 1]
    last = r.beam[t - 1]
    assert last.finished[r.chosen[-1]] and last.tokens[r.chosen[-1]] == "</s>"


CLASSIFIERS = [("sst2", 2), ("agnews", 4)] + [(n, 2 if n.endswith("sst2") else 4) for n in MINILM]


@pytest.mark.parametrize("name,n_labels", CLASSIFIERS)
def test_classifier_attention_shapes(name: str, n_labels: int) -> None:
    import models

    existing(name)
    m = models.load(name)
    r = m.classify("The new phone sold out within hours, a great success for the company.")
    n = len(r.tokens)
    first, last = ("[CLS]", "[SEP]") if name.startswith("minilm") else ("<s>", "</s>")
    assert r.tokens[0] == first and r.tokens[-1] == last
    assert len(r.labels) == n_labels and abs(float(r.probs.sum()) - 1) < 1e-5
    assert r.attention["encoder"].weights.shape == (m.config.n_layers, m.config.n_heads, n, n)
    assert rows_sum_to_one(r.attention["encoder"].weights)
    config = json.loads((ROOT / "checkpoints" / name / "config.json").read_text())
    assert r.pooling == config["config"]["pooling"] == "mean"  # all four read the mean of their tokens


def fashion_like() -> np.ndarray:
    img = np.zeros((28, 28), np.uint8)
    img[4:24, 8:20] = 200  # a bright block on black, like a garment
    return img


def test_vit_attention_shapes() -> None:
    import models

    existing("vit-fashion")
    m = models.load("vit-fashion")
    c = m.config
    r = m.classify(fashion_like())
    p = (c.image_size // c.patch) ** 2
    assert r.grid == (c.image_size // c.patch,) * 2 and len(r.labels) == 10
    assert r.attention["encoder"].weights.shape == (c.depth, c.heads, 1 + p, 1 + p)
    assert rows_sum_to_one(r.attention["encoder"].weights)


def test_swin_window_attention_shapes() -> None:
    import models

    existing("swin-fashion")
    m = models.load("swin-fashion")
    c = m.config
    r = m.classify(fashion_like())
    assert len(r.windows) == sum(c.depths) and len(r.labels) == 10
    for w in r.windows:
        rows = -(-w.grid[0] // c.window)  # windows cover the (padded) grid
        cols = -(-w.grid[1] // c.window)
        assert w.weights.shape == (rows * cols, c.heads[w.stage], c.window**2, c.window**2)
        assert rows_sum_to_one(w.weights)
