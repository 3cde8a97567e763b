"""Faithfulness of the five attribution methods (models/inspect/attribution.py) against a random ranking, same run.

Text (``sst2`` and ``minilm-sst2`` on SST-2 dev, ``agnews`` on the first 1,000 lines of AG News test): ERASER
comprehensiveness and sufficiency (DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
Models", §4.2 and the AOPC variant). For the predicted class j, the n non-special tokens ranked by the signed
attribution and r_k their top ⌈k·n⌉ (at least 1) for k in B = {1, 5, 10, 20, 50} %:

    comprehensiveness = mean_k [p_j(x) − p_j(x \\ r_k)]    (r_k deleted; higher: the ranking found what matters)
    sufficiency       = mean_k [p_j(x) − p_j(r_k)]        (r_k alone; lower: it is enough on its own)

with the special tokens kept in both. Images (``vit-fashion``, the first 1,000 Fashion-MNIST t10k images):
deletion and insertion AUC (Petsiuk et al. 2018, "RISE", §4.1), 10 points from 0 to all 49 patches:
deletion sets the top patches to the training set's mean pixel (lower AUC is better); insertion starts from a
blurred copy (Petsiuk's canvas; the same blur as the integrated-gradients baseline, which favours that method
somewhat) and puts the top patches back (higher is better). Every mean has a 95 % percentile bootstrap
interval over the examples. ``random`` ranks by a seeded random permutation per example: the baseline.

Also: the rank agreement between methods (Spearman's ρ over the non-special tokens or patches, mean over the
examples), and the model-randomisation sanity check (Adebayo et al. 2018, "Sanity Checks for Saliency Maps",
§3, cascading): the weights are re-initialised from the top (head, then each layer from the last, then the
embeddings), cumulatively, and the ρ between each randomised model's attributions (same target class) and the
trained model's is reported per step; a method that explains the model should lose its correlation.

    python bench/faithfulness.py [--limit N] [--models sst2,minilm-sst2,agnews,vit-fashion] [--sanity 30]

The models are loaded with ``models.load`` and their large linear layers fp16-packed, as the app's model store
serves them. Last stdout line: one JSON object, ``models`` -> name -> ``methods`` -> method -> metric ->
``{"mean", "ci"}``, plus ``agreement``, ``sanity``, ``accuracy`` and timings.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BINS = (0.01, 0.05, 0.10, 0.20, 0.50)  # ERASER's AOPC bins (DeYoung et al. 2020)
CURVE_POINTS = 10  # Petsiuk et al. 2018
MODELS = ("sst2", "minilm-sst2", "agnews", "vit-fashion")
DATA = {"sst2": "sst2", "minilm-sst2": "sst2", "agnews": "agnews", "vit-fashion": "fashion"}
AGNEWS_LINES = 1000
FASHION_IMAGES = 1000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- statistics
def bootstrap(values: Sequence[float], resamples: int, seed: int) -> dict[str, Any]:
    """Mean and 95 % percentile bootstrap interval over the examples."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "ci": [float("nan"), float("nan")]}
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {
        "mean": round(float(v.mean()), 5),
        "ci": [round(float(min(lo, v.mean())), 5), round(float(max(hi, v.mean())), 5)],
    }


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n−1 with ties given their average rank (as scipy.stats.rankdata − 1)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=r)
    return (sums / counts)[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ; NaN when either side is constant or there are fewer than 3 items."""
    if len(a) < 3:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def nanmean(values: Sequence[float]) -> float | None:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return round(float(v.mean()), 4) if v.size else None


# ---------------------------------------------------------------------------------------------- data
def load_texts(data_dir: Path, task: str, labels: list[str], limit: int | None) -> tuple[list[str], list[int]]:
    from train.data import label_ids, read_tsv

    path = data_dir / ("sst2/dev.tsv" if task == "sst2" else "agnews/test.tsv")
    texts, raw = read_tsv(path)
    if task == "agnews":
        texts, raw = texts[:AGNEWS_LINES], raw[:AGNEWS_LINES]
    n = len(texts) if limit is None else min(limit, len(texts))
    return texts[:n], label_ids(raw[:n], labels, path)


def load_images(data_dir: Path, limit: int | None) -> tuple[np.ndarray, np.ndarray, float]:
    """(first t10k images uint8 (N, 28, 28), labels, the training images' mean pixel in [0, 1])."""
    from train.data import load_fashion

    split = load_fashion(data_dir)
    x, y = split["test"]
    n = FASHION_IMAGES if limit is None else min(limit, FASHION_IMAGES)
    return x[:n], y[:n], float(split["train"][0].mean() / 255.0)


def explain_all(
    model: Any, inputs: list[Any], method: str, targets: list[int] | None, steps: int, batch: int
) -> list[Any]:
    """``explain_batch`` over every input, ``batch`` at a time, texts grouped by length (less padding)."""
    from models.inspect import attribution as A

    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]) if isinstance(inputs[i], list) else 0)
    out: list[Any] = [None] * len(inputs)
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        got = A.explain_batch(
            model, [inputs[i] for i in idx], method, None if targets is None else [targets[i] for i in idx], steps=steps
        )
        for i, a in zip(idx, got):
            out[i] = a
    return out


# ---------------------------------------------------------------------------------------------- model randomisation
def randomisation_steps(model: Any) -> list[tuple[str, list[Any]]]:
    """Adebayo et al.'s cascade, top first: (step name, the modules and parameters it re-initialises)."""
    from models.families.bert import BertClassifier
    from models.families.vit import ViT

    if isinstance(model, ViT):
        head, layers, embed = (
            [model.head, model.norm],
            list(model.blocks),
            [model.patch_embed, model.cls_token, model.pos_embed],
        )
    elif isinstance(model, BertClassifier):
        head = [model.head] + ([model.pooler] if model.pooler is not None else [])
        layers, embed = list(model.bert.layers), [model.bert.embeddings]
    else:
        head, layers, embed = [model.head, model.norm], list(model.layers), [model.embed, model.positions]
    steps = [("head", head)]
    steps += [(f"layer {i + 1}", [layer]) for i, layer in reversed(list(enumerate(layers)))]
    return steps + [("embeddings", embed)]


def reinitialise(parts: list[Any], seed: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    with torch.no_grad():
        for part in parts:
            if isinstance(part, nn.Parameter):
                part.normal_(std=0.02)  # ViT's class token and position embeddings
                continue
            for m in part.modules():
                if hasattr(m, "reset_parameters"):  # Linear, Conv2d, LayerNorm, Embedding: PyTorch's own init
                    m.reset_parameters()
                else:
                    for p in m.parameters(recurse=False):  # a module without its own reset
                        p.normal_(std=0.02)


def sanity(
    model: Any, inputs: list[Any], trained: dict[str, list[Any]], steps: int, seed: int, batch: int
) -> dict[str, Any]:
    """Spearman's ρ of each cumulatively randomised model's attributions with the trained model's."""
    from models.inspect import attribution as A

    rand = copy.deepcopy(model)
    cascade = randomisation_steps(rand)
    out: dict[str, Any] = {
        "examples": len(inputs),
        "steps": [name for name, _ in cascade],
        "spearman": {m: [] for m in A.METHODS},
        "abs_spearman": {m: [] for m in A.METHODS},
    }
    for i, (name, parts) in enumerate(cascade):
        reinitialise(parts, seed + i)
        for method in A.METHODS:
            rhos = []
            ref = trained[method]
            got = explain_all(rand, inputs, method, [a.target for a in ref], steps, batch)
            for a, b in zip(ref, got):
                keep = ~a.special.ravel()
                rhos.append(spearman(a.values.ravel()[keep], b.values.ravel()[keep]))
            out["spearman"][method].append(nanmean(rhos))
            out["abs_spearman"][method].append(nanmean(np.abs(rhos)))
        log(f"  sanity {name}: " + ", ".join(f"{m} {out['spearman'][m][-1]}" for m in A.METHODS))
    return out


# ---------------------------------------------------------------------------------------------- one model
def attributions(model: Any, inputs: list[Any], steps: int, batch: int, seed: int) -> tuple[dict, dict, dict]:
    """({method: [Attribution]}, {method: [ranking]}, {method: seconds}) with "random" added to the rankings."""
    from models.inspect import attribution as A

    attrs: dict[str, list[Any]] = {}
    seconds: dict[str, float] = {}
    for method in A.METHODS:
        t0 = time.perf_counter()
        attrs[method] = explain_all(model, inputs, method, None, steps, batch)
        seconds[method] = round(time.perf_counter() - t0, 2)
    order = {m: [A.ranking(a) for a in attrs[m]] for m in A.METHODS}
    rng = np.random.default_rng(seed)
    order["random"] = [rng.permutation(o) for o in order["attention"]]
    return attrs, order, seconds


def agreement(attrs: dict[str, list[Any]], order: dict[str, list[np.ndarray]]) -> dict[str, float | None]:
    """Mean Spearman's ρ between every two methods (random: minus its rank) over the non-special items."""
    names = list(order)
    first = attrs[names[0]]

    def scores(method: str, i: int) -> np.ndarray:
        keep = ~first[i].special.ravel()
        if method == "random":
            s = np.zeros(first[i].values.size)
            s[order["random"][i]] = -np.arange(len(order["random"][i]))
            return s[keep]
        return attrs[method][i].values.ravel()[keep]

    return {
        f"{a}|{b}": nanmean([spearman(scores(a, i), scores(b, i)) for i in range(len(first))])
        for k, a in enumerate(names)
        for b in names[k + 1 :]
    }


def eraser(
    model: Any, ids: list[list[int]], attrs: list[Any], order: dict[str, list[np.ndarray]], resamples: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Comprehensiveness and sufficiency (AOPC over BINS) per ranking, with bootstrap intervals."""
    from models.inspect import attribution as A

    targets = [a.target for a in attrs]
    full = A.probabilities(model, ids)[np.arange(len(ids)), targets]
    seqs, owners = [], []
    for method, ranked in order.items():
        for i, (row, r) in enumerate(zip(ids, ranked)):
            special = np.flatnonzero(attrs[i].special)
            for k in BINS:
                top = r[: min(len(r), max(1, math.ceil(k * len(r))))]
                seqs.append(A.delete_tokens(row, top))  # x \ r_k
                seqs.append([row[j] for j in sorted({*special.tolist(), *top.tolist()})])  # r_k (specials kept)
                owners.append((method, i))
    probs = A.probabilities(model, seqs)
    out = {}
    per = {m: ([], []) for m in order}
    for n, (method, i) in enumerate(owners):
        t = targets[i]
        per[method][0].append(full[i] - probs[2 * n, t])
        per[method][1].append(full[i] - probs[2 * n + 1, t])
    for method, (comp, suff) in per.items():
        comp_i = np.asarray(comp).reshape(len(ids), len(BINS)).mean(1)  # AOPC per example
        suff_i = np.asarray(suff).reshape(len(ids), len(BINS)).mean(1)
        out[method] = {
            "comprehensiveness": bootstrap(comp_i, resamples, seed),
            "sufficiency": bootstrap(suff_i, resamples, seed),
        }
    return out


def curves(
    model: Any,
    x: Any,
    attrs: list[Any],
    order: dict[str, list[np.ndarray]],
    fill: Any,
    sigma: float | None,
    resamples: int,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Deletion (to the mean pixel) and insertion (from the blurred copy) AUC, 10 points, per ranking."""
    import torch

    from models.inspect import attribution as A

    patch = attrs[0].patch
    canvas = A.blur(x, sigma)
    out = {}
    for method, ranked in order.items():
        dele, ins = [], []
        for i, r in enumerate(ranked):
            counts = A.curve_counts(len(r), CURVE_POINTS)
            fr = counts / len(r)
            batch = torch.stack(
                [A.fill_patches(x[i], r[:k], patch, fill) for k in counts]
                + [A.fill_patches(canvas[i], r[:k], patch, x[i]) for k in counts]
            )
            p = A.probabilities(model, batch)[:, attrs[i].target].astype(np.float64)
            dele.append(float(np.trapezoid(p[: len(counts)], fr)))
            ins.append(float(np.trapezoid(p[len(counts) :], fr)))
        out[method] = {
            "deletion_auc": bootstrap(dele, resamples, seed),
            "insertion_auc": bootstrap(ins, resamples, seed),
        }
    return out


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import models
    from models.decoding.packed import pack_linears
    from models.inputs.images import fashion_tensor
    from models.inspect import attribution as A

    t0 = time.perf_counter()
    model = models.load(Path(args.checkpoints) / name)
    plain = copy.deepcopy(model)  # randomised copies start from the plain model (random weights do not pack)
    pack_linears(model)  # as the app's model store serves it
    data_dir = Path(args.data_dir)
    result: dict[str, Any] = {}
    if DATA[name] == "fashion":
        pixels, labels, mean_pixel = load_images(data_dir, args.limit)
        x = fashion_tensor(pixels)  # (N, 1, 28, 28)
        inputs: list[Any] = list(x)
        result["mean_pixel"] = round(mean_pixel, 4)
    else:
        texts, labels = load_texts(data_dir, DATA[name], list(model.labels), args.limit)
        cap = model.config.max_len
        ids = [model.tokenizer.encode(t, max_tokens=cap).ids for t in texts]
        inputs = ids
    log(f"{name}: {len(inputs)} examples")
    attrs, order, seconds = attributions(model, inputs, args.steps, args.batch, args.seed)
    first = attrs["attention"]
    result["examples"] = len(inputs)
    result["accuracy"] = round(float(np.mean([a.target == int(y) for a, y in zip(first, labels)])), 4)
    gaps = [a.completeness_gap for a in attrs["integrated_gradients"]]
    result["ig_completeness_gap"] = {
        "median": round(float(np.median(gaps)), 6),
        "max": round(float(np.max(gaps)), 6),
        "share_over_1pct": round(float(np.mean(np.asarray(gaps) > 0.01)), 4),
    }
    result["attribution_s"] = seconds
    t1 = time.perf_counter()
    if DATA[name] == "fashion":
        fill = A.mean_fill(model, mean_pixel)
        scores = curves(model, x, first, order, fill, None, args.bootstrap, args.seed)
    else:
        scores = eraser(model, ids, first, order, args.bootstrap, args.seed)
    result["metric_s"] = round(time.perf_counter() - t1, 2)
    result["methods"] = scores
    result["agreement"] = agreement(attrs, order)
    t2 = time.perf_counter()
    n_sanity = min(args.sanity, len(inputs))
    result["sanity"] = (
        sanity(plain, inputs[:n_sanity], {m: v[:n_sanity] for m, v in attrs.items()}, args.steps, args.seed, args.batch)
        if n_sanity
        else {}
    )
    result["sanity_s"] = round(time.perf_counter() - t2, 2)
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    for method, s in scores.items():
        log(
            f"  {method:22s} "
            + "  ".join(f"{k} {v['mean']:.4f} [{v['ci'][0]:.4f}, {v['ci'][1]:.4f}]" for k, v in s.items())
        )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"), help="folder of the checkpoint folders")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, from " + ", ".join(MODELS))
    ap.add_argument("--limit", type=int, default=None, help="at most this many examples per model (default all)")
    ap.add_argument("--sanity", type=int, default=30, help="examples for the randomisation check (0: skip)")
    ap.add_argument("--steps", type=int, default=32, help="integrated-gradients steps")
    ap.add_argument("--batch", type=int, default=8, help="examples per batched attribution call")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "limit": args.limit,
        "steps": args.steps,
        "bins": list(BINS),
        "sanity_examples": args.sanity,
        "threads": torch.get_num_threads(),
        "models": {},
    }
    for name in names:
        if not (Path(args.checkpoints) / name / "config.json").is_file():
            log(f"{name}: no checkpoint in {args.checkpoints}, left out")
            continue
        report["models"][name] = run_model(name, args)
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
