"""Figure payload benchmark (docs/ARCHITECTURE.md §5–6).

1. On the same random attention tensors, the JSON size and build time of our model view against the
   bertviz format (attention sent as nested JSON lists of floats, one list per layer), for
   (6 layers, 8 heads, 40 tokens), (12, 12, 128) and (12, 12, 197).
2. The largest JSON of every figure family at the app's input caps (text: 128 tokens, MiniLM 256 with
   6 × 12 heads; ViT-B/16: 12 × 12 heads over 197 tokens; Swin-T: 56 × 56 tokens in 7 × 7 windows;
   language models at GPT-2 small's 12 × 12 and GPT-2 medium's 24 × 16 heads over 256 tokens, 64 steps).
3. Long inputs (the language models' 2,048-token context): a causal 12 × 12 × 2,048 tensor (float16, as the app
   keeps it) drawn as the pooled heatmap (max and mean), a zoomed 512 × 512 block, the head view, the model view
   and the logit lens of the last 256 positions, against their own budget of 3 MB (``max_long_figure_mb``), with the
   seconds each takes to build.
4. The time headless Chromium takes to draw our model view from a static HTML page with plotly.js
   inlined (until ``plotly_afterplot``), plus the time of a second ``Plotly.newPlot`` in the warm page.

Run: ``python bench/payload.py`` (add ``--no-browser`` to skip Chromium, ``--no-long`` to skip the long inputs). The
last stdout line is one JSON object with ``max_figure_mb`` and ``ratio_vs_bertviz`` (at 12, 12, 128), and
``max_long_figure_mb`` with ``long_figures`` (MB and build seconds each); the Chromium field is null when Chromium or
Playwright is missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import viz  # noqa: E402

BUDGET_BYTES = 2_000_000
LONG_BUDGET_BYTES = 3_000_000  # a figure of a 2,048-token input (issue 37: pooled tiles, zoom by re-query)
LONG_TOKENS = 2048
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]


def random_attention(shape: tuple[int, ...], seed: int = 0, temp: float = 3.0) -> np.ndarray:
    """Softmax of scaled Gaussian scores: rows sum to 1, peaked like trained heads."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * temp
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def dense_attention(shape: tuple[int, ...], per_row: int = 20) -> np.ndarray:
    """Worst case for the head view: every row spreads over ``per_row`` keys at exactly 1/per_row."""
    w = np.zeros(shape, np.float32)
    k = shape[-1]
    for i in range(shape[-2]):
        w[..., i, [(i + j * 7) % k for j in range(per_row)]] = 1.0 / per_row
    return w


def bertviz_json(weights: np.ndarray, tokens: list[str]) -> str:
    """What bertviz sends to the browser: per layer, attention as nested lists of floats."""
    return json.dumps({"all": {"attn": [layer.tolist() for layer in weights], "left_text": tokens,
                               "right_text": tokens}})


def tokens(n: int, prefix: str = "▁tok") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def vit_tokens() -> list[str]:
    return ["CLS"] + [f"r{i // 14}c{i % 14}" for i in range(196)]


def _sinusoid(P: int, D: int) -> np.ndarray:
    pos, i = np.arange(P)[:, None], np.arange(0, D, 2)
    pe = np.zeros((P, D), np.float32)
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos / 10000 ** (i / D)), np.cos(pos / 10000 ** (i / D))
    return pe


def _swin_regions(H: int, W: int, win: int, s: int) -> np.ndarray:
    img = np.zeros((H, W), int)
    cnt = 0
    for hs in (slice(0, -win), slice(-win, -s), slice(-s, None)):
        for ws in (slice(0, -win), slice(-win, -s), slice(-s, None)):
            img[hs, ws] = cnt
            cnt += 1
    return img


def largest_cases() -> Iterator[tuple[str, str, Callable[[], object]]]:
    """(family, name, build) for the largest input of every figure the app can make."""
    rng = np.random.default_rng(0)
    photo = (rng.random((224, 224, 3)) * 255).astype(np.uint8)  # noise: the worst case for PNG
    t128, t256 = tokens(128), tokens(256)
    vit = random_attention((12, 12, 197, 197), seed=1)
    yield "attention", "heatmap MiniLM 256", lambda: viz.attention_heatmap(
        random_attention((256, 256)), t256)
    yield "attention", "model view ViT-B 12x12x197", lambda: viz.model_view(vit, vit_tokens())
    yield "attention", "model view 12x12x128", lambda: viz.model_view(
        random_attention((12, 12, 128, 128), 2), t128)
    yield "attention", "model view MiniLM 6x12x256", lambda: viz.model_view(
        random_attention((6, 12, 256, 256), 3), t256)
    yield "attention", "head view MiniLM 12 heads 256 dense", lambda: viz.head_view(
        dense_attention((12, 256, 256)), t256)
    yield "attention", "head view ViT 12 heads 197", lambda: viz.head_view(vit, vit_tokens(), layer=0)
    yield "text", "cross alignment 128x128", lambda: viz.cross_alignment(
        random_attention((8, 128, 128), 4), t128, t128)
    steps = [dict(tokens=tokens(8, "▁w"), parents=list(rng.integers(0, 8, 8)) if t else [-1] * 8,
                  scores=list(-rng.random(8) * t), finished=list(rng.random(8) < 0.1)) for t in range(160)]
    yield "text", "beam tree 160 steps x 8", lambda: viz.beam_tree(steps, chosen=[0] * 160)
    yield "text", "token highlight 256 (HTML)", lambda: viz.token_highlight(t256, rng.random(256))
    yield "images", "image overlay 224 RGB", lambda: viz.image_attention(photo, vit[11, 0, 0, 1:], (14, 14))
    yield "images", "head grid 12 heads", lambda: viz.image_attention_grid(photo, vit[11, :, 0, 1:], (14, 14))
    yield "images", "CLS grid all 12x12 heads", lambda: viz.image_attention_grid(
        photo, vit[:, :, 0, 1:].reshape(144, 196), (14, 14), ncols=12)
    yield "images", "query patch 224 RGB", lambda: viz.query_patch_attention(photo, vit[5, 3, 30, 1:], (14, 14), 29)
    yield "images", "top-10 of 1000 classes", lambda: viz.topk_bars(tokens(1000, "class "),
                                                                    rng.dirichlet(np.ones(1000)), 10)
    yield "stats", "entropy 12x12", lambda: viz.entropy_heatmap(rng.random((12, 12)) * 7)
    yield "stats", "attention distance 12x12", lambda: viz.head_metric_scatter(rng.random((12, 12)) * 120)
    yield "stats", "special-token share 12x12", lambda: viz.head_share_heatmap(
        *viz.token_shares(random_attention((12, 12, 256, 256), 5), ["[CLS]"] + t256[1:-1] + ["[SEP]"]))
    pe = _sinusoid(256, 768)
    yield "positional", "sinusoidal 256x768", lambda: viz.sinusoidal_heatmap(pe)
    yield "positional", "sinusoidal curves", lambda: viz.sinusoidal_curves(pe, [0, 1, 2, 3, 64, 65, 300, 767])
    yield "positional", "similarity 256", lambda: viz.position_similarity(pe, "dot")
    ang = np.arange(256) * 0.1
    yield "positional", "rope rotation 256", lambda: viz.rope_rotation(np.stack([np.cos(ang), np.sin(ang)], 1))
    yield "positional", "rope offset 256", lambda: viz.rope_offset_scores(rng.random((256, 256)))
    yield "positional", "learned ViT-B grid 14x14", lambda: viz.learned_pe_grid(
        rng.standard_normal((196, 768)), (14, 14))
    yield "positional", "relative bias 24 heads 49x49", lambda: viz.relative_bias_tables(
        rng.standard_normal((24, 49, 49)), expanded=True)
    off = np.arange(-162, 163)  # T5-large's 16 heads, offsets past max_distance 128 both ways
    yield "positional", "T5 bias 16 heads 325 offsets", lambda: viz.t5_bias(
        off, rng.integers(0, 32, off.size), rng.integers(0, 32, off.size), rng.standard_normal((16, off.size)),
        rng.standard_normal((16, off.size)))
    for layers, heads in ((12, 12), (24, 16)):  # GPT-2 small and medium shapes, the LM token cap
        lm = np.tril(random_attention((layers, heads, 256, 256), seed=layers))
        lm /= lm.sum(-1, keepdims=True)
        yield "generate", f"model view {layers}x{heads}x256", lambda lm=lm: viz.model_view(lm, t256)
        yield "generate", f"head view {layers}x{heads}x256", lambda lm=lm: viz.head_view(lm, t256, layer=0)
        yield "generate", f"heatmap {layers}x{heads}x256", lambda lm=lm: viz.attention_heatmap(lm, t256, layer=1)
        yield "generate", f"head roles {layers}x{heads}", lambda layers=layers, heads=heads: viz.head_share_heatmap(
            rng.random((layers, heads, 4)), ["previous", "induction", "duplicate", "sink"])
        yield "generate", f"logit lens {layers}x256", lambda layers=layers: viz.logit_lens(
            [tokens(256, "▁guess") for _ in range(layers)], rng.random((layers, 256)), t256, t256)
    yield "generate", "candidates 64 steps", lambda: viz.step_candidates(
        [tokens(5, "▁cand") for _ in range(64)], np.sort(rng.dirichlet(np.ones(5), 64))[:, ::-1], tokens(64, "▁cand"))
    yield "generate", "generation highlight 256 (HTML)", lambda: viz.generation_highlight(
        t256, rng.random(256) * 12, 192)
    from viz import heads as vh

    for layers, heads in ((24, 16), (32, 32)):  # GPT-2 medium; LLaMA-3-8B's 32 layers × 32 heads
        grid, other = rng.random((layers, heads)), rng.random((layers, heads))
        ranked = [(int(i // heads), int(i % heads), float(v)) for i, v in enumerate(grid.ravel())]
        yield "heads", f"grid {layers}x{heads}", lambda g=grid: vh.head_grid(g, "previous token", mark=(1, 2))
        yield "heads", f"finder {layers}x{heads}", lambda r=ranked: vh.head_ranking(sorted(r, key=lambda x: -x[2]),
                                                                                   "previous token")
        yield "heads", f"compare {layers}x{heads}", lambda g=grid, o=other: vh.compare_grids(
            g, o, ("a", "b"), "previous token")
        yield "heads", f"by layer {layers}x{heads}", lambda g=grid: vh.by_layer(g * 200, "distance", "pixels")
    yield "heads", "offsets 33", lambda: vh.offset_profile(rng.random(33), causal=False)
    regions = _swin_regions(56, 56, 7, 3)
    ids = np.arange(56 * 56).reshape(56, 56)
    mw = regions.reshape(8, 7, 8, 7).transpose(0, 2, 1, 3).reshape(64, 49)
    masks = np.where(mw[:, None, :] != mw[:, :, None], -100.0, 0.0)
    yield "swin", "window partitions 56x56", lambda: viz.window_partitions((56, 56), 7, 3)
    yield "swin", "cyclic shift 56x56", lambda: viz.cyclic_shift(ids, np.roll(ids, (-3, -3), (0, 1)), regions, 7)
    yield "swin", "region map 56x56", lambda: viz.region_map(regions, 7)
    yield "swin", "window mask 49x49", lambda: viz.window_mask(masks[63], 7, 63)
    yield "swin", "all 64 window masks", lambda: viz.all_window_masks(masks, 8)
    yield "swin", "window attention 56x56 on image", lambda: viz.window_attention_grid(
        random_attention((64, 3, 49, 49), 6), (56, 56), 7, 3, (55, 2), image=photo, patch=4)


def long_attention(layers: int = 12, heads: int = 12, n: int = LONG_TOKENS) -> np.ndarray:
    """A causal (layers, heads, n, n) float16 tensor, rows summing to 1, built a layer at a time (1.2 GB in all)."""
    out = np.empty((layers, heads, n, n), np.float16)
    for layer in range(layers):
        w = np.tril(random_attention((heads, n, n), seed=layer))
        out[layer] = w / w.sum(-1, keepdims=True)
    return out


def long_cases() -> Iterator[tuple[str, Callable[[], object]]]:
    """(name, build) of every figure Generate draws for a 2,048-token input."""
    w, t = long_attention(), tokens(LONG_TOKENS)
    rng = np.random.default_rng(1)
    yield "heatmap 2048 max-pooled (head mean)", lambda: viz.attention_heatmap(w, t, layer=11, head="mean")
    yield "heatmap 2048 mean-pooled (head 3)", lambda: viz.attention_heatmap(w, t, layer=11, head=3, pool="mean")
    yield "zoom 512x512 block", lambda: viz.attention_zoom(w, t, rows=(1536, 2048), cols=(1024, 1536), layer=11,
                                                           head=3)
    yield "head view 12 heads 2048", lambda: viz.head_view(w, t, layer=11)
    yield "model view 12x12x2048", lambda: viz.model_view(w, t)
    yield "logit lens 12x256 of 2048", lambda: viz.logit_lens([tokens(256, "▁guess") for _ in range(12)],
                                                              rng.random((12, 256)), t[-256:], t[-256:])


def measure_long() -> dict:
    rows = {}
    for name, build in long_cases():
        t0 = time.perf_counter()
        size = payload_size(build())
        dt = time.perf_counter() - t0
        ok = "ok" if size <= LONG_BUDGET_BYTES else "OVER BUDGET"
        print(f"{'long':10s} {name:40s} {size / 1e6:7.3f} MB  {dt:6.3f} s  {ok}")
        rows[name] = {"mb": round(size / 1e6, 3), "build_s": round(dt, 3)}
    return rows


def payload_size(obj: object) -> int:
    """Bytes of a figure's JSON as the app sends it: with its phone layout (``viz.common.phone``, which every tab's
    plot adds, tabs.common.Plot)."""
    from viz.common import phone

    return len(obj) if isinstance(obj, str) else len(phone(obj).to_json())


def compare_bertviz() -> list[dict]:
    rows = []
    for L, H, n in [(6, 8, 40), (12, 12, 128), (12, 12, 197)]:
        w = random_attention((L, H, n, n), seed=n)
        toks = tokens(n)
        t0 = time.perf_counter()
        ours = viz.model_view(w, toks).to_json()
        t1 = time.perf_counter()
        theirs = bertviz_json(w, toks)
        t2 = time.perf_counter()
        rows.append(dict(shape=[L, H, n], ours_mb=len(ours) / 1e6, bertviz_mb=len(theirs) / 1e6,
                         ratio=len(theirs) / len(ours), ours_build_s=t1 - t0, bertviz_build_s=t2 - t1))
    return rows


def chromium_draw(n: int = 197) -> dict | None:
    """Seconds from navigation to ``plotly_afterplot`` for the model view on a static page with
    plotly.js inlined, and the time of one more ``Plotly.newPlot`` in the warm page."""
    exe = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if exe is None:
        print("chromium not found: skipping the browser timing", file=sys.stderr)
        return None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("playwright not installed: skipping the browser timing", file=sys.stderr)
        return None
    fig = viz.model_view(random_attention((12, 12, n, n), seed=n), vit_tokens() if n == 197 else tokens(n))
    post = ("var gd = document.getElementById('{plot_id}');"
            "if (gd._fullLayout && document.querySelector('.main-svg')) { window.__drawn = performance.now(); }"
            "gd.on('plotly_afterplot', function () { if (!window.__drawn) window.__drawn = performance.now(); });")
    html = fig.to_html(include_plotlyjs=True, full_html=True, post_script=post, div_id="mv")
    out: dict = {"tokens": n, "html_mb": len(html) / 1e6}
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "model_view.html"
        page_path.write_text(html, encoding="utf-8")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                loads = []
                for _ in range(3):
                    page.goto(page_path.as_uri())
                    page.wait_for_function("window.__drawn !== undefined", timeout=60000)
                    loads.append(page.evaluate("window.__drawn") / 1000.0)
                replot = page.evaluate(
                    """async () => { const gd = document.getElementById('mv');
                       const t0 = performance.now();
                       await Plotly.newPlot(gd, gd.data, gd.layout);
                       return (performance.now() - t0) / 1000; }""")
                browser.close()
        except Exception as exc:  # a browser that cannot start is reported, not fatal
            print(f"chromium timing failed: {exc}", file=sys.stderr)
            return None
    out.update(load_to_plot_s=float(np.median(loads)), replot_s=float(replot))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium draw timing")
    ap.add_argument("--no-long", action="store_true", help="skip the 2,048-token figures")
    args = ap.parse_args()

    rows = compare_bertviz()
    for r in rows:
        print(f"model view {r['shape']}: ours {r['ours_mb']:.3f} MB in {r['ours_build_s']:.3f} s | bertviz "
              f"{r['bertviz_mb']:.1f} MB in {r['bertviz_build_s']:.3f} s | ratio {r['ratio']:.1f}x")

    families: dict[str, dict] = {}
    for family, name, build in largest_cases():
        t0 = time.perf_counter()
        size = payload_size(build())
        dt = time.perf_counter() - t0
        ok = "ok" if size <= BUDGET_BYTES else "OVER BUDGET"
        print(f"{family:10s} {name:40s} {size / 1e6:7.3f} MB  {dt:6.3f} s  {ok}")
        if size > families.get(family, {}).get("bytes", -1):
            families[family] = {"figure": name, "bytes": size}

    long = None if args.no_long else measure_long()
    draw = None if args.no_browser else chromium_draw(197)
    if draw:
        print(f"chromium: model view 12x12x197 drawn {draw['load_to_plot_s']:.2f} s after navigation "
              f"(page {draw['html_mb']:.1f} MB incl. plotly.js), re-plot {draw['replot_s']:.2f} s")

    ratio128 = next(r["ratio"] for r in rows if r["shape"] == [12, 12, 128])
    max_mb = max(f["bytes"] for f in families.values()) / 1e6
    result = {
        "max_figure_mb": round(max_mb, 3),
        "ratio_vs_bertviz": round(ratio128, 1),
        "within_budget": max_mb <= BUDGET_BYTES / 1e6,
        "model_view": {"x".join(map(str, r["shape"])): {k: round(v, 4) for k, v in r.items() if k != "shape"}
                       for r in rows},
        "largest_per_family_mb": {k: {"figure": v["figure"], "mb": round(v["bytes"] / 1e6, 3)}
                                  for k, v in families.items()},
        "chromium_model_view_197": None if draw is None else {k: round(v, 3) for k, v in draw.items()},
        "max_long_figure_mb": None if long is None else max(r["mb"] for r in long.values()),
        "long_within_budget": None if long is None else all(r["mb"] <= LONG_BUDGET_BYTES / 1e6 for r in long.values()),
        "long_figures": long,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
