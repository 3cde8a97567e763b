"""Activation patching and attention-sink ablation for the decoder LM (models/families/gpt.py) and the text classifiers.

Activation patching (causal tracing, Meng et al. 2022, "Locating and Editing Factual Associations in GPT"; head
patching as in Wang et al. 2022, "Interpretability in the Wild: a Circuit for Indirect Object Identification in
GPT-2 small"): run a *clean* input and a *corrupted* one of the same length that the model answers differently,
then rerun the corrupted input with one activation taken from the clean run. The more of the clean answer that
single activation brings back, the more the model's answer runs through it. The metric follows Heimersheim &
Nanda 2024, "How to use and interpret activation patching": the logit difference LD = logit[target] −
logit[foil], normalised so that 1 is the clean run and 0 the corrupted one,

    restored = (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted).

Two sweeps, each batched one forward pass per layer (``models.blocks.attention.Intervention`` rows):

- ``"heads"``: every layer × head, that head's output (softmax(QKᵀ)V before the output projection) patched;
  batch row h of layer l patches head h;
- ``"positions"``: every layer × position, the residual stream entering the layer at that position patched;
  batch row t patches position t.

Language models are read at the last position's next-token logits, classifiers at their class logits (one
unpadded sequence, as ``classify_text``). When the clean and corrupted inputs give the same logit difference
the normalisation is undefined and ``patch_sweep`` raises ``ValueError`` saying so.

``sink_ablation`` forbids one head to attend to token 0, where many heads park attention they do not need (the
"attention sink", Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"): the weight on
key 0 becomes 0 and each row renormalises over the other keys, inside the forward pass, so every later layer sees
the change. Query 0 of a causal model sees key 0 only and keeps it.

Nothing here changes the shared model: every variation is an ``edit`` argument of a forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.blocks.attention import Intervention, LayerEdit
from models.outputs import PatchResult, SinkAblation

SWEEPS = ("heads", "positions")
MAX_BATCH_TOKENS = 8192  # rows × tokens per forward pass of a sweep: longer inputs run a layer in chunks

Progress = Callable[[float, str], object]


@dataclass
class _Run:
    scores: Tensor  # (B, K): next-token logits at the last position (LM) or class logits, float32
    heads: list[Tensor]  # per layer (B, H, T, d_head), when recorded
    residual: list[Tensor]  # per layer (B, T, D) entering it, when recorded
    attention: list[Tensor]  # per layer (B, H, T, T), with need_weights
    logits: Tensor | None = None  # LM with need_weights: every position's logits (B, T, V)


def _is_lm(model: nn.Module) -> bool:
    from models.families.gpt import GPT

    return isinstance(model, GPT)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward(model: nn.Module, ids: Tensor, edit: Intervention | None, need_weights: bool = False) -> _Run:
    """One forward pass of either kind of model on ids (B, T)."""
    if _is_lm(model):
        out = model(ids, need_weights=need_weights, keep_hidden=edit is not None and edit.record, edit=edit,
                    last_only=not need_weights)
        return _Run(_wide(out.logits[:, -1]), out.heads, out.hidden[:-1], out.attention,
                    out.logits if need_weights else None)
    # one unpadded sequence per row: every id is real, even one that equals pad_id (as classify_text)
    out = model.forward_edited(ids, torch.zeros_like(ids, dtype=torch.bool), edit, need_weights=need_weights)
    return _Run(_wide(out.logits), out.heads, out.residual, out.attention)


def _wide(t: Tensor) -> Tensor:
    """float32 for the metric (an fp16 model's logits too); float64 stays float64."""
    return t if t.dtype == torch.float64 else t.float()


def _layers_heads(model: nn.Module) -> tuple[int, int]:
    return int(model.config.n_layers), int(model.config.n_heads)


def _check_ids(model: nn.Module, ids: Sequence[int], name: str) -> list[int]:
    out = [int(i) for i in ids]
    if not out:
        raise ValueError(f"the {name} input is empty")
    c = model.config
    limit = c.max_len
    if len(out) > limit:
        raise ValueError(f"the {name} input has {len(out)} tokens; the model takes at most {limit}")
    if not all(0 <= i < c.vocab_size for i in out):
        raise ValueError(f"the {name} input has token ids outside the vocabulary of {c.vocab_size}")
    return out


def _tokens(model: nn.Module, ids: Sequence[int]) -> list[str]:
    if _is_lm(model):
        return [model.piece(i) for i in ids]
    tok = model.tokenizer
    return [tok.id_to_piece(int(i)) if tok is not None else str(int(i)) for i in ids]


def _label(model: nn.Module, i: int) -> str:
    if _is_lm(model):
        return model.piece(i)
    labels = list(model.labels)
    return labels[i] if len(labels) == model.config.n_classes else str(i)


def _answers(model: nn.Module) -> int:
    return int(model.config.vocab_size if _is_lm(model) else model.config.n_classes)


class _Eval:
    """Eval mode for the duration (dropout off), as classify_text and generate; a no-op for served models."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was = model, model.training

    def __enter__(self) -> None:
        if self.was:
            self.model.eval()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            self.model.train(True)


# ----------------------------------------------------------------------------------------------------
# Activation patching


def patch_sweep(model: nn.Module, clean_ids: Sequence[int], corrupted_ids: Sequence[int], sweep: str = "heads",
                target: int | None = None, foil: int | None = None,
                progress: Progress | None = None) -> PatchResult:
    """Patch each head's output (``sweep="heads"``) or each residual position (``"positions"``) of every layer
    from the clean run into the corrupted run; ``restored`` says how much of the clean logit difference each
    patch brings back (module docstring). ``model``: a ``GPT`` or a text classifier (``TextClassifier``,
    ``BertClassifier``); ids with specials included, both inputs the same length.

    target: the answer whose logit counts for (LM: token id; classifier: class index), by default the clean
    run's top answer. foil: the one it counts against, by default the corrupted run's top answer, or the clean
    run's second-best when that is the target. progress(fraction, text) is called once per layer.
    Raises ValueError on inputs of different lengths, out-of-range answers, or when the clean and corrupted
    inputs give the same logit difference (nothing to restore).
    """
    if sweep not in SWEEPS:
        raise ValueError(f"sweep must be one of {SWEEPS}, got {sweep!r}")
    clean = _check_ids(model, clean_ids, "clean")
    corrupted = _check_ids(model, corrupted_ids, "corrupted")
    if len(clean) != len(corrupted):
        raise ValueError(f"clean has {len(clean)} tokens, corrupted has {len(corrupted)}; "
                         "patching needs the same length")
    n_layers, n_heads = _layers_heads(model)
    t, n = len(clean), _answers(model)
    for name, value in (("target", target), ("foil", foil)):
        if value is not None and not 0 <= int(value) < n:
            raise ValueError(f"{name} must be in [0, {n}), got {value}")
    dev = _device(model)
    with torch.inference_mode(), _Eval(model):
        # both inputs in one pass, recording the clean run's head outputs and residual stream (row 0)
        runs = _forward(model, torch.tensor([clean, corrupted], device=dev), Intervention(record=True))
        s_clean, s_corrupt = runs.scores[0], runs.scores[1]
        tgt = int(s_clean.argmax()) if target is None else int(target)
        if foil is None:
            fl = int(s_corrupt.argmax())
            if fl == tgt:  # the corrupted run answers the same: count against the clean run's runner-up
                fl = int(s_clean.topk(2).indices[1])
        else:
            fl = int(foil)
        if tgt == fl:
            raise ValueError(f"target and foil are the same answer ({_label(model, tgt)!r}); pick two different ones")
        ld_clean = float(s_clean[tgt] - s_clean[fl])
        ld_corrupt = float(s_corrupt[tgt] - s_corrupt[fl])
        span = ld_clean - ld_corrupt
        if not abs(span) > 1e-6 * max(1.0, abs(ld_clean)):
            raise ValueError(f"the clean and corrupted inputs give the same logit difference ({ld_clean:.4g}) "
                             f"between {_label(model, tgt)!r} and {_label(model, fl)!r}: nothing to restore, "
                             "so the patching effect is undefined; make the corrupted input change the answer")
        width = n_heads if sweep == "heads" else t
        restored = np.zeros((n_layers, width), dtype=np.float32)
        corrupted_row = torch.tensor([corrupted], device=dev)
        rows_per_pass = max(1, MAX_BATCH_TOKENS // t)
        for layer in range(n_layers):
            if sweep == "heads":
                source, size = runs.heads[layer][:1], n_heads  # (1, H, T, d), patched per head
            else:
                source, size = runs.residual[layer][:1], t  # (1, T, D), patched per position
            lds = []
            for start in range(0, width, rows_per_pass):
                stop = min(width, start + rows_per_pass)
                select = torch.eye(size, dtype=torch.bool, device=dev)[start:stop]  # row r patches unit start + r
                edit = LayerEdit(head_values=source, head_select=select) if sweep == "heads" else \
                    LayerEdit(resid_values=source, resid_select=select)
                scores = _forward(model, corrupted_row.expand(stop - start, t), Intervention({layer: edit})).scores
                lds.append(scores[:, tgt] - scores[:, fl])
            restored[layer] = ((torch.cat(lds) - ld_corrupt) / span).cpu().numpy()
            if progress is not None:
                progress((layer + 1) / n_layers, f"layer {layer + 1} of {n_layers}")
    return PatchResult(restored=restored, sweep=sweep, logit_diff_clean=ld_clean, logit_diff_corrupted=ld_corrupt,
                       target=tgt, foil=fl, target_label=_label(model, tgt), foil_label=_label(model, fl),
                       clean_tokens=_tokens(model, clean), corrupted_tokens=_tokens(model, corrupted))


def repeated_pair(model: nn.Module, n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """The induction example for a language model: (clean, corrupted), both 2n tokens.

    clean = BOS + A + A[:-1], corrupted = BOS + B + A[:-1], with A and B n random non-special tokens each, no
    token twice. At the last position the clean model has seen A once, so an induction head (Olsson et al. 2022)
    can look back to the token after the last one's earlier occurrence and predict A[-1]; the corrupted input
    holds the same last n − 1 tokens but no earlier copy, so nothing there points at A[-1]. The clean run's top
    answer (A[-1] for a model with working induction heads) is the target; the next token is never part of the
    input, which would make it trivially visible. Patching the heads that restore the clean answer finds the
    induction circuit.
    """
    from models.families.gpt import GPT

    if not isinstance(model, GPT):
        raise ValueError("the repeated-token example needs a language model")
    c, tok = model.config, model.tokenizer
    if n < 2 or 2 * n > model.context_limit():
        raise ValueError(f"n must be between 2 and {model.context_limit() // 2}, got {n}")
    special = {c.bos_id, c.eos_id, c.pad_id} | ({tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id} if tok else set())
    pool = np.array([i for i in range(c.vocab_size) if i not in special])
    x = np.random.default_rng(seed).choice(pool, 2 * n, replace=len(pool) < 2 * n).tolist()
    a, b = x[:n], x[n:]
    bos = tok.bos_id if tok is not None and tok.bos_id >= 0 else c.bos_id
    return [int(bos), *a, *a[:-1]], [int(bos), *b, *a[:-1]]


_WORDS: dict[int, list[str]] = {}  # id(tokenizer) -> its whole words (word_pool)


def word_pool(model: nn.Module) -> list[str]:
    """The words of a language model's vocabulary that one piece spells whole: a word-start piece of two or more ASCII
    letters ("▁cat", a byte-level "Ġcat" read as "▁cat"), sorted; read once per tokenizer."""
    tok = model.tokenizer
    key = id(tok)
    if key not in _WORDS:
        special = {tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id}
        words = set()
        for i in range(int(tok.vocab_size)):
            label = str(tok.id_to_piece(i))
            if i not in special and label.startswith("▁") and len(label) > 2 and label[1:].isascii() \
                    and label[1:].isalpha():
                words.add(label[1:])
        _WORDS[key] = sorted(words)
    return _WORDS[key]


def repeated_text_pair(model: nn.Module, n: int, seed: int = 0, tries: int = 50
                       ) -> tuple[str, str, list[int], list[int]]:
    """The induction example as text (clean, corrupted, their ids), for a person to read and run again: n random whole
    words A (``word_pool``), then A[:-1] again; the corrupted text has n other words B first. Each text is what the
    model reads (``encode_prompt``), so the ids are those of the text typed back; of the draws (``seed``, then the
    next ones) the first whose two texts have the same number of tokens is taken, for every tokenizer (a word may
    take two pieces at the start of a text). n shrinks to what the vocabulary's words allow."""
    if not hasattr(model, "encode_prompt") or getattr(model, "tokenizer", None) is None:
        raise ValueError("the repeated-word example needs a language model with a tokenizer")
    words = word_pool(model)
    n = min(int(n), len(words) // 2, model.context_limit() // 4)
    if n < 2:
        raise ValueError("this vocabulary has too few whole words for the repeated-word example")
    rng = np.random.default_rng(seed)
    for _ in range(tries):
        x = rng.choice(len(words), 2 * n, replace=False)
        a, b = [words[i] for i in x[:n]], [words[i] for i in x[n:]]
        clean, corrupted = " ".join(a + a[:-1]), " ".join(b + a[:-1])
        clean_ids, corrupted_ids = model.encode_prompt(clean)[0], model.encode_prompt(corrupted)[0]
        if len(clean_ids) == len(corrupted_ids):
            return clean, corrupted, list(clean_ids), list(corrupted_ids)
    raise ValueError(f"no draw of {n} words gave two texts of the same length in tokens")


# ----------------------------------------------------------------------------------------------------
# Attention-sink ablation


def sink_ablation(model: nn.Module, ids: Sequence[int], layer: int, head: int, *,
                  everywhere: bool = False) -> SinkAblation:
    """Forbid ``head`` of ``layer`` (``everywhere``: every head of every layer) to attend to token 0 during the forward
    pass and report what changes (the attention reported is ``head`` of ``layer``'s).

    Language model: the mean next-token loss over tokens 1..T−1 (nats) and, at the last position, the top next
    token's probability and loss, before and after. Classifier: every class probability before and after, the
    predicted class's in particular. Both: the head's attention (T, T) before and after, from the forward passes
    themselves (after the ablation it is zero on key 0 for every query but query 0 of a causal model).
    """
    x = _check_ids(model, ids, "given")
    n_layers, n_heads = _layers_heads(model)
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise ValueError(f"layer must be in [0, {n_layers}) and head in [0, {n_heads}), got {layer}, {head}")
    dev = _device(model)
    forbid = torch.zeros(n_heads, 1, dtype=torch.bool, device=dev)
    forbid[slice(None) if everywhere else head, 0] = True  # (H, 1): key 0 for this head; the later keys stay allowed
    edit = Intervention({i: LayerEdit(forbid=forbid) for i in (range(n_layers) if everywhere else [layer])})
    row = torch.tensor([x], device=dev)
    with torch.inference_mode(), _Eval(model):
        before = _forward(model, row, None, need_weights=True)
        after = _forward(model, row, edit, need_weights=True)
    w_before = before.attention[layer][0, head].float().cpu().numpy()
    w_after = after.attention[layer][0, head].float().cpu().numpy()
    p_before, p_after = torch.softmax(before.scores[0], -1), torch.softmax(after.scores[0], -1)
    tgt = int(p_before.argmax())
    common = dict(layer=layer, head=head, tokens=_tokens(model, x), attention_before=w_before,
                  attention_after=w_after, target=tgt, target_label=_label(model, tgt),
                  target_prob_before=float(p_before[tgt]), target_prob_after=float(p_after[tgt]))
    if _is_lm(model):
        assert before.logits is not None and after.logits is not None
        notice = "" if len(x) > 1 else "One token: the next-token loss needs at least two."
        return SinkAblation(**common, loss_before=_mean_loss(before.logits[0], row[0]),
                            loss_after=_mean_loss(after.logits[0], row[0]),
                            target_loss_before=float(-torch.log_softmax(before.scores[0], -1)[tgt]),
                            target_loss_after=float(-torch.log_softmax(after.scores[0], -1)[tgt]), notice=notice)
    return SinkAblation(**common, labels=[_label(model, i) for i in range(_answers(model))],
                        probs_before=p_before.cpu().numpy().astype(np.float32),
                        probs_after=p_after.cpu().numpy().astype(np.float32))


def _mean_loss(logits: Tensor, ids: Tensor) -> float:
    """Mean cross-entropy (nats) of tokens 1..T−1 given the ones before; NaN for one token."""
    if ids.numel() < 2:
        return float("nan")
    return float(F.cross_entropy(logits[:-1].float(), ids[1:]))
