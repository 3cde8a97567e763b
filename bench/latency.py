"""API latency benchmark (docs/ARCHITECTURE.md §5–6).

Launches `python app.py` on a free loopback port, measures the time from process start to the first HTTP
200 of the page (`ready_s`), then calls each action through `gradio_client`, one request at a time:
`--warmup` calls first (the first one loads the model, reported as `<action>_cold_s`), then `--repeats`
timed calls, reported as p50/p95.

Actions: translate (a 20-word English sentence, beam 5), classify_sst2, classify_agnews,
classify_image_vit_fashion and classify_image_swin_fashion (a Fashion-MNIST example image),
swin_windows, positional_encoding, playground, generate (20 new tokens, gpt-tiny), head_roles (N = 50),
attention_why_gpt_tiny (one score split, 40 tokens) and patch_heads_gpt_tiny_40 / patch_positions_gpt_tiny_40 (an
activation-patching sweep over 40 tokens; `--actions patch_heads_gpt2_small_40` adds GPT-2 small where it can be had);
an action whose checkpoint is missing is left out and listed in `left_out_missing_checkpoint`.
`--actions` takes a comma-separated subset of action names or api_names (`--actions classify` runs both tasks).

Baseline, in the same run (skip with `--no-baseline`): the same kinds of request to bench/_floor_app.py, a
Gradio app with the same queue that does no work (`floor_text`, and `floor_upload` with the example image),
and the wall time of `python -c "import gradio"` (`gradio_import_s`, the floor of `ready_s`). Each action
also reports `<action>_above_floor_s`: its p50 less the floor of its kind (upload for classify_image).

Long contexts (`--long`, issue 37): a random 12-layer, 12-head, d = 768 LLaMA folder with 4,096 positions
(bench/_long_model.py, written once into `--long-folder`, default runs/long-llama) served through `--model`-style
configuration (ATLAS_MODELS); `generate_long` sends 20,000 characters of the README (cut by the server to its
ATLAS_MAX_TOKENS context, 2,047 prompt tokens + 1 new one) and `attention_zoom_long` a 512 × 512 block of the kept
result. Reported: `generate_long_p50_s`, `generate_long_p95_s`, `attention_zoom_long_p50_s`, `server_peak_rss_mb`
(the server's whole process tree, model load included), `long_tokens`, `long_model` (its shape) and the targets
(≤ 30 s, ≤ 4 GB).

Families (`--families`, issue 49): an opus-mt-shaped Marian (74 M parameters) and a t5-small-shaped T5 (60 M)
translating a 20-word sentence with beam 5 through `/translate` (its `model` input) and a DeBERTa-v3-base-shaped
classifier (184 M) through `/classify`,
random weights of the real shapes written once into `--families-folder` (bench/_family_models.py, default
runs/families) and served as configured folders (ATLAS_MODELS); reported: `<action>_p50_s`, `_p95_s`, `_cold_s`
and the targets (translate ≤ 1.5 s, classify ≤ 1 s; recorded, never asserted).

Browser (`--browser`, issue 48 item 11): what a person waits for in headless Chromium (bench/_browser.py), timed
inside the page: Translate and Generate from the click to the text and to the figures (`*_figures_after_text_s`:
the figures' wait once the text is there), the upload preview of the Fashion-MNIST example and of a 6000×6000 JPEG
against Gradio's own upload of the same file (the floor), the first Vision classify on a fresh server
(`first_figures_s`: a new server, its page, `--think` seconds as a visitor reads it, the example uploaded and
classified) and the 6000×6000 JPEG's
classify on a fresh page. `--against DIR` runs the same against another checkout (say the commit before a change)
in the same run: the two arms take turns (ABBA), each figure reported per arm with the ratio after/before.
Without `--browser`, `--against DIR` does the same for the API actions: both apps served at once, each action called
by the two in turns (ABBA rounds, one request at a time), `<action>_p50_s` per arm and `<action>_ratio` after/before.
`--idle LOAD` first waits (up to 5 min) for the 1-minute load average to fall to LOAD, and every turn waits again.

Run: `python bench/latency.py [--checkpoints DIR] [--repeats 20] [--actions translate,classify]`, or
`python bench/latency.py --browser --repeats 5 --against ../before --idle 2.5`, or
`python bench/latency.py --long --repeats 3 --warmup 1`, or `python bench/latency.py --families --repeats 10`.
The last stdout line is one JSON object with `ready_s`, `<action>_p50_s`, `<action>_p95_s`, the targets
(docs/ARCHITECTURE.md §6, recorded, never asserted: translate p50 < 0.5 s, classify and vit-fashion p50 < 0.2 s,
ready < 5 s, all on an idle 2-core CPU) and the machine (CPU count, load average at start: figures taken
on a busy machine are not comparable). Exit status 1 when any call failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._server import (  # noqa: E402
    FILE_INPUT_APIS,
    FLOOR_ACTIONS,
    Action,
    AppServer,
    available,
    call,
    client_for,
    machine_info,
    percentile,
    rounded,
    select_actions,
)

TARGETS_S = {"ready_s": 5.0, "translate_p50_s": 0.5, "classify_sst2_p50_s": 0.2, "classify_agnews_p50_s": 0.2,
             "classify_image_vit_fashion_p50_s": 0.2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints",
                        help="checkpoint folder (sets ATLAS_CHECKPOINTS; default: the repository's)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per action")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per action first (≥ 1 loads the model)")
    parser.add_argument("--actions", default=None, help="comma-separated action names or api_names (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one call may take")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baseline (a do-nothing Gradio app and the import of gradio)")
    parser.add_argument("--long", action="store_true", help="the long-context run instead (a 2,048-token Generate)")
    parser.add_argument("--long-folder", type=Path, default=ROOT / "runs" / "long-llama",
                        help="where the random long-context LLaMA folder is written once and reused")
    parser.add_argument("--families", action="store_true",
                        help="the families run instead: an opus-mt-shaped Marian translating 20 words with beam 5 "
                             "and a DeBERTa-v3-base-shaped classifier, random folders configured by ATLAS_MODELS")
    parser.add_argument("--families-folder", type=Path, default=ROOT / "runs" / "families",
                        help="where the random family folders are written once and reused")
    parser.add_argument("--browser", action="store_true",
                        help="the browser run instead: text and figure times in headless Chromium (bench/_browser.py)")
    parser.add_argument("--against", type=Path, default=None,
                        help="also time this other checkout of the app (the 'before' arm), in turns")
    parser.add_argument("--fresh", type=int, default=None,
                        help="--browser: fresh-server samples per arm (default: --repeats; 0 skips them)")
    parser.add_argument("--think", type=float, default=15.0,
                        help="--browser: seconds between a fresh server's page and its first upload (default 15)")
    parser.add_argument("--idle", type=float, default=None, metavar="LOAD",
                        help="--browser: wait for the 1-minute load average to fall to LOAD before each turn")
    args = parser.parse_args(argv)
    if args.browser:
        return browser(args)
    if args.long:
        return long_context(args)
    if args.families:
        return families(args)
    if args.against:
        return api_against(args)
    actions, missing = available(select_actions(args.actions), args.checkpoints)

    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats, "warmup": args.warmup,
                              "checkpoints": str(args.checkpoints),
                              "left_out_missing_checkpoint": missing}
    errors: dict[str, str] = {}
    with AppServer(args.checkpoints) as server:
        report["ready_s"] = rounded(server.ready_s, 3)
        print(f"page served after {server.ready_s:.2f} s at {server.url}", file=sys.stderr)
        time_actions(server.url, actions, args, report, errors)
        report["server_peak_rss_mb"] = server.sampler.peak_mb() if server.sampler else None
    if not args.no_baseline:
        # Baseline, same run: the same kinds of request to a Gradio app that does no work, and the import of
        # gradio alone (the floor of ready_s).
        with AppServer(script="bench/_floor_app.py") as floor:
            report["floor_ready_s"] = rounded(floor.ready_s, 3)
            time_actions(floor.url, FLOOR_ACTIONS, args, report, errors)
        report["gradio_import_s"] = rounded(import_seconds("gradio"), 3)
        print(f"import gradio alone: {report['gradio_import_s']:.2f} s", file=sys.stderr)
        for action in actions:
            floor_key = "floor_upload_p50_s" if action.api in FILE_INPUT_APIS else "floor_text_p50_s"
            if report.get(f"{action.name}_p50_s") is not None and report.get(floor_key) is not None:
                report[f"{action.name}_above_floor_s"] = rounded(report[f"{action.name}_p50_s"] - report[floor_key])

    report["errors"] = errors
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    report["targets_s"] = TARGETS_S
    report["meets_targets"] = {k: (report[k] < v if report.get(k) is not None else None)
                               for k, v in TARGETS_S.items() if k in report}
    print(json.dumps(report))
    return 1 if errors else 0


def api_against(args: argparse.Namespace) -> int:
    """The API actions on this checkout ("after") and on ``args.against`` ("before"), both served at once and called
    in turns: ABBA rounds, one request at a time, so that the machine's load falls on both arms alike."""
    actions, missing = available(select_actions(args.actions), args.checkpoints)
    arms = {"after": ROOT, "before": args.against.resolve()}
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats, "warmup": args.warmup,
                              "arms": {k: str(v) for k, v in arms.items()}, "left_out_missing_checkpoint": missing}
    times: dict[str, dict[str, list[float]]] = {arm: {a.name: [] for a in actions} for arm in arms}
    errors: dict[str, str] = {}
    with AppServer(args.checkpoints, root=arms["after"]) as after, AppServer(args.checkpoints,
                                                                            root=arms["before"]) as before:
        servers = {"after": after, "before": before}
        report["ready_s"] = {arm: rounded(s.ready_s, 3) for arm, s in servers.items()}
        clients = {arm: client_for(s.url, timeout=args.timeout) for arm, s in servers.items()}
        try:
            for arm in arms:  # warm-ups: each model loaded, the first figures made
                for action in actions:
                    for _ in range(args.warmup):
                        call(clients[arm], action, timeout=args.timeout)
            for r in range(args.repeats):
                for arm in (("after", "before") if r % 2 == 0 else ("before", "after")):
                    for action in actions:
                        t0 = time.perf_counter()
                        try:
                            call(clients[arm], action, timeout=args.timeout)
                        except Exception as err:  # reported; the others still run
                            errors[f"{arm}:{action.name}"] = f"{type(err).__name__}: {err}"[:300]
                            continue
                        times[arm][action.name].append(time.perf_counter() - t0)
        finally:
            for client in clients.values():
                client.close()
    for action in actions:
        p50 = {arm: percentile(times[arm][action.name], 50) for arm in arms}
        report[f"{action.name}_p50_s"] = {arm: rounded(v) for arm, v in p50.items()}
        report[f"{action.name}_p95_s"] = {arm: rounded(percentile(times[arm][action.name], 95)) for arm in arms}
        if p50["after"] and p50["before"]:
            report[f"{action.name}_ratio"] = round(p50["after"] / p50["before"], 3)
        print(f"{action.name:30s} after {_fmt(p50['after'])}  before {_fmt(p50['before'])}  "
              f"ratio {report.get(f'{action.name}_ratio')}", file=sys.stderr)
    report["errors"] = errors
    print(json.dumps(report))
    return 1 if errors else 0


BROWSER_SENTENCES = ["Two dogs are running on the beach .", "A man in a red shirt is riding a bike down the street .",
                     "Children play football in the park .", "A woman is reading a book on a bench near the old "
                     "river .", "The cat sleeps .", "Three young men are climbing a steep rock wall in the sun ."]
BROWSER_PROMPTS = ["Two dogs are running on the", "A man in a red shirt is", "The children play in the park and",
                   "A woman", "Three young men are climbing a steep rock wall near", "The cat"]


def browser(args: argparse.Namespace) -> int:
    """--browser: the page's waits per arm ("after": this checkout; "before": --against), arms in turns (ABBA)."""
    import tempfile

    from bench._browser import Chrome, settle

    arms = {"after": ROOT} | ({"before": args.against.resolve()} if args.against else {})
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats, "browser": True,
                              "arms": {k: str(v) for k, v in arms.items()}, "idle_load": args.idle}
    times: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
    errors: dict[str, str] = {}
    example = ROOT / "examples" / "fashion" / sorted(p.name for p in (ROOT / "examples" / "fashion").glob("*.png"))[0]
    folder = Path(tempfile.mkdtemp(prefix="atlas-browser-"))
    huge = folder / "photo-6000.jpg"
    _photo(6000).save(huge, quality=90)

    def add(arm: str, prefix: str, out: dict[str, float | None]) -> None:
        for key, value in out.items():
            if value is not None:
                times[arm].setdefault(f"{prefix}_{key}_s", []).append(value)

    def turns() -> list[list[str]]:
        order = list(arms)
        return [order if i % 2 == 0 else order[::-1] for i in range(args.repeats)]

    def wait_idle() -> None:
        if args.idle is not None:
            settle(args.idle)

    with Chrome() as chrome:
        # A fresh server per sample: the first classify a visitor meets (model stack not yet imported).
        fresh_turns = turns()[:args.repeats if args.fresh is None else args.fresh]
        for order in fresh_turns:
            for arm in order:
                wait_idle()
                try:
                    with AppServer(args.checkpoints, root=arms[arm]) as server, chrome.page(server.url) as page:
                        time.sleep(args.think)  # a visitor arrives a little after the start and reads the page
                        add(arm, "example", page.upload(example))
                        add(arm, "first", page.classify())
                except Exception as err:  # reported; the run goes on
                    errors[f"{arm}_first_classify"] = f"{type(err).__name__}: {err}"[:300]
        with contextlib.ExitStack() as stack:
            servers = {arm: stack.enter_context(AppServer(args.checkpoints, root=root)) for arm, root in arms.items()}
            pages = {arm: stack.enter_context(chrome.page(server.url)) for arm, server in servers.items()}
            for arm, page in pages.items():  # the models load on first use: not measured
                page.translate(BROWSER_SENTENCES[-1])
                page.generate(BROWSER_PROMPTS[-1])
                with chrome.page(servers[arm].url) as fresh:
                    fresh.upload(example)
                    fresh.classify()
            for i, order in enumerate(turns()):
                for arm in order:
                    wait_idle()
                    page = pages[arm]
                    try:
                        add(arm, "translate", page.translate(BROWSER_SENTENCES[i % (len(BROWSER_SENTENCES) - 1)]))
                        add(arm, "generate", page.generate(BROWSER_PROMPTS[i % (len(BROWSER_PROMPTS) - 1)]))
                        with chrome.page(servers[arm].url) as fresh:  # a fresh page: no upload yet, no figures
                            add(arm, "upload6000", fresh.upload(huge))
                            add(arm, "classify6000", fresh.classify())
                    except Exception as err:  # reported; the run goes on
                        errors[f"{arm}_turn{i}"] = f"{type(err).__name__}: {err}"[:300]
    for arm, found in times.items():
        report[arm] = {key: rounded(percentile(values, 50)) for key, values in sorted(found.items())}
        report[arm]["n"] = {key: len(values) for key, values in sorted(found.items())}
    if "before" in report:
        report["ratio_after_before"] = {key: rounded(value / report["before"][key])
                                        for key, value in report["after"].items()
                                        if key != "n" and value and report["before"].get(key)}
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    report["errors"] = errors
    print(json.dumps(report))
    return 1 if errors else 0


def _photo(side: int):
    """A photo-like test picture: a dark shoe-like shape on a light, gently shaded background, side × side."""
    import numpy as np
    from PIL import Image, ImageDraw

    ramp = np.linspace(200, 245, side, dtype=np.float32)
    img = Image.fromarray(np.repeat((ramp[:, None] + ramp[None, :] * 0)[:, :, None], 3, axis=2).astype(np.uint8))
    s = side / 1600
    ImageDraw.Draw(img).polygon([(300 * s, 800 * s), (1300 * s, 800 * s), (1300 * s, 650 * s), (900 * s, 600 * s),
                                 (700 * s, 350 * s), (350 * s, 400 * s)], fill=(60, 40, 30))
    return img


LONG_TARGETS = {"generate_long_p50_s": 30.0, "server_peak_rss_mb": 4096.0}
FAMILY_TARGETS = {"translate_opus_mt_shaped_p50_s": 1.5, "classify_deberta_v3_base_shaped_p50_s": 1.0}
SENTENCE_20 = ("The young woman in a red coat walked her small dog along the quiet river before the evening rain "
               "began.")  # 20 words


def families(args: argparse.Namespace) -> int:
    """/translate with an opus-mt-shaped Marian (74 M parameters) and a t5-small-shaped T5 (60 M), beam 5, a 20-word
    sentence, and /classify with a DeBERTa-v3-base-shaped classifier (184 M), random weights of the real shapes
    (bench/_family_models.py), served as configured folders; p50 / p95 after the warm-up (the first call loads the
    model: ``_cold_s``)."""
    from bench._family_models import ensure

    root = args.families_folder
    shapes = ensure(root)
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats, "warmup": args.warmup,
                              "models": shapes, "sentence_words": len(SENTENCE_20.split())}
    errors: dict[str, str] = {}
    calls = {"translate_opus_mt_shaped": ((SENTENCE_20, 5, "cross", -1, "mean", "heatmap", "opus-mt-shaped"),
                                          "/translate"),
             "translate_t5_small_shaped": ((SENTENCE_20, 5, "cross", -1, "mean", "heatmap", "t5-small-shaped"),
                                           "/translate"),
             "classify_deberta_v3_base_shaped": ((SENTENCE_20, "SST-2 sentiment", "deberta-v3-base-shaped"),
                                                 "/classify")}
    models_env = ",".join(str(root / name) for name in shapes)
    with AppServer(args.checkpoints, env={"ATLAS_MODELS": models_env}) as server:
        report["ready_s"] = rounded(server.ready_s, 3)
        client = client_for(server.url, timeout=args.timeout)
        try:
            for name, (call_args, api) in calls.items():
                times: list[float] = []
                for i in range(args.warmup + args.repeats):
                    t0 = time.perf_counter()
                    try:
                        out = client.submit(*call_args, api_name=api).result(timeout=args.timeout)
                    except Exception as err:  # reported; the next action still runs
                        errors[name] = f"{type(err).__name__}: {err}"[:300]
                        break
                    dt = time.perf_counter() - t0
                    if i == 0:
                        report[f"{name}_cold_s"] = rounded(dt)
                        report[f"{name}_answer"] = str(out[1] if api == "/translate" else out[0])[:200]
                    if i >= args.warmup:
                        times.append(dt)
                report[f"{name}_p50_s"] = rounded(percentile(times, 50))
                report[f"{name}_p95_s"] = rounded(percentile(times, 95))
                print(f"{name:34s} p50 {_fmt(report[f'{name}_p50_s'])}  p95 {_fmt(report[f'{name}_p95_s'])}  "
                      f"(cold {_fmt(report.get(f'{name}_cold_s'))})", file=sys.stderr)
        finally:
            client.close()
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    report["errors"] = errors
    report["targets"] = FAMILY_TARGETS
    report["meets_targets"] = {k: (report[k] <= v if report.get(k) is not None else None)
                               for k, v in FAMILY_TARGETS.items()}
    print(json.dumps(report))
    return 1 if errors else 0


def long_context(args: argparse.Namespace) -> int:
    """A 2,048-token Generate (+ 1 new token) and a zoom through the API on a random GPT-2-small-sized LLaMA with
    4,096 positions; the server's peak memory over the whole run."""
    from bench._long_model import long_llama_folder, long_prompt

    folder = args.long_folder
    shape_file = folder / "shape.json"
    if not shape_file.is_file():
        print(f"writing the random long-context LLaMA into {folder} ...", file=sys.stderr)
        shape_file.parent.mkdir(parents=True, exist_ok=True)
        shape_file.write_text(json.dumps(long_llama_folder(folder)))
    prompt = long_prompt()
    report: dict[str, Any] = {"machine": machine_info(), "repeats": args.repeats, "warmup": args.warmup,
                              "long_model": json.loads(shape_file.read_text())}
    errors: dict[str, str] = {}
    calls = {"generate_long": ((prompt, 1, folder.name), "/generate"),
             "attention_zoom_long": ((11, "mean", 1536, 2047, 1024, 1535, "max"), "/attention_zoom")}
    with AppServer(args.checkpoints, env={"ATLAS_MODELS": str(folder)}) as server:
        report["ready_s"] = rounded(server.ready_s, 3)
        # one client, one session, as one person: the zoom reads the kept result of that session's last Generate
        client = client_for(server.url, timeout=args.timeout)
        try:
            for name, (call_args, api) in calls.items():
                times: list[float] = []
                for i in range(args.warmup + args.repeats):
                    t0 = time.perf_counter()
                    try:
                        out = client.submit(*call_args, api_name=api).result(timeout=args.timeout)
                    except Exception as err:  # reported; the next action still runs
                        errors[name] = f"{type(err).__name__}: {err}"[:300]
                        break
                    dt = time.perf_counter() - t0
                    if i == 0:
                        report[f"{name}_cold_s"] = rounded(dt)
                    if i >= args.warmup:
                        times.append(dt)
                    if name == "generate_long":
                        report["long_notice"] = out[1]
                report[f"{name}_p50_s"] = rounded(percentile(times, 50))
                report[f"{name}_p95_s"] = rounded(percentile(times, 95))
                report[f"{name}_runs_s"] = [rounded(t, 2) for t in times]
                print(f"{name:30s} p50 {_fmt(report[f'{name}_p50_s'])}  p95 {_fmt(report[f'{name}_p95_s'])}  "
                      f"(cold {_fmt(report.get(f'{name}_cold_s'))})", file=sys.stderr)
        finally:
            client.close()
        report["server_peak_rss_mb"] = server.sampler.peak_mb() if server.sampler else None
    notice = report.get("long_notice") or ""
    if " tokens: the heatmap" in notice:  # the notice names the tokens the server kept
        report["long_tokens"] = int(notice.split(" tokens: the heatmap")[0].rsplit("· ", 1)[-1].replace(",", ""))
    try:
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    report["errors"] = errors
    report["targets"] = LONG_TARGETS
    report["meets_targets"] = {k: (report[k] <= v if report.get(k) is not None else None)
                               for k, v in LONG_TARGETS.items()}
    print(json.dumps(report))
    return 1 if errors else 0


def time_actions(url: str, actions: list[Action], args: argparse.Namespace, report: dict[str, Any],
                 errors: dict[str, str]) -> None:
    """Call each action one request at a time: warm-ups first (the first one is the cold call), then the timed
    repeats; p50 / p95 go into ``report``."""
    client = client_for(url, timeout=args.timeout)
    try:
        for action in actions:
            times: list[float] = []
            try:
                for i in range(args.warmup + args.repeats):
                    t0 = time.perf_counter()
                    call(client, action, timeout=args.timeout)
                    dt = time.perf_counter() - t0
                    if i == 0:
                        report[f"{action.name}_cold_s"] = rounded(dt)
                    if i >= args.warmup:
                        times.append(dt)
            except Exception as err:  # reported; the other actions still run
                errors[action.name] = f"{type(err).__name__}: {err}"[:300]
            report[f"{action.name}_p50_s"] = rounded(percentile(times, 50))
            report[f"{action.name}_p95_s"] = rounded(percentile(times, 95))
            report[f"{action.name}_n"] = len(times)
            print(f"{action.name:30s} p50 {_fmt(report[f'{action.name}_p50_s'])}  "
                  f"p95 {_fmt(report[f'{action.name}_p95_s'])}  (cold {_fmt(report.get(f'{action.name}_cold_s'))})"
                  + (f"  ERROR {errors[action.name]}" if action.name in errors else ""), file=sys.stderr)
    finally:
        client.close()


def import_seconds(module: str) -> float:
    """Wall time of ``python -c "import module"`` in a fresh interpreter."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True)
    return time.perf_counter() - t0


def _fmt(x: float | None) -> str:
    return "   n/a " if x is None else f"{x:7.3f}s"


if __name__ == "__main__":
    sys.exit(main())
