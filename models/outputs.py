"""Typed result containers shared by every model, the analysis helpers, viz/ and the tabs.

Conventions (docs/ARCHITECTURE.md §3): attention arrays are float32 numpy on the CPU, shaped
``(layers, heads, queries, keys)``, every row sums to 1; token labels are exactly what the model
saw, special tokens included (``<s>``, ``</s>``, ``[CLS]``, ``[SEP]``, ``CLS``, ``r2c5``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class AttentionMap:
    """One kind of attention for every layer and head."""

    weights: np.ndarray  # (L, H, Q, K) float32, rows sum to 1
    queries: list[str]  # len Q
    keys: list[str]  # len K

    def __post_init__(self) -> None:
        w = self.weights
        if w.ndim != 4:
            raise ValueError(f"attention weights must be (layers, heads, queries, keys), got {w.shape}")
        if w.shape[2] != len(self.queries) or w.shape[3] != len(self.keys):
            raise ValueError(
                f"attention {w.shape} does not match {len(self.queries)} query and {len(self.keys)} key labels"
            )

    @property
    def layers(self) -> int:
        return int(self.weights.shape[0])

    @property
    def heads(self) -> int:
        return int(self.weights.shape[1])

    def upto(self, t: int) -> AttentionMap:
        """The map of the first ``t`` queries and keys (a causal map's replayed step): views, no copy."""
        return AttentionMap(self.weights[:, :, :t, :t], self.queries[:t], self.keys[:t])


@dataclass(frozen=True)
class BeamStep:
    """One decoding step of beam search: the surviving candidates after the step."""

    tokens: list[str]  # candidate token string per surviving hypothesis
    parents: list[int]  # index of each candidate's parent in the previous step's list (-1 at step 0)
    scores: list[float]  # cumulative log-probability of each candidate
    finished: list[bool]  # True where the candidate emitted </s>


@dataclass(frozen=True)
class TranslationResult:
    text: str  # detokenised translation
    source_tokens: list[str]  # what the encoder saw, specials included
    target_tokens: list[str]  # decoder inputs of the chosen hypothesis: <s> y1 ... (queries of decoder/cross)
    attention: dict[str, AttentionMap]  # "encoder" (L,H,S,S), "decoder" (L,H,T,T), "cross" (L,H,T,S)
    beam: list[BeamStep] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)  # index into beam[t] of the chosen hypothesis per step
    score: float = 0.0  # final (length-normalised) score of the chosen hypothesis
    notice: str = ""  # e.g. "input truncated to 128 tokens"


@dataclass(frozen=True)
class ClassificationResult:
    tokens: list[str]
    labels: list[str]
    probs: np.ndarray  # (C,) softmax, sums to 1
    attention: dict[str, AttentionMap]  # "encoder" (L,H,N,N)
    notice: str = ""
    pooling: str = "cls"  # what the classifier head reads: "cls" (position 0) or "mean" (every token)


@dataclass(frozen=True)
class WindowAttention:
    """Window attention of one Swin block, with the geometry to map each window back onto the image."""

    stage: int
    block: int
    weights: np.ndarray  # (windows, heads, N, N) float32, N = window**2
    window: int  # window side in tokens
    shift: int  # cyclic shift in tokens (0 for regular blocks)
    grid: tuple[int, int]  # token grid (H, W) of this stage
    patch: int  # pixels per token side at this stage (on the image the model saw)

    def token_at(self, y: float, x: float) -> tuple[int, int]:
        """The token (row, col) of this stage that covers pixel (y, x) of the image the model saw."""
        return _cell(y, x, self.patch, self.grid)

    def image_cells(self) -> np.ndarray:
        """(windows, N) bool: which cells of each window (row-major on the rolled grid, as ``weights``) are tokens of
        this stage's grid; False: padding up to whole windows (zeros the model adds, not image)."""
        (H, W), w, s = self.grid, self.window, self.shift
        Hp, Wp = -(-H // w) * w, -(-W // w) * w
        r, c = np.mgrid[0:Hp, 0:Wp]
        real = ((r + s) % Hp < H) & ((c + s) % Wp < W)  # the rolled grid's cell (r, c) holds token (r + s, c + s)
        return real.reshape(Hp // w, w, Wp // w, w).transpose(0, 2, 1, 3).reshape(-1, w * w)


@dataclass(frozen=True)
class ImageResult:
    image: np.ndarray  # uint8 (H, W) or (H, W, 3): exactly what the model saw, after conversion
    labels: list[str]
    probs: np.ndarray  # (C,) sums to 1, calibrated where the model carries a calibration
    grid: tuple[int, int]  # patch rows, cols of the first stage
    patch: int  # pixels per patch side on `image`
    attention: dict[str, AttentionMap] = field(default_factory=dict)  # ViT: "encoder" over prefix + rows*cols
    windows: list[WindowAttention] = field(default_factory=list)  # Swin: one entry per block
    notice: str = ""
    temperature: float = 1.0  # probs = softmax(logits / temperature); 1 for a model without calibration
    unusual: str = ""  # the out-of-distribution notice (models/calibration.py), empty if the input looks usual
    prefix_tokens: int = 0  # ViT: tokens before the patches in "encoder" ([CLS] first; timm's num_prefix_tokens)
    # the model's input exactly as it ran, a normalised float32 tensor (1, C, H, W) on the CPU: explanations and
    # deletion curves start from it (the upload is not decoded and converted again)
    tensor: Any = field(default=None, repr=False, compare=False)

    def patch_at(self, y: float, x: float) -> tuple[int, int]:
        """The first-stage patch (row, col) that covers pixel (y, x) of ``image``, clamped to the grid."""
        return _cell(y, x, self.patch, self.grid)

    def patch_centre(self, patch: tuple[int, int]) -> tuple[float, float]:
        """Pixel (y, x) of a first-stage patch's centre on ``image``."""
        return (patch[0] + 0.5) * self.patch, (patch[1] + 0.5) * self.patch


def _cell(y: float, x: float, size: int, grid: tuple[int, int]) -> tuple[int, int]:
    return (max(0, min(int(y // size), grid[0] - 1)), max(0, min(int(x // size), grid[1] - 1)))


@dataclass(frozen=True)
class GenerationStep:
    """One generated token: the model's top-5 candidates before the choice, and the choice."""

    candidates: list[str]  # the 5 most likely next tokens, most likely first
    probs: np.ndarray  # (5,) their probabilities under the model (temperature 1)
    chosen: str  # the token taken (greedy: candidates[0]; sampled: any token)
    chosen_prob: float  # its probability under the model


@dataclass(frozen=True)
class GenerationResult:
    text: str  # the continuation alone, detokenised
    tokens: list[str]  # prompt + generated tokens, as the model saw them (BOS first for our own models)
    ids: list[int]  # their ids
    prompt_len: int  # tokens[:prompt_len] is the prompt
    attention: dict[str, AttentionMap]  # "decoder" (L, H, T, T), causal: zero above the diagonal
    steps: list[GenerationStep] = field(default_factory=list)  # one per generated token
    surprisal: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # (T,) bits; NaN for token 0
    notice: str = ""


@dataclass(frozen=True)
class LogitLens:
    """Each layer's residual stream read through the final norm and unembedding (nostalgebraist 2020)."""

    top_tokens: list[list[str]]  # (L, T): the most likely next token after each block, per position
    top_probs: np.ndarray  # (L, T) its probability
    target_probs: np.ndarray  # (L, T) probability of the token that actually comes next
    targets: list[str]  # (T,) that token (at the last position: the final layer's choice)


# Attribution methods (models/inspect/attribution.py): id -> display name, importable without torch (the UI's choices)
METHODS: dict[str, str] = {
    "attention": "Attention (last layer)",
    "rollout": "Attention rollout",
    "relevance": "Gradient-weighted relevance (Chefer)",
    "gradxinput": "Gradient × input",
    "integrated_gradients": "Integrated gradients",
}
# the methods that need no global attention (a family offers them all or these; models/registry.py says which)
GRADIENT_METHODS: tuple[str, ...] = ("gradxinput", "integrated_gradients")
@dataclass(frozen=True)
class Attribution:
    """How much each token or patch supports one class, by one method (models/inspect/attribution.py).

    Signed: positive supports ``target``, negative speaks against it (attention, rollout and relevance are
    never negative). Rankings (deletion curves, faithfulness) use the signed value and skip ``special``.
    """

    values: np.ndarray  # float32: text (N,) one per token, specials included; images (rows, cols) per patch
    method: str  # a key of METHODS
    target: int  # the class explained (the predicted one unless asked otherwise)
    label: str  # its name
    prob: float  # the model's probability of ``target`` on this input
    tokens: list[str]  # text: the tokens as the model saw them; images: patch labels r0c0... row-major
    special: np.ndarray  # bool, shaped as ``values``: positions never ranked or removed ([CLS], [SEP], <s>)
    pooling: str = "cls"  # what the head reads: "cls" (position 0) or "mean" (every token); relevance and
    # attention are read from there
    grid: tuple[int, int] | None = None  # images: patch rows, cols (``values.shape``); text: None
    patch: int = 0  # images: pixels per patch side on the image the model saw
    completeness_gap: float | None = None  # integrated gradients: |Σ values − (f(x) − f(x′))| / |f(x) − f(x′)|
    # on the target logit f, x′ the baseline (Sundararajan et al. 2017, Prop. 1); None for other methods
    steps: int = 0  # integrated gradients: the integral's steps (Gauss–Legendre points); 0 for other methods
    notice: str = ""


@dataclass(frozen=True)
class DeletionCurve:
    """The target's probability as the top-ranked tokens or patches are removed (models/inspect/attribution.py)."""

    fractions: np.ndarray  # (K,) share of the removable tokens/patches removed: 0 first, 1 last; K <= 10
    removed: np.ndarray  # (K,) int: how many were removed
    probs: np.ndarray  # (K,) probability of ``target`` with the top-``removed`` of the ranking removed
    random: np.ndarray  # (K,) the same along seeded random orders (their mean): the baseline
    auc: float  # trapezoidal area under ``probs`` over ``fractions`` (lower: the ranking found what matters)
    random_auc: float  # the same for ``random``
    method: str
    target: int
    label: str


@dataclass(frozen=True)
class PatchResult:
    """An activation-patching sweep (models/inspect/patching.py): how much of the clean answer each patch restores.

    ``restored[l, j] = (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)`` with the logit difference
    LD = logit[target] − logit[foil] (Heimersheim & Nanda 2024): 1 = patching that one activation from the
    clean run into the corrupted run restores the clean answer fully, 0 = no effect, negative = it pushes
    further towards the foil. Language models are read at the last position's next-token logits,
    classifiers at their class logits.
    """

    restored: np.ndarray  # float32 (layers, heads) for sweep "heads", (layers, T) for sweep "positions"
    sweep: str  # "heads": one head's output patched; "positions": the residual entering a layer at one position
    logit_diff_clean: float  # LD on the clean input
    logit_diff_corrupted: float  # LD on the corrupted input (never equal to the clean one)
    target: int  # token id (language model) or class index (classifier) that the clean input favours
    foil: int  # the competing answer
    target_label: str  # its token piece (model.piece) or class name (model.labels)
    foil_label: str
    clean_tokens: list[str]  # as the model saw them; the positions axis of sweep "positions"
    corrupted_tokens: list[str]
    notice: str = ""


@dataclass(frozen=True)
class SinkAblation:
    """One head forbidden to attend to token 0 (the attention sink, Xiao et al. 2023) during the forward pass:
    its weight on key 0 is set to zero and every row renormalised over the other keys (models/inspect/patching.py).
    Query 0 of a causal model has no other key and keeps its row."""

    layer: int
    head: int
    tokens: list[str]  # as the model saw them
    attention_before: np.ndarray  # float32 (T, T): the head's attention, every query (rows sum to 1)
    attention_after: np.ndarray  # float32 (T, T): the same with key 0 forbidden (zero below row 0)
    target: int  # language model: the last position's top next token before ablation; classifier: the prediction
    target_label: str
    target_prob_before: float  # its probability before and after
    target_prob_after: float
    loss_before: float | None = None  # language model: mean next-token loss (nats) over tokens 1..T−1
    loss_after: float | None = None
    target_loss_before: float | None = None  # language model: −log p(target) at the last position, nats
    target_loss_after: float | None = None
    labels: list[str] = field(default_factory=list)  # classifier: the class names
    probs_before: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # classifier: (C,)
    probs_after: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    notice: str = ""


@dataclass(frozen=True)
class DescribeResult:
    """A vision-language model's answer about an image (``describe(image, text, max_new_tokens)``, issue 63)."""

    text: str  # the new tokens alone, detokenised
    ids: list[int]  # the whole sequence the language model saw: image tokens, the prompt, the new tokens
    tokens: list[str]  # a label per id: "<image r2c5>" for image tokens, the pieces otherwise
    prompt_len: int  # ids[:prompt_len] is what the model was given (image tokens and prompt)
    attention: np.ndarray  # (layers, heads, T, T) float32, the language model's, causal, rows sum to 1
    image_positions: np.ndarray  # (N,) int: where the image tokens are in ids
    image_cells: np.ndarray  # (N, 3) int: each image token's tile, row and column
    image_boxes: np.ndarray  # (N, 4) int: each image token's pixels on ``image``: x0, y0, x1, y1 (ends exclusive)
    image: np.ndarray  # uint8 (H, W) or (H, W, 3): exactly what the model saw, after conversion (resize, crop)
    grid: tuple[int, int]  # image-token rows, cols of one tile
    vision_attention: np.ndarray  # (tower layers, heads, N, N) float32: the vision tower's own attention
    steps: list[GenerationStep] = field(default_factory=list)  # one per new token: its candidates
    notice: str = ""
    # the tower's tokens in ``vision_attention``, where they are not the image tokens one for one (LLaVA's CLIP tower:
    # its class token first; Idefics3: the patches of one tile before the pixel shuffle merges them)
    vision_prefix: int = 0  # tokens before the patches (CLIP's class token)
    vision_grid: tuple[int, int] = (0, 0)  # the tower's patch rows, cols; (0, 0): ``grid``
    vision_tile: int = 0  # the tile (``image_cells[:, 0]``) whose tower attention it is (Idefics3: the global view)

    def image_attention(self, query: int, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """Attention from position ``query`` to each image token, (N,): one layer's (None: the mean over layers),
        one head's (None: the mean over heads)."""
        w = self.attention[:, :, query][:, :, self.image_positions]  # (L, H, N)
        w = w.mean(axis=0) if layer is None else w[layer]
        return w.mean(axis=0) if head is None else w[head]

    def to_pixels(self, values: np.ndarray) -> np.ndarray:
        """Per-image-token values (N,) drawn onto the image's pixels (H, W): each token's value over its box."""
        return pixel_map(values, self.image_boxes, self.image.shape[:2])


def pixel_map(values: np.ndarray, boxes: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(N,) values over (N, 4) pixel boxes (x0, y0, x1, y1, ends exclusive) -> float32 (H, W); a pixel no box covers
    stays 0, and where boxes overlap (none do in one tile) the later token's value wins."""
    values = np.asarray(values, dtype=np.float32)
    if len(values) != len(boxes):
        raise ValueError(f"{len(values)} values for {len(boxes)} image tokens")
    out = np.zeros(shape, np.float32)
    for v, (x0, y0, x1, y1) in zip(values, np.asarray(boxes)):
        out[y0:y1, x0:x1] = v
    return out


@dataclass(frozen=True)
class SpeechResult:
    """One window of speech transcribed (models/families/whisper.py)."""

    text: str  # the transcript, detokenised (specials left out)
    ids: list[int]  # the prompt and the generated ids (end-of-text included when produced)
    tokens: list[str]  # each id as the model saw it
    prompt_len: int  # ids[:prompt_len] is the prompt (<|startoftranscript|> … <|notimestamps|>)
    attention: dict[str, AttentionMap]  # "decoder" (L, H, T, T), "cross" (L, H, T, 1500 frames); "encoder" on ask
    mel: np.ndarray  # (n_mels, 3000) float32: the log-mel frames the encoder saw
    duration_s: float  # seconds of audio before the padding
    no_speech_prob: float  # the probability of <|nospeech|> at the first step (nan where the vocabulary has none)
    alignment_heads: tuple[tuple[int, int], ...] = ()  # the checkpoint's (layer, head) pairs that align words
    decoded: list[int] = field(default_factory=list)  # the ids as decoded (with timestamp tokens in that mode)
    segments: list[tuple[float, float, str]] = field(default_factory=list)  # timestamp mode: (start s, end s, text)
    search: str = "greedy"  # how it was decoded ("beam 5, patience 2", "greedy, timestamps", …)
    avg_logprob: float = float("nan")  # the chosen sequence's log-probability ÷ (tokens + 1)
    language: str = "en"  # the language heard (given, or detected by a multilingual model)
    task: str = "transcribe"  # or "translate" (into English; multilingual models)
