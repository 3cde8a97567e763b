"""Attribution: which tokens or patches a classifier's answer rests on, five methods on one footing.

Inputs as the entry points take them (a text or token ids with specials; an image or a normalised image
tensor), out an ``Attribution`` (models/outputs.py) with float32 values aligned with the tokens or the patch
grid. The explained quantity is the target class's logit f (before the softmax); the target is the
predicted class unless one is given. Values are signed: positive supports the target.

- ``attention``: the last layer's attention, mean over heads, read from the position the head reads
  (row 0, [CLS]) or, for mean-pooled models, the mean over the rows of every token.
- ``rollout``: attention rollout (Abnar & Zuidema 2020), ``models.analysis.pooled_rollout``.
- ``relevance``: gradient-weighted attention relevance (Chefer et al. 2021, "Generic Attention-model
  Explainability", eq. 5-6 for self-attention): R = I, then for each layer in order
  R <- R + E_h[(∇A ⊙ A)⁺] · R, with ∇A = ∂f/∂A; R − I (what the layers add) read like ``attention``.
- ``gradxinput``: gradient × input (Shrikumar et al. 2016). Text: Σ_d e · ∂f/∂e over the word embeddings e
  (before positions are added). Images: Σ x · ∂f/∂x over the channels and pixels of each patch of the
  normalised image x; for ViT that is (patch embedding − its bias) · gradient summed over D, since the patch
  embedding is linear.
- ``integrated_gradients`` (Sundararajan et al. 2017): (x − x′) ⊙ ∫₀¹ ∂f/∂x(x′ + α(x − x′)) dα, summed as
  gradient × input. Baselines: text, the [PAD] embedding at every non-special position (specials kept, so
  they get exactly 0); images, a Gaussian-blurred copy (Sturmfels et al. 2020, "Visualizing the Impact of
  Feature Attribution Baselines"). The integral is a ``steps``-point Gauss–Legendre rule (Captum's default;
  far closer to the integral than a Riemann sum at the same cost), the steps of all inputs run in batches.
  Completeness (Prop. 1: Σ attributions = f(x) − f(x′)) is checked: ``completeness_gap`` is the relative gap.

Swin has only local window attention (nothing global to roll out or trace), so it offers the gradient
methods only (its ``models.registry`` family's ``methods``, ``methods_for``); asking for another raises ValueError.

What a model must offer (no hooks: the app's models are shared by concurrent requests, so nothing here
changes the model; all gradients are taken with ``torch.autograd.grad`` with respect to inputs, never
accumulated into parameters): text classifiers ``token_embeddings(ids)`` and ``forward_embedded(emb,
pad_mask, need_weights)`` returning logits and the per-layer attention in the autograd graph; ViT
``embed_patches(x)`` and ``forward_embedded(patches, need_weights)``; other image models (Swin) a plain
``forward(x) -> logits``. Models whose linear layers are fp16-packed (``models.decoding.packed``, the app's model
store) work as they are: a ``PackedLinear`` runs plain ``F.linear`` whenever gradients are enabled.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from models import registry
from models.analysis import pooled_rollout
from models.outputs import GRADIENT_METHODS, METHODS, Attribution, DeletionCurve

__all__ = [
    "GRADIENT_METHODS",
    "METHODS",
    "Attribution",
    "DeletionCurve",
    "blur",
    "curve_counts",
    "delete_tokens",
    "deletion_curve",
    "deletion_curves",
    "explain",
    "explain_batch",
    "fill_patches",
    "gauss_legendre",
    "mean_fill",
    "methods_for",
    "probabilities",
    "ranking",
]
DEFAULT_STEPS = 32  # integrated-gradients steps
MAX_POINTS = 10  # deletion-curve points
_ACTIVATION_BUDGET = 1 << 22  # rows × tokens × width × layers per chunk of a batched gradient run


def methods_for(model: nn.Module) -> tuple[str, ...]:
    """The methods of METHODS this model's family offers (models.registry), in METHODS order."""
    offered = registry.family_of(model).methods
    return tuple(m for m in METHODS if m in offered)


def _kind(model: nn.Module) -> str:
    if hasattr(model, "token_embeddings") and hasattr(model, "forward_embedded"):
        return "text"
    if hasattr(model, "embed_patches") and hasattr(model, "forward_embedded"):
        return "vit"
    if hasattr(getattr(model, "config", None), "image_size"):
        return "image"  # Swin, or any image classifier with forward(x) -> logits
    raise ValueError(f"{type(model).__name__} is not a classifier that attribution knows")


def _check(model: nn.Module, method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; known: {', '.join(METHODS)}")
    kind = _kind(model)
    if method not in methods_for(model):
        raise ValueError(
            f"{type(model).__name__} offers {', '.join(methods_for(model))} only: its attention is local to "
            f"windows, with no global attention to roll out or trace back ({method!r} asked)"
        )
    if model.training:
        raise ValueError("attribution needs the model in eval mode (dropout off)")
    return kind


@contextlib.contextmanager
def _autograd() -> Iterator[None]:
    """Gradients on, even under a caller's no_grad or inference_mode (thread-local, so concurrent-safe)."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def _param(model: nn.Module) -> Tensor:
    return next(model.parameters())


def _reads(model: nn.Module) -> str:
    """What the classifier head reads of the last layer: "cls" (position 0) or "mean" (every token)."""
    if _kind(model) != "text":
        return "cls"
    return str(getattr(model, "reads", model.config.pooling))


def _rows_per_chunk(model: nn.Module, tokens: int, batch_size: int | None) -> int:
    """Rows per forward/backward pass: ``batch_size``, or as many as keep the activations to about a GB."""
    if batch_size is not None:
        return max(1, int(batch_size))
    c = model.config
    width, layers = c.d_model, c.n_layers  # every family's config speaks this vocabulary (models/registry.py)
    return max(1, min(64, _ACTIVATION_BUDGET // max(1, tokens * width * layers)))


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def gauss_legendre(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes α in (0, 1) and weights (summing to 1) of the ``steps``-point Gauss–Legendre rule on [0, 1]."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return (nodes + 1.0) / 2.0, weights / 2.0


# ---------------------------------------------------------------------------------------------- inputs
class _Text:
    """One text input: ids with specials, token labels, which positions are special."""

    def __init__(self, ids: list[int], tokens: list[str], special: np.ndarray, notice: str) -> None:
        self.ids, self.tokens, self.special, self.notice = ids, tokens, special, notice


def _special_ids(model: nn.Module) -> set[int]:
    tok = getattr(model, "tokenizer", None)
    return set() if tok is None else {i for i in (tok.bos_id, tok.eos_id, tok.cls_id, tok.sep_id) if i >= 0}


def _prepare_text(model: nn.Module, text: str | Sequence[int]) -> _Text:
    from models.inputs.tokenizer import encode_input

    ids, tokens, notice = encode_input(
        model.tokenizer if hasattr(model, "tokenizer") else None, text, model.config.max_len, type(model).__name__
    )
    if not ids:
        raise ValueError("nothing to explain: the input has no tokens")
    specials = _special_ids(model)
    if specials:
        special = np.array([i in specials for i in ids], dtype=bool)
    else:  # no tokenizer: the encoders' convention, a special first and last (<s> ... </s>, [CLS] ... [SEP])
        special = np.zeros(len(ids), dtype=bool)
        special[[0, -1]] = True
    return _Text(ids, tokens, special, notice)


def _normalisation(model: nn.Module) -> tuple[Tensor, Tensor]:
    """(offset, scale), each (C, 1, 1) float64, with model input = (pixel in [0, 1] − offset) / scale."""
    from models.inputs.images import FASHION_MEAN, FASHION_STD, IMAGENET_MEAN, IMAGENET_STD

    c = model.config
    channels = int(c.in_channels)
    spec = getattr(c, "processor", None) if c.input == "processor" else None
    if spec is not None:  # a Hugging Face folder's preprocessing (models.inputs.images.processor_spec)
        unit = 255.0 * spec["rescale"] if spec.get("rescale") is not None else 255.0  # [0, 1] -> rescaled
        mean = [m / unit for m in spec["mean"]] if spec.get("mean") is not None else [0.0] * channels
        std = [s / unit for s in spec["std"]] if spec.get("std") is not None else [1.0 / unit] * channels
    elif c.input == "fashion":
        mean, std = [FASHION_MEAN], [FASHION_STD]
    else:
        mean, std = list(IMAGENET_MEAN), list(IMAGENET_STD)
    dev = _param(model).device
    mean_t = torch.tensor(mean * (channels // len(mean)), dtype=torch.float64, device=dev).view(-1, 1, 1)
    std_t = torch.tensor(std * (channels // len(std)), dtype=torch.float64, device=dev).view(-1, 1, 1)
    return mean_t, std_t


def _prepare_image(model: nn.Module, image: Any) -> tuple[Tensor, str]:
    """(normalised image (C, H, W) in the model's dtype, notice). A tensor is taken as already normalised."""
    p = _param(model)
    c = model.config
    if isinstance(image, Tensor):
        x = image.detach()
        x = x[0] if x.dim() == 4 and x.shape[0] == 1 else x
        if x.dim() == 2 and c.in_channels == 1:
            x = x[None]
        shape = (c.in_channels, c.image_size, c.image_size)
        if tuple(x.shape) != shape:
            raise ValueError(f"expected a normalised image tensor {shape}, got {tuple(image.shape)}")
        return x.to(p.device, p.dtype).clone(), ""  # a copy: never an inference-mode tensor of the caller
    from models.inputs.images import prepare

    extra = {"processor": c.processor} if getattr(c, "processor", None) is not None else {}
    prepared = prepare(image, c.input, resize=c.resize, crop=c.image_size, interpolation=c.interpolation, **extra)
    return prepared.tensor[0].to(p.device, p.dtype), prepared.notice


def _grid(model: nn.Module) -> tuple[tuple[int, int], int]:
    """(patch rows, cols), pixels per patch: ViT's patches, Swin's first-stage tokens."""
    c = model.config
    side = c.image_size // c.patch
    return (side, side), int(c.patch)


def _patch_sum(a: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, rows, cols): the sum over channels and the pixels of each patch."""
    b, ch, h, w = a.shape
    return a.reshape(b, ch, h // patch, patch, w // patch, patch).sum(dim=(1, 3, 5))


def blur(x: Tensor, sigma: float | None = None) -> Tensor:
    """Gaussian-blurred copy of normalised images (B, C, H, W), the integrated-gradients baseline for images
    (Sturmfels et al. 2020). ``sigma`` in pixels; default a tenth of the image side (2.8 for 28×28).

    The blur of torchvision's ``gaussian_blur`` (the same kernel, reflect padding, equal to it in the tests),
    written out as two 1-D convolutions: importing torchvision's transforms for it cost the first explanation
    about a second."""
    side = min(x.shape[-2:])
    sigma = side / 10.0 if sigma is None else float(sigma)
    if sigma <= 0:
        return x.clone()
    k = min(2 * math.ceil(3 * sigma) + 1, 2 * (side - 1) + 1)  # reflect padding needs k // 2 < side
    half = k // 2
    offsets = torch.linspace(-half, half, k, dtype=torch.float32, device=x.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = (kernel / kernel.sum()).to(x.dtype)
    b, c, h, w = x.shape
    y = torch.nn.functional.pad(x.reshape(b * c, 1, h, w), [half, half, half, half], mode="reflect")
    y = torch.nn.functional.conv2d(y, kernel.view(1, 1, 1, k))  # along the rows, then the columns
    y = torch.nn.functional.conv2d(y, kernel.view(1, 1, k, 1))
    return y.reshape(b, c, h, w)


# ---------------------------------------------------------------------------------------------- forwards
def _pad_ids(model: nn.Module, id_lists: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """(ids (B, N) padded with pad_id, pad mask (B, N) True on padding) on the model's device."""
    n = max(len(i) for i in id_lists)
    dev = _param(model).device
    ids = torch.full((len(id_lists), n), model.config.pad_id, dtype=torch.long, device=dev)
    pad = torch.ones((len(id_lists), n), dtype=torch.bool, device=dev)
    for r, row in enumerate(id_lists):
        ids[r, : len(row)] = torch.tensor(list(row), dtype=torch.long, device=dev)
        pad[r, : len(row)] = False
    return ids, pad


def _forward_logits(model: nn.Module, kind: str, x: Tensor, pad: Tensor | None) -> Tensor:
    """Logits from what gradients are taken at: word embeddings (text) or normalised pixels (images)."""
    if kind == "text":
        return model.forward_embedded(x, pad, need_weights=False)[0]
    if kind == "vit":
        return model.forward_embedded(model.embed_patches(x), need_weights=False)[0]
    return model(x)


def _gradients(
    model: nn.Module, kind: str, x: Tensor, pad: Tensor | None, targets: Tensor, rows: int
) -> tuple[Tensor, Tensor]:
    """(∂f_target/∂x (R, ...), logits (R, C)) for R input rows, ``rows`` at a time. ``pad`` (R, N) for text."""
    grads, logits = [], []
    with _autograd():
        for s in _chunks(x.shape[0], rows):
            xi = x[s].detach().requires_grad_(True)
            out = _forward_logits(model, kind, xi, None if pad is None else pad[s])
            (g,) = torch.autograd.grad(out.gather(1, targets[s, None]).sum(), xi)
            grads.append(g)
            logits.append(out.detach())
    return torch.cat(grads), torch.cat(logits)


@torch.no_grad()
def probabilities(model: nn.Module, inputs: Sequence[Sequence[int]] | Tensor, batch_size: int = 64) -> np.ndarray:
    """Class probabilities (B, C) float32 of token-id lists (specials included, any lengths) or of normalised
    images (B, C, H, W), ``batch_size`` at a time (the perturbed inputs of deletion curves and faithfulness)."""
    out = []
    if isinstance(inputs, Tensor):
        p = _param(model)
        for s in _chunks(inputs.shape[0], batch_size):
            out.append(torch.softmax(model(inputs[s].to(p.device, p.dtype)).float() / _temperature(model), -1))
    else:
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))  # similar lengths: less padding
        probs: list[Tensor | None] = [None] * len(inputs)
        for s in _chunks(len(order), batch_size):
            idx = order[s]
            ids, pad = _pad_ids(model, [inputs[i] for i in idx])
            for i, row in zip(idx, torch.softmax(model(ids, pad).float() / _temperature(model), -1)):
                probs[i] = row
        out = [torch.stack(probs)] if probs else []  # type: ignore[arg-type]
    return torch.cat(out).cpu().numpy().astype(np.float32) if out else np.zeros((0, 0), np.float32)


# ---------------------------------------------------------------------------------------------- methods
def _relevance(weights: Sequence[Tensor], grads: Sequence[Tensor], added: bool = False) -> Tensor:
    """Chefer et al. (2021), eq. 5-6: R = I; R <- R + E_h[(∇A ⊙ A)⁺] R per layer in order. (B, N, N).

    ``added``: R − I, what the layers add to the identity R starts from. Read at [CLS] that changes only the
    [CLS] entry (Chefer et al. read R[0, 1:]); read as the mean over rows (mean pooling) it drops the same
    1/N that the identity gives every token, which would otherwise swamp the differences in a picture."""
    b, _, n, _ = weights[0].shape
    eye = torch.eye(n, dtype=weights[0].dtype, device=weights[0].device)
    r = eye.expand(b, n, n)
    for a, g in zip(weights, grads):
        r = r + (g * a).clamp(min=0).mean(1) @ r  # (B, N, N)
    return r - eye if added else r


def _read(rows: Tensor, lengths: Sequence[int], pooling: str) -> list[np.ndarray]:
    """Per example: row 0 ("cls") or the mean of the rows of the real tokens ("mean"), over the real keys."""
    out = []
    for i, n in enumerate(lengths):
        m = rows[i, :n, :n]
        out.append((m[0] if pooling == "cls" else m.mean(0)).detach().double().cpu().numpy())
    return out


def _text_attributions(
    model: nn.Module, items: list[_Text], method: str, targets: list[int | None], steps: int, batch_size: int | None
) -> tuple[list[np.ndarray], list[int], list[float], list[float | None]]:
    """(values per example (N,), targets, target probabilities, completeness gaps) for text inputs."""
    id_lists = [t.ids for t in items]
    lengths = [len(i) for i in id_lists]
    ids, pad = _pad_ids(model, id_lists)
    pooling = _reads(model)
    gaps: list[float | None] = [None] * len(items)
    if method in ("attention", "rollout"):
        with torch.no_grad():
            logits, weights = model.forward_with_attention(ids, pad)  # (B, C), (B, L, H, N, N)
        tgt = _targets(logits, targets)
        if method == "attention":
            values = _read(weights[:, -1].mean(1), lengths, pooling)  # last layer, heads averaged
        else:
            values = [
                pooled_rollout(weights[i, :, :, :n, :n].double().cpu().numpy(), pooling).astype(np.float64)
                for i, n in enumerate(lengths)
            ]
        return values, tgt, _probs(model, logits, tgt), gaps
    with _autograd():
        emb = model.token_embeddings(ids).detach()  # (B, N, D)
        if method == "relevance":
            emb.requires_grad_(True)  # so the graph exists even if the parameters are frozen
            logits, weights = model.forward_embedded(emb, pad, need_weights=True)
            tgt = _targets(logits, targets)
            chosen = logits.gather(1, torch.tensor(tgt, device=logits.device)[:, None]).sum()
            grads = torch.autograd.grad(chosen, weights)
            values = _read(_relevance([w.detach() for w in weights], grads, added=True), lengths, pooling)
            return values, tgt, _probs(model, logits.detach(), tgt), gaps
        with torch.no_grad():
            tgt = _targets(model.forward_embedded(emb, pad, need_weights=False)[0], targets)
        t = torch.tensor(tgt, device=emb.device)
        rows = _rows_per_chunk(model, ids.shape[1], batch_size)
        if method == "gradxinput":
            g, logits = _gradients(model, "text", emb, pad, t, rows)
            values = [v[:n].double().cpu().numpy() for v, n in zip((g * emb).sum(-1), lengths)]
            return values, tgt, _probs(model, logits, tgt), gaps
        # integrated gradients: baseline [PAD] at every non-special real position
        special = torch.zeros_like(pad)
        for i, item in enumerate(items):
            special[i, : lengths[i]] = torch.from_numpy(item.special)
        pad_vec = model.token_embeddings(torch.tensor([[model.config.pad_id]], device=emb.device))[0, 0].detach()
        base = torch.where((special | pad)[..., None], emb, pad_vec.expand_as(emb))
        values, probs = _integrate(model, "text", emb, base, pad, t, steps, rows, gaps)
        values = [v[:n] for v, n in zip(values, lengths)]
        return values, tgt, probs, gaps


def _integrate(
    model: nn.Module,
    kind: str,
    x: Tensor,
    base: Tensor,
    pad: Tensor | None,
    t: Tensor,
    steps: int,
    rows: int,
    gaps: list[float | None],
) -> tuple[list[np.ndarray], list[float]]:
    """Integrated gradients of B inputs x against ``base`` (same shape), every (input, step) pair one row of a
    batched run. Fills ``gaps``; returns per-input attribution summed over the last axis (text) or per patch
    (images), and the target probabilities at x."""
    b = x.shape[0]
    alphas, weights = gauss_legendre(steps)
    alpha = torch.tensor(alphas, dtype=x.dtype, device=x.device)
    shape = (1, steps) + (1,) * (x.dim() - 1)
    path = (base[:, None] + alpha.view(shape) * (x - base)[:, None]).flatten(0, 1)  # (B·S, ...)
    # the two ends as extra rows: f(x) and f(x′) through the same code path as the steps
    rows_in = torch.cat([path, x, base])
    pad_in = None if pad is None else torch.cat([pad.repeat_interleave(steps, 0), pad, pad])
    t_in = torch.cat([t.repeat_interleave(steps), t, t])
    g, logits = _gradients(model, kind, rows_in, pad_in, t_in, rows)
    w = torch.tensor(weights, dtype=x.dtype, device=x.device).view(shape)
    avg = (g[: b * steps].view(b, steps, *x.shape[1:]) * w).sum(1)  # ∫ ∂f/∂x dα, (B, ...)
    contrib = (x - base) * avg
    per = contrib.sum(-1) if kind == "text" else _patch_sum(contrib, _grid(model)[1])
    f_x = logits[b * steps : b * steps + b].gather(1, t[:, None])[:, 0]
    f_base = logits[b * steps + b :].gather(1, t[:, None])[:, 0]
    for i in range(b):
        delta = float(f_x[i] - f_base[i])
        total = float(contrib[i].sum())
        gaps[i] = abs(total - delta) / max(abs(delta), 1e-12)
    return [v.double().cpu().numpy() for v in per], _probs(model, logits[b * steps : b * steps + b], t.tolist())


def _image_attributions(
    model: nn.Module,
    kind: str,
    x: Tensor,
    method: str,
    targets: list[int | None],
    steps: int,
    blur_sigma: float | None,
    batch_size: int | None,
) -> tuple[list[np.ndarray], list[int], list[float], list[float | None]]:
    """(values per image (rows, cols), targets, probabilities, gaps) for normalised images x (B, C, H, W)."""
    (rows_, cols), patch = _grid(model)
    prefix = int(getattr(model, "num_prefix_tokens", 0))  # ViT: [CLS] and any more tokens before the patches
    n = prefix + rows_ * cols
    gaps: list[float | None] = [None] * x.shape[0]
    if method in ("attention", "rollout"):
        with torch.no_grad():
            logits, weights = model(x, need_weights=True)  # (B, C), (B, L, H, N, N), N = prefix + P
        tgt = _targets(logits, targets)
        if method == "attention":
            read = [w[0] for w in weights[:, -1].mean(1).double().cpu().numpy()]
        else:
            read = [pooled_rollout(w, "cls").astype(np.float64) for w in weights.double().cpu().numpy()]
        return [r[prefix:].reshape(rows_, cols) for r in read], tgt, _probs(model, logits, tgt), gaps
    with _autograd():
        if method == "relevance":
            xi = x.detach().requires_grad_(True)
            logits, weights = model.forward_embedded(model.embed_patches(xi), need_weights=True)
            tgt = _targets(logits, targets)
            chosen = logits.gather(1, torch.tensor(tgt, device=logits.device)[:, None]).sum()
            grads = torch.autograd.grad(chosen, weights)
            read = _read(_relevance([w.detach() for w in weights], grads, added=True), [n] * x.shape[0], "cls")
            return [r[prefix:].reshape(rows_, cols) for r in read], tgt, _probs(model, logits.detach(), tgt), gaps
        with torch.no_grad():
            tgt = _targets(_forward_logits(model, kind, x, None), targets)
        t = torch.tensor(tgt, device=x.device)
        rows = _rows_per_chunk(model, n, batch_size)
        if method == "gradxinput":
            g, logits = _gradients(model, kind, x, None, t, rows)
            per = _patch_sum(g * x, patch)
            return [v.double().cpu().numpy() for v in per], tgt, _probs(model, logits, tgt), gaps
        values, probs = _integrate(model, kind, x, blur(x, blur_sigma), None, t, steps, rows, gaps)
        return values, tgt, probs, gaps


def _targets(logits: Tensor, targets: Sequence[int | None]) -> list[int]:
    c = logits.shape[-1]
    out = []
    for row, t in zip(logits, targets):
        if t is None:
            out.append(int(row.argmax()))
        elif not 0 <= int(t) < c:
            raise ValueError(f"target class {t} is not one of the model's {c} classes")
        else:
            out.append(int(t))
    return out


def _temperature(model: nn.Module) -> float:
    """The softmax temperature the model reports its probabilities at (models/calibration.py; 1 without one), so
    that an explanation's probability and its deletion curve match the class probabilities the app shows."""
    calibration = getattr(model, "calibration", None)
    return calibration.temperature if calibration is not None else 1.0


def _probs(model: nn.Module, logits: Tensor, targets: Sequence[int]) -> list[float]:
    p = torch.softmax(logits.detach().double() / _temperature(model), -1)
    return [float(p[i, t]) for i, t in enumerate(targets)]


# ---------------------------------------------------------------------------------------------- entry points
def explain_batch(
    model: nn.Module,
    inputs: Sequence[Any],
    method: str,
    targets: Sequence[int | None] | int | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    blur_sigma: float | None = None,
    batch_size: int | None = None,
) -> list[Attribution]:
    """``explain`` for several inputs in one batched run (texts of any lengths are padded; the result of
    each equals its ``explain`` alone up to float rounding). ``targets``: one per input, or one for all."""
    with torch.inference_mode(False):  # a caller's inference mode would make every tensor unusable for autograd
        return _explain_batch(model, inputs, method, targets, steps, blur_sigma, batch_size)


def _explain_batch(
    model: nn.Module,
    inputs: Sequence[Any],
    method: str,
    targets: Sequence[int | None] | int | None,
    steps: int,
    blur_sigma: float | None,
    batch_size: int | None,
) -> list[Attribution]:
    kind = _check(model, method)
    inputs = list(inputs)
    if not inputs:
        return []
    one = targets is None or isinstance(targets, (int, np.integer))
    tg: list[int | None] = [targets] * len(inputs) if one else [None if t is None else int(t) for t in targets]
    if len(tg) != len(inputs):
        raise ValueError(f"{len(tg)} targets for {len(inputs)} inputs")
    labels = list(getattr(model, "labels", []))
    pooling = _reads(model)
    if kind == "text":
        items = [_prepare_text(model, x) for x in inputs]
        values, tgt, probs, gaps = _text_attributions(model, items, method, tg, steps, batch_size)
        where = [dict(tokens=list(it.tokens), special=it.special.copy(), pooling=pooling, notice=it.notice)
                 for it in items]
    else:
        prepared = [_prepare_image(model, x) for x in inputs]
        x = torch.stack([p[0] for p in prepared])
        values, tgt, probs, gaps = _image_attributions(model, kind, x, method, tg, steps, blur_sigma, batch_size)
        grid, patch = _grid(model)
        tokens = [f"r{r}c{c}" for r in range(grid[0]) for c in range(grid[1])]
        where = [dict(tokens=list(tokens), special=np.zeros(grid, dtype=bool), pooling="cls", grid=grid, patch=patch,
                      notice=notice) for _, notice in prepared]
    return [Attribution(values=v.astype(np.float32), method=method, target=t, label=_label(labels, t), prob=p,
                        completeness_gap=gap, steps=steps if gap is not None else 0, **w)
            for v, t, p, gap, w in zip(values, tgt, probs, gaps, where)]


def explain(
    model: nn.Module,
    ids_or_pixels: Any,
    method: str,
    target: int | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    blur_sigma: float | None = None,
    batch_size: int | None = None,
) -> Attribution:
    """Attribution of one input toward ``target`` (default: the predicted class) by ``method`` (METHODS).

    ids_or_pixels: for a text classifier a text (tokenised and capped as ``classify`` does) or token ids with
    the specials included; for an image classifier any image ``classify`` accepts, or a normalised image
    tensor (C, H, W) or (1, C, H, W) taken as the model's input as it is. ``steps``: integrated-gradients
    steps; ``blur_sigma``: its image baseline's blur in pixels (default a tenth of the side); ``batch_size``:
    rows per batched forward/backward (default: sized to the model). Nothing on ``model`` changes.
    """
    return explain_batch(
        model, [ids_or_pixels], method, [target], steps=steps, blur_sigma=blur_sigma, batch_size=batch_size
    )[0]


def _label(labels: list[str], t: int) -> str:
    return labels[t] if 0 <= t < len(labels) else str(t)


def ranking(attribution: Attribution) -> np.ndarray:
    """Flat indices of the non-special tokens or patches, highest signed value first (ties: earlier first)."""
    values = np.asarray(attribution.values, dtype=np.float64).ravel()
    allowed = np.flatnonzero(~np.asarray(attribution.special).ravel())
    return allowed[np.argsort(-values[allowed], kind="stable")]


def delete_tokens(ids: Sequence[int], positions: Sequence[int] | np.ndarray) -> list[int]:
    """ids without the given positions (the sequence closes up; the caller keeps specials out of positions)."""
    drop = {int(p) for p in positions}
    return [int(t) for i, t in enumerate(ids) if i not in drop]


def fill_patches(x: Tensor, patches: Sequence[int] | np.ndarray, patch: int, fill: Tensor) -> Tensor:
    """A copy of normalised images x (..., C, H, W) with the given flat patch indices (row-major) set to
    ``fill`` ((C, 1, 1) or a same-shaped image, e.g. a blurred copy, whose pixels are copied)."""
    out = x.clone()
    cols = x.shape[-1] // patch
    for p in patches:
        r, c = divmod(int(p), cols)
        ys, xs = slice(r * patch, (r + 1) * patch), slice(c * patch, (c + 1) * patch)
        out[..., ys, xs] = fill[..., ys, xs] if fill.shape[-2:] == x.shape[-2:] else fill
    return out


def mean_fill(model: nn.Module, mean_pixel: float | Sequence[float] | None = None) -> Tensor:
    """The normalised value (C, 1, 1) of a pixel ``mean_pixel`` (in [0, 1], one value or one per channel);
    default the mean the model's input is normalised with (Fashion-MNIST's, ImageNet's training mean)."""
    mean, std = _normalisation(model)
    if mean_pixel is None:
        value = mean
    else:
        m = torch.as_tensor(mean_pixel, dtype=torch.float64).reshape(-1)
        value = (m.expand(mean.shape[0]) if m.numel() == 1 else m).view(-1, 1, 1)
    p = _param(model)
    return ((value - mean) / std).to(p.device, p.dtype)


def curve_counts(n: int, points: int = MAX_POINTS) -> np.ndarray:
    """How many of n items are removed at each point of a curve: 0 to n, at most ``points`` distinct counts."""
    k = max(2, min(points, n + 1))
    return np.unique(np.round(np.linspace(0, n, k)).astype(int))


def deletion_curve(
    model: nn.Module,
    ids_or_pixels: Any,
    attribution: Attribution | None = None,
    method: str = "integrated_gradients",
    target: int | None = None,
    *,
    points: int = MAX_POINTS,
    mean_pixel: float | Sequence[float] | None = None,
    random_orders: int = 3,
    seed: int = 0,
    **explain_args: Any,
) -> DeletionCurve:
    """The target's probability as the top-ranked tokens or patches are removed, against random orders.

    Text: the top-ranked tokens are deleted from the sequence (special tokens kept). Images: the top-ranked
    patches are set to ``mean_pixel`` (in [0, 1]; pass the training set's mean pixel; default the model's
    normalisation mean). At most ``points`` (<= 10) points from nothing removed to everything removable; the
    baseline averages ``random_orders`` random orders drawn with ``seed``. ``attribution`` defaults to
    ``explain(model, ids_or_pixels, method, target, **explain_args)``; its target is the one followed.
    """
    attr = attribution if attribution is not None else explain(model, ids_or_pixels, method, target, **explain_args)
    return deletion_curves(
        model, ids_or_pixels, [attr], points=points, mean_pixel=mean_pixel, random_orders=random_orders, seed=seed
    )[0][0]


def deletion_curves(
    model: nn.Module,
    ids_or_pixels: Any,
    attributions: Sequence[Attribution],
    *,
    points: int = MAX_POINTS,
    mean_pixel: float | Sequence[float] | None = None,
    random_orders: int = 3,
    seed: int = 0,
) -> tuple[list[DeletionCurve], np.ndarray]:
    """``deletion_curve`` for several attributions of one input (one per method, say) in one batched run, with
    one random baseline shared by all: (curves, the first curve's ``random``). Each curve follows its own
    attribution's target; every attribution must come from this input (same tokens or patch grid)."""
    if not 2 <= points <= MAX_POINTS:
        raise ValueError(f"points must be between 2 and {MAX_POINTS}, got {points}")
    attributions = list(attributions)
    if not attributions:
        return [], np.zeros(0, np.float32)
    first = attributions[0]
    if any(a.values.shape != first.values.shape for a in attributions):
        raise ValueError("the attributions are not of one input (their shapes differ)")
    rng = np.random.default_rng(seed)
    allowed = ranking(first)  # the removable positions (non-special), in some order
    randoms = [rng.permutation(np.sort(allowed)) for _ in range(max(1, random_orders))]
    orders = [ranking(a) for a in attributions] + randoms
    counts = curve_counts(len(allowed), points)
    if _kind(model) == "text":
        ids = _prepare_text(model, ids_or_pixels).ids
        if len(ids) != first.values.shape[0]:
            raise ValueError(f"the attribution has {first.values.shape[0]} tokens, the input {len(ids)}")
        probs = probabilities(model, [delete_tokens(ids, o[:k]) for o in orders for k in counts])
    else:
        x = _prepare_image(model, ids_or_pixels)[0]
        fill = mean_fill(model, mean_pixel)
        probs = probabilities(
            model, torch.stack([fill_patches(x, o[:k], first.patch, fill) for o in orders for k in counts])
        )
    probs = probs.reshape(len(orders), len(counts), -1).astype(np.float64)  # (orders, points, classes)
    fractions = counts / max(len(allowed), 1)
    curves = []
    for i, a in enumerate(attributions):
        mine, rand = probs[i, :, a.target], probs[len(attributions) :, :, a.target].mean(0)
        curves.append(
            DeletionCurve(
                fractions=fractions.astype(np.float32),
                removed=counts.astype(np.int64),
                probs=mine.astype(np.float32),
                random=rand.astype(np.float32),
                auc=float(np.trapezoid(mine, fractions)),
                random_auc=float(np.trapezoid(rand, fractions)),
                method=a.method,
                target=a.target,
                label=a.label,
            )
        )
    return curves, curves[0].random
