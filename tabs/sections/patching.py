"""Whether it matters (docs/ARCHITECTURE.md §2): activation patching between a clean and a corrupted input
(`models.inspect.patching`) measures which heads and positions carry the answer; a clicked head opens its attention
and its score split. /patch serves it for plain text. Generate and Classify call `patching(...)` in their layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np

from models import limits, registry
from tabs.common import FAST, Error, Plot, get_model, read_text
from tabs.sections.text import MAX_PATCH_CHARS, encode, require_heads, text_model
from tabs.sections.why import why
from tabs.zerogpu import on_gpu
from viz import attention as va
from viz import why as vw
from viz.common import esc

PATCH_TEXT = """### Does it matter? Activation patching
Run a *clean* and a *corrupted* input of the same length in tokens, then run the corrupted one again with a single
activation copied from the clean run: one head's output, or the residual stream at one layer and position. The
heatmap shows the fraction of the clean − corrupted logit difference that this one copy restores (1: the clean
answer is back, 0: no effect; Meng et al. 2022, Heimersheim & Nanda 2024). It shows where the information that
separates the two inputs is carried; it says nothing about what a head does on other inputs. Click a head to see
its attention on the clean input.

Both inputs' tokens are shown as you type, with the pieces where they differ. *Target and foil*: a language model
compares the two next tokens whose probability the corruption moves most in opposite directions (among each input's
five likeliest), unless you name a target; a classifier compares the clean answer with the corrupted one (or the
runner-up). When the two inputs' logit differences are close, every fraction divides by a small number and is
mostly noise; the note says so. *Align*: a swapped word that the tokenizer cuts into more pieces than the other
(`Mary` → `▁Mar y`, `John` → `▁John`) makes the inputs unequal in length; ticking "align" pads the shorter of the
two differing spans with word-boundary tokens (`▁`) before its word, so that the two spans take the same positions
and every shared token after them lines up (the note names the padded positions)."""


SWEEPS = {"heads (layer × head)": "heads", "residual stream (layer × position)": "positions"}


# A clean − corrupted logit difference under this share of the larger of the two (or of 1 nat) makes every restored
# fraction a ratio over a small number, mostly noise: the note warns (issue 48: 0.673 vs 0.612 read "restoring 149 %")
SMALL_SPAN = 0.2


CONTRAST_TOP = 5  # target and foil are picked among each input's this many likeliest next tokens


def patching(tab: str, resolve: Callable[..., str], model_inputs: list, examples: list[list[str]],
             why_section: dict[str, Any], repeated: bool = False) -> None:
    """The activation-patching section. ``resolve(*values of model_inputs)`` is the model's name; ``examples``
    are [clean, corrupted] pairs; ``repeated`` adds the induction example (repeated random words, first copy
    replaced) for language models."""
    gr.Markdown(PATCH_TEXT)
    with gr.Row():
        clean = gr.Textbox(label="clean input", value=examples[0][0] if examples else "", lines=2,
                           max_length=MAX_PATCH_CHARS)
        corrupted = gr.Textbox(label="corrupted input (same number of tokens)", lines=2, max_length=MAX_PATCH_CHARS,
                               value=examples[0][1] if examples else "")
    pieces = gr.Markdown(elem_id=f"{tab}-patch-tokens")
    with gr.Row():
        target = gr.Textbox("", label="target (empty: where the predictions differ)")
        sweep = gr.Radio(list(SWEEPS), value=list(SWEEPS)[0], label="patch")
        align = gr.Checkbox(False, label="align unequal inputs")
        run = gr.Button("Patch", variant="primary")
        rep = gr.Button("Induction example: first copy replaced") if repeated else None
    if examples:
        gr.Examples(examples, [clean, corrupted])
    note = gr.Markdown()
    fig = Plot(label="fraction of the logit difference restored", elem_id=f"{tab}-patch")
    with gr.Row():
        head_attn = Plot(label="the clicked head's attention on the clean input")
    head_note = gr.Markdown()
    kept = gr.State()
    cell = gr.Textbox(elem_id=f"{tab}-patch-cell", elem_classes=["atlas-hidden"], show_label=False, container=False)

    def run_text(*values, progress=gr.Progress()):
        *model_values, c, k, t, sw, al = values
        return patch_texts(resolve(*model_values), c, k, t, sw, progress, align=al)

    def preview(*values):
        *model_values, c, k, al = values
        return tokens_preview(resolve(*model_values), c, k, al)

    outputs = [note, fig, kept]
    owned = [note, fig, kept, head_attn, head_note]  # what a run shows: emptied before each run and on any change

    def empty():
        return "", None, None, None, ""

    run.click(empty, None, owned, api_name=False, show_progress="hidden", **FAST).then(
        run_text, [*model_inputs, clean, corrupted, target, sweep, align], outputs, api_name=False)
    for control in (clean, corrupted, target, sweep, align, *model_inputs):
        control.input(empty, None, owned, api_name=False, show_progress="hidden", **FAST)
    for control in (clean, corrupted, align, *model_inputs):
        control.change(preview, [*model_inputs, clean, corrupted, align], [pieces], api_name=False,
                       show_progress="hidden", trigger_mode="always_last", **FAST)
    if rep is not None:
        rep.click(empty, None, owned, api_name=False, show_progress="hidden", **FAST).then(
            lambda *v: patch_repeated(resolve(*v[:-1]), v[-1]), [*model_inputs, sweep],
            [note, fig, kept, clean, corrupted], api_name=False)
    cell.change(patched_head, [cell, kept], [head_attn, head_note, why_section["layer"], why_section["head"]],
               api_name=False)


def _target(net, target: str) -> int | None:
    """The user's target answer: a class name (classifiers) or a token (language models; its first piece)."""
    target = (target or "").strip()
    if not target:
        return None
    if not registry.family_of(net).causal_lm:
        from tabs.common import target_index

        return target_index(target, list(net.labels))
    ids, _ = net.encode_prompt(target)
    bos = getattr(net.tokenizer, "bos_id", net.config.bos_id)
    ids = [i for i in ids if i != bos]
    if not ids:
        raise Error(f"The target {target!r} has no tokens.")
    return int(ids[0])


def contrast(net, clean_ids: list[int], corrupted_ids: list[int], target: int | None = None
             ) -> tuple[int | None, int | None, str]:
    """A language model's target and foil where the two inputs' predictions differ: of the next tokens among either
    input's ``CONTRAST_TOP`` likeliest, the target is the one whose log-probability the corruption lowers most (the
    user's, when named) and the foil the one it raises most, so that the clean − corrupted logit difference is the
    largest such a pair gives. (None, None, "") for a classifier, whose few classes `patch_sweep` picks from."""
    import torch

    if not registry.family_of(net).causal_lm:
        return target, None, ""
    with torch.inference_mode():
        logits = net(torch.tensor([clean_ids, corrupted_ids]), last_only=True).logits[:, -1].float()
    logp = torch.log_softmax(logits, -1)  # (2, V)
    candidates = torch.cat([logp[0].topk(CONTRAST_TOP).indices, logp[1].topk(CONTRAST_TOP).indices]).unique()
    drop = logp[0, candidates] - logp[1, candidates]  # how much more likely on the clean input
    tgt = int(candidates[int(drop.argmax())]) if target is None else int(target)
    rest = [(float(d), int(c)) for d, c in zip(drop, candidates, strict=True) if int(c) != tgt]
    if not rest:
        return tgt, None, ""
    foil = min(rest)[1]
    p = logp.exp()
    said = (f"Target `{net.piece(tgt)}` ({p[0, tgt]:.1%} clean, {p[1, tgt]:.1%} corrupted) against foil "
            f"`{net.piece(foil)}` ({p[0, foil]:.1%} clean, {p[1, foil]:.1%} corrupted): "
            + ("the foil is the next token the corruption makes likelier most, of each input's "
               f"{CONTRAST_TOP} likeliest." if target is not None else
               f"the two next tokens, of each input's {CONTRAST_TOP} likeliest, whose probability the corruption "
               "moves most in opposite directions."))
    return tgt, foil, said


def small_span(clean: float, corrupted: float) -> bool:
    """True when the clean − corrupted logit difference is small against its scale (``SMALL_SPAN``)."""
    return abs(clean - corrupted) < SMALL_SPAN * max(abs(clean), abs(corrupted), 1.0)


def run_patch(name: str, clean_ids: list[int], corrupted_ids: list[int], target: int | None, sweep: str,
              progress=None, aligned: str = ""):
    """The sweep over ids: (note, figure, JSON dict, kept state). ``aligned``: how the inputs were aligned (said in
    the note)."""
    from models.inspect.patching import patch_sweep

    net = get_model(name)
    require_heads(net, "Activation patching")
    if not registry.family_of(net).ablation:
        raise Error("Patching is offered for the decoders of Generate and the classifiers.")
    sweep = SWEEPS.get(sweep, sweep)
    if sweep not in SWEEPS.values():
        raise Error(f"Unknown sweep {sweep!r}; choose heads or positions.")
    report = None if progress is None else (lambda done, text: progress(done, desc=f"patching: {text}"))
    if len(clean_ids) != len(corrupted_ids):
        raise Error(f"The clean input has {len(clean_ids)} tokens and the corrupted one {len(corrupted_ids)}: "
                    "patching needs the same number.")
    target, foil, chosen = contrast(net, clean_ids, corrupted_ids, target)
    try:
        r = patch_sweep(net, clean_ids, corrupted_ids, sweep=sweep, target=target, foil=foil, progress=report)
    except ValueError as err:
        raise Error(str(err)) from None
    unit = "head" if sweep == "heads" else "position"
    best = np.unravel_index(int(np.nanargmax(r.restored)), r.restored.shape)
    shown = r.clean_tokens if sweep == "positions" else None
    noisy = small_span(r.logit_diff_clean, r.logit_diff_corrupted)
    sub = (f"target `{r.target_label}` against `{r.foil_label}` · logit difference {r.logit_diff_clean:.2f} clean, "
           f"{r.logit_diff_corrupted:.2f} corrupted" + (" · ⚠ small difference: fractions unreliable" if noisy else ""))
    fig = vw.patching_heatmap(r.restored, sweep, tokens=shown, title=esc(f"Activation patching · {name} · by {unit}"),
                              subtitle=esc(sub))
    what = f"head {best[1]}" if sweep == "heads" else f"position {best[1]} `{r.clean_tokens[best[1]]}`"
    span = r.logit_diff_clean - r.logit_diff_corrupted
    warn = (f"⚠ **The two inputs barely differ in this logit difference** ({r.logit_diff_clean:.3f} clean, "
            f"{r.logit_diff_corrupted:.3f} corrupted: {span:+.3f}, under {SMALL_SPAN:.0%} of its size), so every "
            "fraction below divides by a small number and is mostly noise (values far outside 0–100 % are its mark). "
            "Pick a corrupted input that changes the answer, or name a target the two inputs disagree on.\n\n"
            if noisy else "")
    note = (warn + (aligned + " " if aligned else "") + (chosen + " " if chosen else "")
            + f"{len(clean_ids)} tokens each. Logit difference `{r.target_label}` − `{r.foil_label}`: "
            f"{r.logit_diff_clean:.3f} on the clean input, {r.logit_diff_corrupted:.3f} on the corrupted one. "
            f"The strongest single patch is layer {best[0]} {what}, restoring {r.restored[best]:.0%}."
            + (" Click a head to see its attention on the clean input." if sweep == "heads" else ""))
    table = {"restored": r.restored.tolist(), "sweep": sweep, "logit_diff_clean": r.logit_diff_clean,
             "logit_diff_corrupted": r.logit_diff_corrupted, "target": r.target_label, "foil": r.foil_label,
             "clean_tokens": r.clean_tokens, "corrupted_tokens": r.corrupted_tokens, "small_difference": noisy}
    if aligned:
        table["aligned"] = aligned
    return note, fig, table, {"model": name, "ids": list(clean_ids), "tokens": r.clean_tokens, "sweep": sweep}


def _pair(net, clean: str, corrupted: str, target: str, align: bool = False
          ) -> tuple[int | None, list[int], list[int], str]:
    """The target answer, both texts' ids as the model reads them and how they were aligned (""): lengths in tokens
    must agree, or ``align`` pads the shorter differing span (`align_ids`)."""
    clean, corrupted = read_text(clean), read_text(corrupted)
    wanted = _target(net, target)
    a, ta, _ = encode(net, clean)
    b, tb, _ = encode(net, corrupted)
    aligned = ""
    if len(a) != len(b):
        if not align:
            raise Error(f"The clean input has {len(a)} tokens and the corrupted one {len(b)}: patching needs the same "
                        f"number of tokens. {differing(ta, tb)} Change a word for one of the same length in tokens, "
                        "or tick \"align\" to pad the shorter span.")
        a, b, aligned = align_ids(net, a, b)
    if len(a) > limits.MAX_PATCH_TOKENS:  # a sweep runs a forward per head or per position
        raise Error(f"Patching reads at most {limits.MAX_PATCH_TOKENS} tokens; these inputs have {len(a)}. Shorten "
                    "both texts the same way.")
    return wanted, a, b, aligned


def differing(ta: list[str], tb: list[str]) -> str:
    """Which pieces differ between the two inputs, in words (each differing span, up to three)."""
    blocks = _blocks(ta, tb)
    if not blocks:
        return "The two inputs have the same tokens."
    shown = lambda pieces: " ".join(f"`{esc(t)}`" for t in pieces) or "nothing"  # noqa: E731
    said = [f"at {i1}: clean {shown(ta[i1:i2])} ({i2 - i1} piece{'s' * (i2 - i1 != 1)}), corrupted "
            f"{shown(tb[j1:j2])} ({j2 - j1} piece{'s' * (j2 - j1 != 1)})" for i1, i2, j1, j2 in blocks[:3]]
    more = f"; {len(blocks) - 3} more" if len(blocks) > 3 else ""
    return "They differ " + "; ".join(said) + more + "."


_FILLERS: dict[int, int | None] = {}


def filler(net) -> int | None:
    """The id of a bare word boundary (SentencePiece's `▁`, byte-level BPE's `Ġ`): what `align_ids` pads with, the
    piece that says least. None when the vocabulary has none (a WordPiece model)."""
    key = id(net.tokenizer)
    if key not in _FILLERS:
        piece = net.piece if registry.family_of(net).causal_lm else net.tokenizer.id_to_piece
        size = int(net.tokenizer.vocab_size)
        _FILLERS[key] = next((i for i in range(size) if piece(i) == "▁"), None)  # a byte-level "Ġ" reads "▁"
    return _FILLERS[key]


def _blocks(a: list, b: list) -> list[tuple[int, int, int, int]]:
    """The spans where two token lists differ, as (start in a, end in a, start in b, end in b), from difflib's
    longest matching blocks (each swapped word its own span, the shared words between them matched)."""
    import difflib

    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def align_ids(net, a: list[int], b: list[int]) -> tuple[list[int], list[int], str]:
    """Two unequal inputs made equal: the tokens they share stay; in each span where they differ (difflib's
    matching, so each swapped word is its own span), the shorter side gets word-boundary tokens (`filler`) before
    its pieces, so that both spans take the same positions and every shared token after them lines up. Returns both
    id lists and a sentence saying what was padded."""
    pad = filler(net)
    if pad is None:
        raise Error("This model's vocabulary has no bare word-boundary token to pad with; change a word for one of "
                    "the same length in tokens instead.")
    out_a, out_b, padded = [], [], {"clean": [], "corrupted": []}
    i = j = 0
    for i1, i2, j1, j2 in _blocks(a, b):
        out_a += a[i:i1]
        out_b += b[j:j1]
        n = (j2 - j1) - (i2 - i1)
        side, out = ("clean", out_a) if n > 0 else ("corrupted", out_b)
        padded[side] += range(len(out), len(out) + abs(n))
        out += [pad] * abs(n)
        out_a += a[i1:i2]
        out_b += b[j1:j2]
        i, j = i2, j2
    out_a += a[i:]
    out_b += b[j:]
    said = "; ".join(f"the {side} input {len(where)} at position{'s' * (len(where) != 1)} "
                     f"{', '.join(map(str, where))}" for side, where in padded.items() if where)
    return out_a, out_b, (f"Aligned with word-boundary tokens before each shorter differing word ({said}), so both "
                          f"have {len(out_a)} tokens and every shared token lines up.")


def tokens_preview(name: str, clean: str, corrupted: str, align: bool = False) -> str:
    """Both inputs as the model will read them, before the run: their token counts, the pieces that differ, and
    whether patching can take them as they are."""
    if not (clean or "").strip() or not (corrupted or "").strip():
        return ""
    try:
        net = get_model(name)
        a, ta, _ = encode(net, read_text(clean))
        b, tb, _ = encode(net, read_text(corrupted))
    except Error as err:
        return f"⚠ {err.message}"

    def line(label: str, tokens: list[str], other: list[str]) -> str:
        if len(tokens) == len(other):  # position by position, as patching pairs them
            marked = {i for i, (x, y) in enumerate(zip(tokens, other, strict=True)) if x != y}
        else:  # unequal: difflib's spans, as "align" pads them
            marked = {k for i1, i2, _, _ in _blocks(tokens, other) for k in range(i1, i2)}
        shown = [f"**{esc(t)}**" if i in marked else esc(t) for i, t in enumerate(tokens)]
        return f"{label} · {len(tokens)} tokens: " + " · ".join(shown)

    head = [line("clean", ta, tb), line("corrupted", tb, ta)]
    if len(a) == len(b):
        verdict = "Same length: ready to patch."
    elif align:
        verdict = f"Different lengths; \"align\" pads the shorter span. {differing(ta, tb)}"
    else:
        verdict = (f"⚠ Different lengths ({len(a)} and {len(b)} tokens): {differing(ta, tb)} Tick \"align\" or swap "
                   "a word for one of the same length in tokens.")
    return "\n\n".join([*head, verdict])


def patch_texts(name: str, clean: str, corrupted: str, target: str, sweep: str, progress=None, align: bool = False):
    """Patching between two texts: each encoded as the model reads it; lengths must agree (or ``align``)."""
    net = get_model(name)
    wanted, a, b, aligned = _pair(net, clean, corrupted, target, align)
    note, fig, _, kept = run_patch(name, a, b, wanted, sweep, progress, aligned)
    return note, fig, kept


def patch_repeated(name: str, sweep: str, n: int = 19, seed: int = 0):
    """The induction example: n random whole words then the same words again, against n other words then the same
    repeat (models.inspect.patching.repeated_text_pair). The boxes get both texts, which read back as exactly the ids
    patched, so a second Patch on them runs the same input, for every tokenizer."""
    from models.inspect.patching import repeated_text_pair

    net = get_model(name)
    require_heads(net, "Activation patching")
    try:
        clean_text, corrupted_text, clean, corrupted = repeated_text_pair(net, n, seed)
    except ValueError as err:
        raise Error(f"The induction example cannot be made for this model: {err}.") from None
    note, fig, _, kept = run_patch(name, clean, corrupted, None, sweep)
    note = ("Repeated random words: the clean input repeats its first words, so an induction head can predict the "
            "next word from the earlier occurrence; the corrupted input has other words first. " + note)
    return note, fig, kept, clean_text, corrupted_text


def patched_head(cell: str, kept):
    """A clicked cell of the head sweep: that head's attention on the clean input, the score of its last query
    on the key it attends to most split by parts, and the section's sliders set to it."""
    from models.inspect.decompose import attention_scores

    if not kept or kept.get("sweep") != "heads":
        raise Error("Clicks open a head: run the sweep by head (layer × head) first.")
    try:
        layer, head = (int(v) for v in str(cell).split(",")[:2])
    except ValueError:
        raise Error(f"Not a cell: {cell!r}.") from None
    net = get_model(kept["model"])
    ids, tokens = kept["ids"], kept["tokens"]
    scores = attention_scores(net, ids)[layer, head]  # (T, T)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    fig = va.attention_heatmap(weights, tokens, tokens, title=esc(f"Clean input · layer {layer} · head {head}"))
    key = int(np.argmax(weights[-1]))
    summary, _, _ = why(net, ids, tokens, layer, head, len(ids) - 1, key, kept["model"])
    return fig, summary, gr.update(value=layer), gr.update(value=head)


@on_gpu  # a ZeroGPU Space attaches its GPU for this call (tabs/zerogpu.py)
def patch(clean: str, corrupted: str, model: str = "gpt-tiny", target: str = "", sweep: str = "heads",
          align: bool = False) -> tuple[str, dict]:
    """Activation patching between two texts of the same token length: (Plotly figure as JSON text, {restored
    (layer × head or layer × position), logit_diff_clean, logit_diff_corrupted, target, foil, tokens,
    small_difference}). sweep: "heads" or "positions"; target: a token or class (empty: a language model's two next
    tokens the inputs disagree on most, a classifier's clean answer); align: pad the shorter differing span."""
    net = text_model(model or "gpt-tiny")
    wanted, a, b, aligned = _pair(net, clean, corrupted, target, bool(align))
    _, fig, table, _ = run_patch(model or "gpt-tiny", a, b, wanted, sweep, aligned=aligned)
    return fig.to_json(), table


def register_api() -> None:
    """/patch: activation patching of plain text (no tab's kept Result)."""
    gr.api(patch, api_name="patch", concurrency_limit=2)
