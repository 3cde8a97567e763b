"""Every analysis the app runs on one model, as arrays: what ``bench/device.py`` compares between the CPU and a
device, and what ``tests/test_device.py`` runs with the default device set to ``meta`` (a tensor made without
``device=`` then lands on ``meta`` and the first operation that meets the model's tensors fails).

``run_all(model, kind)`` -> ``{"<analysis>": numpy array}``; ``kind`` is the model's family as ``KINDS`` names it
(the class name). Inputs are fixed (seeded), so two runs of the same weights on two devices can be compared
key by key (``max_abs_diff``). Imports no gradio and no transformers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

TEXT = "A man in a blue shirt is riding a bicycle down the street."
KINDS = ("GPT", "Mamba", "TextClassifier", "BertClassifier", "Translator", "ViT", "Swin")


def _image(model: nn.Module) -> np.ndarray:
    """A fixed 28×28 grey image (or the model's own size, RGB) with a light square on a dark ground."""
    size = int(getattr(model.config, "image_size", 28) or 28)
    channels = int(getattr(model.config, "channels", 1) or 1)
    img = np.zeros((size, size) if channels == 1 else (size, size, 3), np.uint8)
    img[size // 4 : 3 * size // 4, size // 3 : 2 * size // 3] = 200
    return img


def _gpt(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    from models.decoding import fastgen, lockstep
    from models.inspect.decompose import attention_scores, decompose_score
    from models.inspect.patching import patch_sweep, repeated_pair, sink_ablation

    ids = model.repeated_tokens(6, seed=0)  # BOS + 6 + the same 6: induction heads have something to do
    t = len(ids)
    out: dict[str, np.ndarray] = {}
    g = model.generate(ids[:5], max_new_tokens=6)
    out["generate_ids"] = np.array(g.ids)
    out["generate_attention"] = g.attention["decoder"].weights.astype(np.float32)
    out["generate_surprisal"] = np.nan_to_num(g.surprisal, nan=0.0)
    f = fastgen.generate(model, ids[:5], max_new_tokens=6)
    out["fastgen_ids"] = np.array(f.ids)
    out["fastgen_attention"] = f.attention["decoder"].weights.astype(np.float32)
    many = lockstep.generate_many(model, [lockstep.GenerateRequest(ids[:4], 4), lockstep.GenerateRequest(ids[:6], 3)])
    for i, r in enumerate(many):
        if isinstance(r, Exception):
            raise r
        out[f"lockstep{i}_attention"] = r.attention["decoder"].weights.astype(np.float32)
    out["next_token_probs"] = model.next_token_probs(ids)
    mask = torch.ones(model.config.n_layers, model.config.n_heads, device=model.embed.weight.device)
    mask[0, 0] = 0.0
    out["ablated_probs"] = model.next_token_probs(ids, head_mask=mask)
    lens = model.logit_lens(ids)
    out["logit_lens"] = lens.top_probs
    out["logit_lens_target"] = lens.target_probs
    out["head_roles"] = np.stack(list(model.head_role_scores(n=4).values()))
    split = decompose_score(model, ids, model.config.n_layers - 1, 0, t - 1, 1)
    out["decompose_table"] = split.table
    out["decompose_row"] = split.softmax_row
    out["attention_scores"] = np.nan_to_num(attention_scores(model, ids), neginf=0.0)
    clean, corrupted = repeated_pair(model, 4, seed=0)
    for sweep in ("heads", "positions"):
        out[f"patch_{sweep}"] = patch_sweep(model, clean, corrupted, sweep).restored
    sink = sink_ablation(model, ids, 0, 0)
    out["sink_after"] = sink.attention_after
    return out


def _classifier(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    from models.inspect.attribution import explain, methods_for
    from models.inspect.decompose import attention_scores, decompose_score
    from models.inspect.patching import patch_sweep, sink_ablation

    r = model.classify(TEXT)
    out = {"classify_probs": np.asarray(r.probs), "classify_attention": r.attention["encoder"].weights}
    many = model.classify_many([TEXT, "the plot is thin ."])
    out["classify_many_probs"] = np.stack([np.asarray(m.probs) for m in many])
    for method in methods_for(model):
        out[f"attribution_{method}"] = explain(model, TEXT, method, steps=8).values
    ids = _text_ids(model)
    split = decompose_score(model, ids, 0, 0, 1, 2)
    out["decompose_table"] = split.table
    out["attention_scores"] = attention_scores(model, ids)
    corrupted = list(ids)
    corrupted[2] = ids[3]
    try:
        out["patch_heads"] = patch_sweep(model, ids, corrupted, "heads").restored
    except ValueError:  # the two inputs answer alike on these weights: nothing to restore
        pass
    out["sink_after"] = sink_ablation(model, ids, 0, 0).attention_after
    return out


def _text_ids(model: nn.Module) -> list[int]:
    """TEXT's first ids as ``classify`` (or the translator's encoder) sees them, specials included."""
    from models.inspect.attribution import _prepare_text

    return list(_prepare_text(model, TEXT).ids)[:12]


def _translator(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    from models.inspect.decompose import attention_scores, decompose_score

    out: dict[str, np.ndarray] = {}
    r = model.translate(TEXT, beam_size=3, max_len=8)
    for part in ("encoder", "decoder", "cross"):
        out[f"translate_{part}"] = r.attention[part].weights
    out["translate_scores"] = np.concatenate([np.asarray(step.scores, np.float64) for step in r.beam])
    ids = _text_ids(model)
    split = decompose_score(model, ids, 0, 0, 1, 2)
    out["decompose_table"] = split.table
    out["attention_scores"] = attention_scores(model, ids)
    return out


def _vision(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    from models.inspect.attribution import explain, methods_for

    img = _image(model)
    r = model.classify(img)
    out = {"classify_probs": np.asarray(r.probs)}
    if "encoder" in r.attention:
        out["classify_attention"] = r.attention["encoder"].weights
    for method in methods_for(model):
        out[f"attribution_{method}"] = explain(model, img, method, steps=8).values
    return out


def _mamba(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    """What Generate shows for a Mamba: the generation through the recurrent state, its implicit attention
    (channels averaged, and one channel), the next-token distribution and the logit lens."""
    ids = model.repeated_tokens(6, seed=0)
    g = model.generate(ids[:5], max_new_tokens=6)
    lens = model.logit_lens(ids)
    return {"generate_ids": np.array(g.ids), "generate_attention": g.attention["decoder"].weights,
            "generate_surprisal": np.nan_to_num(g.surprisal, nan=0.0),
            "implicit_attention_channel": model.implicit_attention(ids, channel=1),
            "next_token_probs": model.next_token_probs(ids),
            "logit_lens": lens.top_probs, "logit_lens_target": lens.target_probs}


def _vlm(model: nn.Module, quick: bool) -> dict[str, np.ndarray]:
    """What the Image + text tab shows for a vision-language model: the answer, the language model's and the tower's
    attention, the relevance of each new token and the logit lens on the image tokens."""
    img = _image(model)
    r = model.describe(img, model.chat_prompt("describe the image ."), max_new_tokens=4)
    ids, probs = model.image_lens(r)
    queries = list(range(r.prompt_len - 1, len(r.ids) - 1))
    return {"describe_ids": np.array(r.ids), "describe_attention": r.attention,
            "describe_vision_attention": r.vision_attention, "image_relevance": model.image_relevance(r, queries),
            "image_lens_ids": ids, "image_lens_probs": probs}


RUNNERS: dict[str, Callable[[nn.Module, bool], dict[str, np.ndarray]]] = {
    "GPT": _gpt, "Mamba": _mamba, "TextClassifier": _classifier, "BertClassifier": _classifier,
    "Translator": _translator, "ViT": _vision, "Swin": _vision, "VLM": _vlm, "Llava": _vlm, "Idefics3": _vlm}


def run_all(model: nn.Module, quick: bool = False) -> dict[str, np.ndarray]:
    """Every analysis of ``model``'s family on fixed inputs, as float64 numpy arrays keyed by name."""
    kind = type(model).__name__
    if kind not in RUNNERS:
        raise TypeError(f"no analyses listed for a {kind}")
    return {k: np.asarray(v, dtype=np.float64) for k, v in RUNNERS[kind](model, quick).items()}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """Per key the largest |a − b| (inf where the shapes differ or a key is missing on one side)."""
    out = {}
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b or a[k].shape != b[k].shape:
            out[k] = float("inf")
        else:
            out[k] = float(np.max(np.abs(a[k] - b[k]), initial=0.0))
    return out
