"""What the Generate tab keeps and moves for a long input: the whole attention array (ATLAS_ONDEVICE=0, the CPU's
default) against the attention kept where the model runs as each layer's queries, keys and row log-sum-exps
(ATLAS_ONDEVICE=1, a CUDA model's default; here forced on the CPU), in the same run on the same generation.

A random LLaMA of the long-input benchmark's shape (bench/_long_model.py: 12 layers × 12 heads, d = 768, 4,096
positions) is served in process by ``tabs.generate``; the prompt is the README's text cut to 2,048 tokens
(``ATLAS_MAX_TOKENS``), 4 new tokens. For each path, alternating, the median of ``--repeats``:
- ``generate_s``: the Generate handler, model run and first figure included;
- ``kept_mb``: what the session's state keeps of the attention (the float16 array, or q, k and lse);
- ``numpy_peak_mb``: the most numpy memory the handler held at once (``tracemalloc``: numpy reports its arrays;
  torch's own tensors, the model's passes included, are not counted on either side);
- ``redraw_ms``: each figure a control change or button draws without running the model (the mean of heads as a
  max-pooled heatmap, the model view, the head view of head 0, a replayed step, a 64 × 64 zoom and a zoom of
  1,024 × 1,024 tokens pooled);
- ``figure_kb``: each of those figures' JSON.
``same``: the two paths' figures agree (every heatmap cell within 1e-3, the head view's lines the same).

On the CPU the device path computes each figure's weights again from q and k (a matrix product per figure)
where the whole-array path reads them: the point of the path is a GPU's memory, not CPU speed; this measures
what it costs here.

    python bench/kept.py [--repeats 3] [--quick]

``--quick``: a 2-layer, 4-head, d = 64 model (the test). Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import machine_info  # noqa: E402

NEW = 4
PATHS = {"array": "0", "device": "1"}


def tab_layers(state) -> int:
    return state["result"].attention["decoder"].layers


def _zoom(size: int):
    def draw(tab, state):
        t = len(state["result"].tokens)
        n = min(size, t)
        return tab.zoom(state, 0, "0" if size == 64 else "mean", t - n, t - 1, t - n, t - 1, "max")
    return draw


_DRAW = {
    "heatmap_mean": lambda tab, s: tab.draw_generation(s, 0, tab_layers(s) - 1, "mean", "heatmap", "max")[2],
    "model_view": lambda tab, s: tab.draw_generation(s, 0, 0, "mean", "model view", "max")[2],
    "head_view": lambda tab, s: tab.draw_generation(s, 0, 0, "0", "head view", "max")[2],
    "replay_step_2": lambda tab, s: tab.draw_generation(s, 2, 0, "mean", "heatmap", "max")[2],
    "zoom_64": _zoom(64),
    "zoom_1024": _zoom(1024),
}


def one(tab, mode: str, prompt: str) -> dict:
    """One generation and its redraws by one path: times, memory, sizes and the figures."""
    os.environ["ATLAS_ONDEVICE"] = mode
    tracemalloc.start()
    t0 = time.perf_counter()
    out = tab.generate(prompt, NEW, "long-llama", progress=None)
    secs = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    state = out[6]
    amap = state["result"].attention["decoder"]
    kept = amap.nbytes if hasattr(amap, "attention") else amap.weights.nbytes
    times, figs = {}, {}
    for name, draw in _DRAW.items():  # each timed alone, in this order
        t0 = time.perf_counter()
        figs[name] = draw(tab, state)
        times[name] = (time.perf_counter() - t0) * 1e3
    return {"generate_s": secs, "kept_mb": kept / 2**20, "numpy_peak_mb": peak / 2**20, "redraw_ms": times,
            "figure_kb": {k: len(f.to_json()) / 1024 for k, f in figs.items()}, "figures": figs,
            "tokens": len(state["result"].tokens)}


def lines(fig) -> set[tuple[str, float, float]]:
    """A head view's lines as (head, query, key)."""
    out = set()
    for trace in fig.data:
        y = np.asarray(trace.y if trace.y is not None else [], dtype=np.float64)
        if trace.mode == "lines" and y.size > 1:
            out |= {(trace.legendgroup, float(q), float(k)) for q, k in zip(y[0::3], y[1::3])}
    return out


def agree(a, b) -> bool:
    """The figures of both paths alike: heatmap cells within 1e-3 (the model view's percents within one); a head
    view's lines the same but for at most 2 % (a weight at the threshold passes on one side only: the whole array
    is float16 over 512 tokens)."""
    if any(t.mode == "lines" for t in a.data if t.type == "scatter"):
        la, lb = lines(a), lines(b)
        return bool(la) and len(la ^ lb) <= 0.02 * len(la)
    for fa, fb in zip(a.data, b.data, strict=True):
        for key in ("z", "y"):
            x, y = getattr(fa, key, None), getattr(fb, key, None)
            if x is None or y is None:
                continue
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype.kind not in "fiu":  # labels
                if x.tolist() != y.tolist():
                    return False
                continue
            x, y = x.astype(np.float64), y.astype(np.float64)
            tol = 1.0 if getattr(fa, "zmax", None) == 100 else 1e-3
            if x.shape != y.shape or not np.allclose(x, y, atol=tol, equal_nan=True):
                return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a 2-layer, 4-head, d = 64 model (the test)")
    args = ap.parse_args(argv)

    from bench._long_model import long_llama_folder, long_prompt
    from serving import catalogue, store

    shape = dict(layers=2, heads=4, d_model=64, vocab=2000) if args.quick else {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        info = long_llama_folder(root / "long-llama", positions=4096, **shape)
        catalogue.CHECKPOINTS = root
        store.MODELS = store.ModelStore()
        from tabs import generate as tab

        prompt = long_prompt()
        tab.generate("warm up", 1, "long-llama", progress=None)
        runs: dict[str, list[dict]] = {name: [] for name in PATHS}
        for _ in range(max(1, args.repeats)):
            for name, mode in PATHS.items():
                runs[name].append(one(tab, mode, prompt))
    last = {name: r[-1] for name, r in runs.items()}
    same = all(agree(last["array"]["figures"][k], last["device"]["figures"][k]) for k in _DRAW)

    def median(name: str, key: str, sub: str | None = None) -> float:
        return round(statistics.median(r[key][sub] if sub else r[key] for r in runs[name]), 2)

    out: dict = {"model": info, "tokens": last["array"]["tokens"], "new_tokens": NEW, "repeats": args.repeats,
                 "same": same}
    for name in PATHS:
        out[name] = {"generate_s": median(name, "generate_s"), "kept_mb": round(last[name]["kept_mb"], 2),
                     "numpy_peak_mb": median(name, "numpy_peak_mb"),
                     "redraw_ms": {k: median(name, "redraw_ms", k) for k in _DRAW},
                     "figure_kb": {k: round(v, 1) for k, v in last[name]["figure_kb"].items()}}
    out["kept_ratio"] = round(out["array"]["kept_mb"] / max(out["device"]["kept_mb"], 1e-9), 1)
    out["numpy_peak_ratio"] = round(out["array"]["numpy_peak_mb"] / max(out["device"]["numpy_peak_mb"], 1e-9), 1)
    out["machine"] = machine_info()
    print(json.dumps(out))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
