"""The shipped mamba-tiny (train/mamba.py): it verifies and loads as models.families.mamba.Mamba, reads text with
gpt-tiny's own SentencePiece model (byte for byte: lesson 9 compares the two on the same pieces), has learned
something (perplexity on the project's example captions far below the vocabulary's), generates with its implicit
attention, and its metrics.json records the command and the validation perplexity beside gpt-tiny's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "checkpoints" / "mamba-tiny"


def test_mamba_tiny_loads_with_gpt_tiny_tokenizer_and_has_learned() -> None:
    import models
    from examples import sentences
    from models.families.mamba import Mamba
    from models.io.checkpoint import verify

    assert (FOLDER / "manifest.json").is_file(), "checkpoints/mamba-tiny is missing: the app ships it"
    verify(FOLDER)
    assert sum(f.stat().st_size for f in FOLDER.iterdir()) <= 20 * 1024 * 1024
    files = json.loads((FOLDER / "manifest.json").read_text())["files"]
    gpt = json.loads((ROOT / "checkpoints" / "gpt-tiny" / "manifest.json").read_text())["files"]
    assert files["tokenizer.model"] == gpt["tokenizer.model"]
    net = models.load("mamba-tiny")
    assert isinstance(net, Mamba) and net.config.vocab_size == 4096
    nll = n = 0.0
    with torch.no_grad():
        for text in sentences.TRANSLATE:
            ids = torch.tensor([net.encode_prompt(text)[0]])
            logits = net(ids).logits[0, :-1]
            nll += float(F.cross_entropy(logits.float(), ids[0, 1:], reduction="sum"))
            n += ids.size(1) - 1
    assert math.exp(nll / n) < 400  # a uniform guess: 4,096
    r = net.generate(sentences.TRANSLATE[0], max_new_tokens=6)
    w = r.attention["decoder"].weights  # (L, 1, T, T): |α| over channels, rows divided by their sum
    assert w.shape == (net.config.n_layers, 1, len(r.tokens), len(r.tokens))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-4)
    assert np.abs(np.triu(w, 1)).max() == 0


def test_mamba_tiny_records_how_it_was_trained() -> None:
    record = json.loads((FOLDER / "metrics.json").read_text())["training"]
    assert record["command"].startswith("python -m train.mamba ")
    rebuild = json.loads((ROOT / "checkpoints" / "rebuild.json").read_text())["models"]["mamba-tiny"]
    assert rebuild["command"].split()[:3] == ["python", "-m", "train.mamba"]
    val = record["validation"]
    parts = [val[f"val_ppl_{s}"] for s in ("multi30k", "agnews", "sst2")]
    assert min(parts) <= val["val_ppl"] <= max(parts)  # the pooled perplexity lies between its sources'
    gpt = json.loads((ROOT / "checkpoints" / "gpt-tiny" / "metrics.json").read_text())["training"]["validation"]
    assert gpt["split"].split(";")[0] in val["split"]  # the same validation text as gpt-tiny's
