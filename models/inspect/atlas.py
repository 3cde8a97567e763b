"""A head atlas: every head of a model scored over a corpus (models/inspect/heads.py), with its best examples, its
mean pattern by offset and (decoders) the tokens it writes, streamed a batch at a time and saved as safetensors +
json (docs/ARCHITECTURE.md "Heads").

``run_atlas(model, corpus)`` picks the runner from the model's registered family (``models.registry``), never its
class name: decoders (GPT and every family read into it), Mamba and RWKV (implicit attention, one map per layer),
encoders (the classifiers), translators (cross-attention and the encoder), ViT / DeiT and Swin. A family it does
not know is refused in words.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models import registry
from models.analysis import head_roles, patch_distances
from models.inspect import heads as hm

ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = ROOT / "examples" / "corpus"
FORMAT = 3  # bumped when a metric or a label changes (3: byte-level tokens decoded): older atlases are made again
MAX_LINES = 2000  # a user's corpus: lines read (the rest is refused in words)
MAX_LINE_CHARS = 500
MAX_CORPUS_BYTES = 256 * 1024
MAX_TOKENS = 64  # tokens of one sentence a text model reads (the rest is cut: the atlas is about short sentences)
REPEAT_N, REPEAT_SEEDS = 50, 10  # repeated random tokens: BOS + n + the same n, this many seeds (induction)
SPLIT_SAMPLE = 12  # sentences whose every query's strongest cell is split into content and position, at most ...
SPLIT_BUDGET = 3e9  # ... while parameters × tokens stay within this (the split walks the model in float64: a 135 M
# decoder gets one or two sentences, gpt-tiny all twelve)
TOP_K = 3
REPEATED = "(repeated random tokens, seed 0)"  # the example a decoder's induction and duplicate-token scores come from

# name -> (label, what it measures, unit)
METRICS: dict[str, tuple[str, str, str]] = {
    "previous": ("previous token", "weight from token i on token i − 1 (text)", "share"),
    "induction": ("induction", "on repeated random tokens, weight on the token after the earlier copy", "share"),
    "duplicate": ("duplicate token", "on repeated random tokens, weight on the earlier copy of the same token",
                  "share"),
    "duplicate_text": ("duplicate token in text", "weight from a token on its earlier occurrences in the same "
                       "sentence (tokens that occur before)", "share"),
    "sink": ("first-token sink", "weight on the first token (BOS), queries after it", "share"),
    "entropy": ("entropy", "−Σ p log p of each query's row (broad = high)", "nats"),
    "distance": ("mean attention distance", "attention-weighted |i − j|", "tokens"),
    "position_share": ("position share of the score", "share of the strongest cell's pre-softmax score that comes "
                       "from position (learned positions: terms with the position part; RoPE: the rotation's "
                       "change of the score), on a sample of sentences", "share"),
    "first": ("to [CLS] / first", "weight on the first token", "share"),
    "last": ("to [SEP] / last", "weight on the last token", "share"),
    "punctuation": ("to punctuation", "weight on punctuation tokens", "share"),
    "next": ("next token", "weight from token i on token i + 1", "share"),
    "diagonality": ("cross-attention diagonality", "cross-attention within one source token of the "
                    "length-scaled diagonal", "share"),
    "coverage": ("source coverage", "share of source tokens receiving at least half a target token's attention",
                 "share"),
    "cls": ("[CLS] share", "weight from the patches on the class token", "share"),
    "pixel_distance": ("mean attention distance in pixels",
                       "attention-weighted distance between patch centres (ViT fig. 7)", "pixels"),
}


# ---------------------------------------------------------------------------------------------------- corpus
@dataclass(frozen=True)
class Corpus:
    """What the heads are scored on: ``kind`` "text" (sentences; decoders add repeated random tokens), "images"
    (paths of shipped images) or "translate" (source sentences); ``name`` for the UI, ``digest`` for the cache."""

    kind: str
    items: tuple[str, ...]
    name: str
    digest: str


def _digest(kind: str, items: Sequence[str], extra: bytes = b"") -> str:
    h = hashlib.sha256(f"{FORMAT}\0{kind}\0".encode())
    for item in items:
        h.update(item.encode("utf-8") + b"\0")
    h.update(extra)
    return h.hexdigest()[:32]


def _lines(path: Path) -> list[str]:
    return [x.strip() for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def builtin_corpus(kind: str) -> Corpus:
    """The corpus shipped for a modality (examples/corpus/, examples/fashion/)."""
    if kind == "text":
        items = _lines(CORPUS_DIR / "text.txt")
    elif kind == "translate":
        items = _lines(CORPUS_DIR / "translate.txt")
    elif kind == "images":
        paths = sorted((ROOT / "examples" / "fashion").glob("*.png"))
        items = [str(p) for p in paths]
        data = b"".join(hashlib.sha256(p.read_bytes()).digest() for p in paths)
        return Corpus("images", tuple(items), f"{len(items)} shipped images and their mirror images",
                      _digest("images", [p.name for p in paths], data))
    else:
        raise ValueError(f"no built-in corpus for {kind!r}")
    return Corpus(kind, tuple(items), f"built-in: {len(items)} sentences", _digest(kind, items))


def photo_corpus() -> Corpus:
    """The example photographs (scikit-image's astronaut, cat and coffee: models.inspect.focus.photo_paths) as an
    image corpus, for a model trained on photographs (DINOv2); ValueError in words where they are not installed."""
    from models.inspect.focus import photo_paths

    paths = photo_paths()
    if not paths:
        raise ValueError("The example photographs come with scikit-image (requirements-dev.txt), which is not "
                         "installed here: `pip install scikit-image==0.26.0`")
    data = b"".join(hashlib.sha256(p.read_bytes()).digest() for p in paths)
    return Corpus("images", tuple(str(p) for p in paths), f"{len(paths)} example photographs and their mirror images",
                  _digest("photos", [p.name for p in paths], data))


def user_corpus(text: str, kind: str = "text") -> Corpus:
    """A corpus from a user's text, one sentence a line: blank lines skipped; more than ``MAX_LINES`` lines, a line
    over ``MAX_LINE_CHARS`` characters, control characters or an empty text refused with a sentence that says so."""
    if kind not in ("text", "translate"):
        raise ValueError("A corpus of your own is text, one sentence a line; image models use the shipped images.")
    if not isinstance(text, str):
        raise ValueError("The corpus must be text, one sentence a line.")
    if len(text.encode("utf-8", "replace")) > MAX_CORPUS_BYTES:
        raise ValueError(f"The corpus is larger than {MAX_CORPUS_BYTES // 1024} KB: give at most {MAX_LINES} short "
                         "lines.")
    lines = [x.strip() for x in text.replace("\r\n", "\n").split("\n") if x.strip()]
    if not lines:
        raise ValueError("The corpus is empty: give one sentence a line.")
    if len(lines) > MAX_LINES:
        raise ValueError(f"The corpus has {len(lines)} lines; at most {MAX_LINES} are allowed.")
    for n, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"Line {n} has {len(line)} characters; at most {MAX_LINE_CHARS} are allowed.")
        if any(ord(ch) < 32 and ch != "\t" for ch in line) or "\x7f" in line:
            raise ValueError(f"Line {n} holds a control character.")
    return Corpus(kind, tuple(lines), f"your corpus: {len(lines)} lines", _digest(kind, lines))


def modality(model: Any) -> str:
    """The corpus kind a model reads: "text", "translate" or "images" (from its family's tabs)."""
    tab = registry.family_of(model).tabs[0]
    return {"generate": "text", "classify": "text", "translate": "translate", "vision": "images"}[tab]


# ---------------------------------------------------------------------------------------------------- result
@dataclass
class Atlas:
    """Every head's metrics over one corpus (``metrics``: name -> (L, H), NaN where a head has none)."""

    model: str
    family: str
    corpus: str  # the corpus's name, as the UI says it
    examples: list[str]  # the corpus items the top examples index (sentences, or image names)
    metrics: dict[str, np.ndarray]
    top: dict[str, np.ndarray]  # name -> (L, H, K) indices into examples, best first (−1: none)
    top_scores: dict[str, np.ndarray]  # name -> (L, H, K)
    offsets: np.ndarray | None = None  # (L, H, 2D + 1): mean weight at offsets −D … D (text)
    writes: list[list[list[str]]] | None = None  # decoders: per layer and head the tokens its output promotes most
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def layers(self) -> int:
        return max(v.shape[0] for v in self.metrics.values())

    @property
    def heads(self) -> int:
        return max(v.shape[1] for v in self.metrics.values())

    def summary(self) -> dict[str, Any]:
        """The bench's JSON: model, layers, heads, metrics (name -> L × H nested lists, null for NaN), seconds."""
        return {"model": self.model, "layers": self.layers, "heads": self.heads,
                "metrics": {k: [[None if np.isnan(x) else round(float(x), 5) for x in row] for row in v]
                            for k, v in self.metrics.items()},
                "seconds": round(self.seconds, 3)}

    def save(self, stem: Path) -> None:
        """``stem``.safetensors (the arrays) and ``stem``.json (the rest); written to temporary names, then moved."""
        from safetensors.numpy import save_file

        arrays = {f"metric.{k}": np.ascontiguousarray(v, np.float32) for k, v in self.metrics.items()}
        arrays |= {f"top.{k}": np.ascontiguousarray(v, np.int64) for k, v in self.top.items()}
        arrays |= {f"top_scores.{k}": np.ascontiguousarray(v, np.float32) for k, v in self.top_scores.items()}
        if self.offsets is not None:
            arrays["offsets"] = np.ascontiguousarray(self.offsets, np.float32)
        meta = {"format": FORMAT, "model": self.model, "family": self.family, "corpus": self.corpus,
                "examples": self.examples, "writes": self.writes, "notes": self.notes, "seconds": self.seconds,
                "order": list(self.metrics)}
        stem.parent.mkdir(parents=True, exist_ok=True)
        tmp = stem.with_name(stem.name + ".tmp")
        save_file(arrays, str(tmp) + ".safetensors")
        Path(str(tmp) + ".json").write_text(json.dumps(meta), encoding="utf-8")
        Path(str(tmp) + ".safetensors").replace(str(stem) + ".safetensors")
        Path(str(tmp) + ".json").replace(str(stem) + ".json")

    @classmethod
    def load(cls, stem: Path) -> Atlas | None:
        """The atlas saved at ``stem``, or None when it is missing, of another format, or unreadable."""
        from safetensors.numpy import load_file

        try:
            meta = json.loads(Path(str(stem) + ".json").read_text(encoding="utf-8"))
            if meta.get("format") != FORMAT:
                return None
            arrays = load_file(str(stem) + ".safetensors")
        except (OSError, ValueError, KeyError):
            return None
        pick = lambda prefix: {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}  # noqa: E731
        metrics = pick("metric.")
        order = [k for k in meta.get("order", []) if k in metrics] or list(metrics)
        return cls(meta["model"], meta["family"], meta["corpus"], list(meta["examples"]),
                   {k: metrics[k] for k in order}, pick("top."), pick("top_scores."), arrays.get("offsets"),
                   meta.get("writes"), list(meta.get("notes", [])), float(meta.get("seconds", 0.0)))


def cached_atlas(model_name: str, corpus: Corpus, weights: str, cache: Path,
                 compute: Callable[[], Atlas]) -> tuple[Atlas, bool]:
    """(the atlas of ``weights`` (a digest of the model's weights) over ``corpus`` from ``cache``, or computed and
    saved there; whether it came from the cache)."""
    key = hashlib.sha256(f"{FORMAT}\0{weights}\0{corpus.digest}".encode()).hexdigest()[:40]
    stem = cache / key
    found = Atlas.load(stem)
    if found is not None:
        return found, True
    atlas = compute()
    try:
        atlas.save(stem)
    except OSError as err:  # a read-only cache: the atlas is still answered
        atlas.notes.append(f"not cached ({type(err).__name__})")
    return atlas, False


def file_digest(paths: Sequence[Path], memo: Path | None = None) -> str:
    """A digest of the weight files of a folder: each file's sha256, remembered in ``memo`` (a json of path ->
    [size, mtime_ns, sha256]) so an unchanged file is not read again (the cached grid answers in well under 1 s)."""
    known: dict[str, list] = {}
    if memo is not None:
        try:
            known = json.loads(memo.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
    from models.io.checkpoint import sha256

    h, changed = hashlib.sha256(), False
    for p in sorted(Path(x) for x in paths):
        st = p.stat()
        entry = known.get(str(p))
        if not (isinstance(entry, list) and entry[:2] == [st.st_size, st.st_mtime_ns]):
            entry = known[str(p)] = [st.st_size, st.st_mtime_ns, sha256(p)]
            changed = True
        h.update(p.name.encode() + b"\0" + entry[2].encode())
    if memo is not None and changed:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(json.dumps(known), encoding="utf-8")
        except OSError:
            pass
    return h.hexdigest()


def state_digest(model: Any) -> str:
    """A digest of a loaded model's parameters and buffers (for a model whose files are not at hand)."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if t.device.type == "meta":
            continue
        h.update(name.encode() + str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------- runners
Progress = Callable[[float, str], None]


def run_atlas(model: Any, corpus: Corpus, name: str = "", batch: int = 16, progress: Progress | None = None) -> Atlas:
    """Every head of ``model`` scored over ``corpus`` (see the module docstring); ``progress(fraction, text)``."""
    family = registry.family_of(model).name
    runner = {"gpt": _decoder, "mamba": _mamba, "rwkv": _mamba, "classifier": _encoder, "bert": _encoder,
              "deberta": _encoder, "translator": _translator, "vit": _vit, "deit": _vit, "swin": _swin}.get(family)
    if runner is None:
        raise ValueError(f"the head atlas does not know the {family} family yet")
    want = modality(model)
    if corpus.kind != want:
        raise ValueError(f"this model reads {want}; the corpus is {corpus.kind}")
    start = time.perf_counter()
    was = model.training
    model.eval()
    try:
        atlas = runner(model, corpus, batch, progress or (lambda f, t: None))
    finally:
        model.train(was)
    atlas.model, atlas.family = name or family, family
    atlas.seconds = time.perf_counter() - start
    return atlas


def _finish(acc: hm.HeadAccumulator, corpus: Corpus, examples: list[str], **kw: Any) -> Atlas:
    return Atlas("", "", corpus.name, examples, acc.result(), dict(acc.top_index), dict(acc.top_scores),
                 acc.offset_profile(), **kw)


def _text_metrics(acc: hm.HeadAccumulator, w: np.ndarray, tokens: Sequence[Any], k: int, causal: bool) -> None:
    """The text metrics of one sequence's map (L, H, T, T): decoders' and (``causal`` False) encoders'. ``tokens``:
    the ids (or token labels) of the sequence."""
    acc.add("entropy", hm.entropy(w, skip_first=causal), k)
    acc.add("duplicate_text", hm.duplicate_token(w, tokens), k)
    acc.add("distance", hm.attention_distance(w, skip_first=causal), k)
    acc.add("previous", hm.previous_token(w), k)
    if causal:
        acc.add("sink", hm.to_keys(w, [0], skip_first=True), k)
    else:
        acc.add("first", hm.to_keys(w, [0]), k)
        acc.add("last", hm.to_keys(w, [w.shape[-1] - 1]), k)
        acc.add("next", hm.next_token(w), k)
        punct = np.array([hm.is_punctuation(t) for t in tokens])
        acc.add("punctuation", hm.to_keys(w, punct), k)
    acc.add_offsets(w)


def _decoder(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    import torch

    from models.blocks.attention import Intervention

    device = model.embed.weight.device
    limit = min(MAX_TOKENS, model.context_limit())
    seqs = [model.encode_prompt(text)[0][:limit] for text in corpus.items]
    acc = hm.HeadAccumulator(TOP_K)
    writes = None
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    done = 0
    with torch.no_grad():
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            n = max(len(seqs[r]) for r in rows)
            # right padding: a causal row i reads keys ≤ i only, so the padding after a sentence changes nothing
            x = torch.tensor([seqs[r] + [seqs[r][-1]] * (n - len(seqs[r])) for r in rows], device=device)
            out = model(x, need_weights=True, edit=Intervention(record=True), last_only=True)  # logits unused
            att = torch.stack([a.float() for a in out.attention], 1).cpu().numpy()  # (B, L, H, T, T)
            real = torch.tensor([[t < len(seqs[r]) for t in range(n)] for r in rows], device=device)
            heads = torch.stack([h.double() for h in out.heads], 1)  # (B, L, H, T, d)
            part = (heads * real[:, None, None, :, None]).sum((0, 3))  # (L, H, d)
            writes = part if writes is None else writes + part
            for b, r in enumerate(rows):
                t = len(seqs[r])
                w = att[b, :, :, :t, :t]
                _text_metrics(acc, w, seqs[r], r, causal=True)
            done += len(rows)
            progress(0.8 * done / len(order), f"{done} of {len(order)} sentences")
        n_tokens = sum(len(s) for s in seqs)
        # repeated random tokens: induction, duplicate token (analysis.head_roles), in one batch
        n = min(REPEAT_N, (model.context_limit() - 1) // 2)
        reps = [model.repeated_tokens(n, seed) for seed in range(REPEAT_SEEDS)]
        out = model(torch.tensor(reps, device=device), need_weights=True, last_only=True)
        att = torch.stack([a.float() for a in out.attention], 1).cpu().numpy()
        for s in range(len(reps)):
            roles = head_roles(att[s], n)
            acc.add("induction", roles["induction"], -1, weight=n)
            acc.add("duplicate", roles["duplicate"], -1, weight=n)
    progress(0.85, "repeated tokens done; splitting scores")
    notes = [f"{len(seqs)} sentences ({n_tokens} tokens, at most {limit} each); induction and duplicate token on "
             f"{REPEAT_SEEDS} sequences of BOS + {n} random tokens twice"]
    notes += _position_share(model, _split_sample(model, seqs), acc)
    top = _writes(model, writes / max(n_tokens, 1)) if writes is not None else None
    progress(1.0, "done")
    return _finish(acc, corpus, list(corpus.items), writes=top, notes=notes)


def _writes(model: Any, mean_heads: Any, k: int = 5) -> list[list[list[str]]] | None:
    """Per layer and head the ``k`` tokens its mean output promotes most through the output projection: the head's
    mean write (A·V of every query over the corpus, through its slice of W_O) times the final norm's gain, read by
    the unembedding (the direct path; the final norm's scale is left out, as in a logit lens without the norm)."""
    import torch

    from models.io.bigmodel import weight

    try:
        gain = weight(model.norm)
        unembed = weight(model.lm_head).double()
    except (AttributeError, RuntimeError):
        return None
    result = []
    for layer, block in enumerate(model.blocks):
        o = weight(block.attn.o_proj).double()  # (D, H·d)
        h, d = mean_heads.shape[1:]
        per_head = torch.einsum("hd,ehd->he", mean_heads[layer].to(o.device), o.view(o.shape[0], h, d))  # (H, D)
        if gain is not None:
            per_head = per_head * gain.double().to(per_head.device)
        logits = per_head @ unembed.to(per_head.device).T  # (H, V)
        top = logits.topk(k, -1).indices.cpu().tolist()
        result.append([[model.piece(int(i)) for i in row] for row in top])
    return result


def _split_sample(model: Any, seqs: Sequence[Sequence[int]]) -> list[list[int]]:
    """The first sentences (at most SPLIT_SAMPLE, at least one) whose tokens × parameters fit SPLIT_BUDGET."""
    params = sum(p.numel() for p in model.parameters())
    out, tokens = [], 0
    for ids in seqs[:SPLIT_SAMPLE]:
        tokens += len(ids)
        if out and tokens * params > SPLIT_BUDGET:
            break
        out.append(list(ids))
    return out


def _position_share(model: Any, sample: list[list[int]], acc: hm.HeadAccumulator) -> list[str]:
    """The share of position in each head's strongest score (``METRICS["position_share"]``), from the score split
    (models/inspect/decompose.py) on a few sentences; a family without a walk is left out with a note. RoPE models
    need only the whole stream (q and k with and without the rotation), so the parts are not kept for them."""
    import torch

    from models.inspect.decompose import _walk
    from models.inspect.walk import plan

    if registry.family_of(model).walk is None or not sample:
        return ["no position share: this family has no score split"]
    try:
        with torch.no_grad():
            rope = plan(model, sample[0][:2]).layers[0][0].angles is not None
            for ids in sample:
                if len(ids) < 2:
                    continue
                t = len(ids)
                values = [_layer_position_share(attn, inp, weights, t)
                          for _, attn, inp, _, weights in _walk(plan(model, ids), [] if rope else list(range(t)))]
                acc.add("position_share", np.stack(values))
    except (ValueError, NotImplementedError, KeyError) as err:
        return [f"no position share: {err}"]
    return [f"position share on {len(sample)} sentence{'s' if len(sample) != 1 else ''} "
            f"({sum(len(x) for x in sample)} tokens; every query's strongest key)"]


def _layer_position_share(attn: Any, inp: Any, weights: Any, t: int) -> np.ndarray:
    """(H, T) per query of one layer: the position share of the score to its strongest key. RoPE: |s − c| / (|s − c|
    + |c|), s the score and c the same q and k unrotated (``decompose`` ``content``); learned or sinusoidal
    positions: the |terms| of the (part × part) table that involve the ``position`` part over all |terms|."""
    import torch

    pos = list(range(t))
    rq = attn.head_rms(inp.total, "q")
    rk = attn.head_rms(inp.total, "k")
    best = weights.argmax(-1)  # (H, T): each query's strongest key
    kv = torch.arange(attn.n_heads, device=best.device) // attn.group()
    out = np.full((attn.n_heads, t), np.nan, np.float32)
    if attn.angles is not None:  # q and k are linear in the parts, so their sums are the whole stream's
        from models.inspect.walk import _rotate

        q, k = attn.queries(inp.total, pos, bias=True, rms=rq), attn.keys(inp.total, pos, bias=True, rms=rk)
        back = -attn.angles[:t]  # the rotation undone (RoPE is orthogonal): the unrotated q and k, no projection
        q0, k0 = _rotate(q, back, attn.layout), _rotate(k, back, attn.layout)
        score = (q * k[kv[:, None], best]).sum(-1)  # (H, T)
        content = (q0 * k0[kv[:, None], best]).sum(-1)
        rot = (score - content).abs()
        out[:] = (rot / (rot + content.abs()).clamp_min(1e-30)).detach().cpu().numpy()
        return out
    names = list(inp.names)
    if "position" not in names:
        return out
    parts = inp.parts  # (C, T, D), parts at every position, ``bias`` first

    def project(fn, rms) -> Any:
        plain = fn(parts, pos, bias=False, rms=rms)
        return torch.cat([fn(parts[:1], pos, bias=True, rms=rms), plain[1:]])  # (C, n, T, d)

    p = names.index("position")
    q, k = project(attn.queries, rq), project(attn.keys, rk)  # (C, H, T, d), (C, Hkv, T, d)
    table = torch.einsum("ahtd,bhtd->htab", q, k[:, kv[:, None], best]).abs()  # (H, T, C, C)
    total = table.sum((-1, -2)).clamp_min(1e-30)
    position = table[..., p, :].sum(-1) + table[..., :, p].sum(-1) - table[..., p, p]
    out[:] = (position / total).detach().cpu().numpy()
    return out


def _mamba(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    """A family without heads whose maps are implicit attention (Mamba, RWKV): one map per layer."""
    limit = min(MAX_TOKENS, model.context_limit())
    acc = hm.HeadAccumulator(TOP_K)
    items = list(corpus.items)
    for k, text in enumerate(items):
        ids = model.encode_prompt(text)[0][:limit]
        _text_metrics(acc, model.implicit_attention(ids), ids, k, causal=True)
        if k % 8 == 0:
            progress(0.8 * (k + 1) / len(items), f"{k + 1} of {len(items)} sentences")
    n = min(REPEAT_N, (model.context_limit() - 1) // 2)
    for seed in range(REPEAT_SEEDS):
        roles = head_roles(model.implicit_attention(model.repeated_tokens(n, seed)), n)
        acc.add("induction", roles["induction"], -1, weight=n)
        acc.add("duplicate", roles["duplicate"], -1, weight=n)
    return _finish(acc, corpus, items, notes=[
        f"{len(items)} sentences; implicit attention ({model.IMPLICIT}): one map per layer",
        f"induction and duplicate token on {REPEAT_SEEDS} sequences of BOS + {n} random tokens twice",
        "no position share: a recurrence has no attention scores to split"])


def _encoder(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    from models.inputs.tokenizer import encode_input

    acc = hm.HeadAccumulator(TOP_K)
    items = list(corpus.items)
    skipped = 0
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        for j, result in enumerate(model.classify_many(chunk)):
            if isinstance(result, Exception):
                skipped += 1
                continue
            amap = result.attention["encoder"]
            _text_metrics(acc, np.asarray(amap.weights, np.float32), amap.keys, start + j, causal=False)
        progress(0.8 * min(start + batch, len(items)) / len(items), f"{min(start + batch, len(items))} sentences")
    notes = [f"{len(items) - skipped} sentences" + (f" ({skipped} refused by the model)" if skipped else "")]
    sample = []
    for text in items[:SPLIT_SAMPLE]:
        try:
            sample.append(encode_input(model.tokenizer, text, model.config.max_len, type(model).__name__)[0])
        except ValueError:
            continue
    notes += _position_share(model, _split_sample(model, sample), acc)
    return _finish(acc, corpus, items, notes=notes)


def _translator(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    acc = hm.HeadAccumulator(TOP_K)
    items = list(corpus.items)
    skipped = 0
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        for j, result in enumerate(model.translate_many(chunk, beam_size=1)):
            if isinstance(result, Exception):
                skipped += 1
                continue
            k = start + j
            cross = np.asarray(result.attention["cross"].weights, np.float32)
            acc.add("diagonality", hm.diagonality(cross), k)
            acc.add("coverage", hm.coverage(cross), k, weight=cross.shape[-1])
            enc = np.asarray(result.attention["encoder"].weights, np.float32)
            acc.add("entropy", hm.entropy(enc), k)
            acc.add("previous", hm.previous_token(enc), k)
            acc.add("next", hm.next_token(enc), k)
            acc.add("last", hm.to_keys(enc, [enc.shape[-1] - 1]), k)
            punct = np.array([hm.is_punctuation(t) for t in result.source_tokens])
            acc.add("punctuation", hm.to_keys(enc, punct), k)
            acc.add_offsets(enc)
        progress(0.95 * min(start + batch, len(items)) / len(items), f"{min(start + batch, len(items))} sentences")
    return _finish(acc, corpus, items, notes=[
        f"{len(items) - skipped} sentences translated greedily (the model's own translations are the targets); "
        "diagonality and coverage of the cross-attention, the rest of the encoder's self-attention"])


def _images(corpus: Corpus) -> list[tuple[str, Any]]:
    """(name, image) of every shipped image and its mirror image (the corpus has ten images)."""
    from PIL import Image, ImageOps

    out = []
    for path in corpus.items:
        name = Path(path).stem.split("-t10k")[0]
        with Image.open(path) as im:
            im.load()
            out.append((name, im.copy()))
            out.append((f"{name} (mirrored)", ImageOps.mirror(im)))
    return out


def _vit(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    acc = hm.HeadAccumulator(TOP_K)
    images = _images(corpus)
    for k, (_, image) in enumerate(images):
        result = model.classify(image)
        w = np.asarray(result.attention["encoder"].weights, np.float32)  # (L, H, N, N)
        skip = result.prefix_tokens
        patches = w[..., skip:, skip:]
        patches = patches / np.maximum(patches.sum(-1, keepdims=True), 1e-12)  # renormalised over the patches
        acc.add("pixel_distance", hm.attention_distance(patches, patch_distances(result.grid, result.patch)), k)
        acc.add("cls", hm.to_keys(w[..., skip:, :], [0]), k)
        acc.add("entropy", hm.entropy(w), k)
        progress(0.95 * (k + 1) / len(images), f"{k + 1} of {len(images)} images")
    return _finish(acc, corpus, [n for n, _ in images], notes=[
        f"{len(images)} images; distance between patch centres in pixels of the image the model saw, the prefix "
        "tokens left out and each row renormalised over the patches (as the ViT paper's fig. 7)"])


def _swin(model: Any, corpus: Corpus, batch: int, progress: Progress) -> Atlas:
    acc = hm.HeadAccumulator(TOP_K)
    images = _images(corpus)
    for k, (_, image) in enumerate(images):
        result = model.classify(image)
        heads = max(b.weights.shape[1] for b in result.windows)
        dist = np.full((len(result.windows), heads), np.nan, np.float32)
        ent = np.full((len(result.windows), heads), np.nan, np.float32)
        for i, b in enumerate(result.windows):
            w = np.asarray(b.weights, np.float32)  # (windows, h, N, N)
            d = patch_distances((b.window, b.window), b.patch)
            dist[i, : w.shape[1]] = np.nanmean(hm.attention_distance(w, d), (0, 2))
            ent[i, : w.shape[1]] = hm.entropy(w).mean((0, 2))
        acc.add("pixel_distance", dist, k)
        acc.add("entropy", ent, k)
        progress(0.95 * (k + 1) / len(images), f"{k + 1} of {len(images)} images")
    return _finish(acc, corpus, [n for n, _ in images], notes=[
        f"{len(images)} images; one row per Swin block (its heads; fewer in early stages are empty); distances "
        "inside each window, in pixels of the image the model saw"])


# ---------------------------------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class ExampleMap:
    """One corpus item's attention in one layer, as the head card draws it with the existing views."""

    weights: np.ndarray  # (H, Q, K) float32
    queries: list[str]
    keys: list[str]
    kind: str  # the figure's kind: "Self-attention", "Cross-attention", "Implicit attention", "Window attention"


def example_map(model: Any, item: str, layer: int) -> ExampleMap:
    """``item`` (a corpus sentence, or a shipped image's name as the atlas lists it) through ``model``: its
    attention in ``layer`` (a ViT's over prefix + patches; a Swin block's averaged over its windows; a translator's
    cross-attention; Mamba's implicit attention). ValueError for a layer outside the model."""
    family = registry.family_of(model).name
    if family in ("vit", "deit", "swin"):
        images = dict(_images(builtin_corpus("images")))
        if item not in images:  # a photograph of the photo corpus (a model scored on photo_corpus)
            from models.inspect.focus import photo_paths

            images.update(_images(Corpus("images", tuple(str(p) for p in photo_paths()), "", "")))
        if item not in images:
            raise ValueError(f"{item[:60]!r} is not one of the shipped images")
        result = model.classify(images[item])
        if family == "swin":
            _check_layer(layer, len(result.windows))
            b = result.windows[layer]
            w = np.asarray(b.weights, np.float32).mean(0)  # (h, N, N): the block's windows averaged
            labels = [f"r{r}c{c}" for r in range(b.window) for c in range(b.window)]
            return ExampleMap(w, labels, labels, f"Window attention (mean of {b.weights.shape[0]} windows)")
        amap = result.attention["encoder"]
        _check_layer(layer, amap.weights.shape[0])
        return ExampleMap(np.asarray(amap.weights[layer], np.float32), list(amap.queries), list(amap.keys),
                          "Self-attention")
    if family == "translator":
        result = model.translate(item, beam_size=1)
        amap = result.attention["cross"]
        _check_layer(layer, amap.weights.shape[0])
        return ExampleMap(np.asarray(amap.weights[layer], np.float32), list(amap.queries), list(amap.keys),
                          "Cross-attention")
    implicit = registry.family_of(model).implicit  # Mamba's, RWKV's
    if family == "gpt" or implicit:
        if item == REPEATED:  # the induction test sequence the atlas scored first (seed 0)
            ids = model.repeated_tokens(min(REPEAT_N, (model.context_limit() - 1) // 2), 0)
        else:
            ids = model.encode_prompt(item)[0][: min(MAX_TOKENS, model.context_limit())]
        w = model.implicit_attention(ids) if implicit else model.token_losses(ids)[1]
        _check_layer(layer, w.shape[0])
        tokens = [model.piece(i) for i in ids]
        return ExampleMap(np.asarray(w[layer], np.float32), tokens, tokens,
                          "Implicit attention" if implicit else "Self-attention")
    result = model.classify(item)
    amap = result.attention["encoder"]
    _check_layer(layer, amap.weights.shape[0])
    return ExampleMap(np.asarray(amap.weights[layer], np.float32), list(amap.queries), list(amap.keys),
                      "Self-attention")


def _check_layer(layer: int, n: int) -> None:
    if not 0 <= layer < n:
        raise ValueError(f"layer {layer} is outside 0..{n - 1}")
