"""Encoder–decoder Transformer (Vaswani et al. 2017) for translation, with attention returned on request,
greedy decoding and batched beam search over a key/value cache.

Layers switch between post-norm (the original paper: x = LN(x + Sublayer(x))) and pre-norm
(x = x + Sublayer(LN(x)), Xiong et al. 2020; trains without warm-up tricks, the default). Training and
search use the fused attention; ``forward_with_attention`` runs the explicit path once over a finished
hypothesis to return exactly the weights the model used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from models.blocks.attention import KVCache, MultiHeadAttention, causal_mask, padding_mask
from models.blocks.layers import EncoderLayer, FeedForward, length_runs
from models.blocks.positional import SinusoidalPositions
from models.inputs.tokenizer import encode_input
from models.outputs import AttentionMap, BeamStep, TranslationResult


@dataclass
class TranslatorConfig:
    vocab_size: int = 8000  # one joint en+de SentencePiece vocabulary for source and target
    d_model: int = 256  # model width (the paper's base model uses 512; 256 trains on 2 CPU cores)
    n_heads: int = 4  # attention heads, d_head = d_model / n_heads = 64 as in the paper
    n_enc_layers: int = 3  # encoder layers (paper: 6)
    n_dec_layers: int = 3  # decoder layers (paper: 6)
    d_ff: int = 1024  # feed-forward inner width, 4 × d_model as in the paper (the encoder's, and the decoder's
    # unless d_ff_dec says otherwise)
    dropout: float = 0.1  # residual, embedding and attention dropout (paper §5.4)
    tie_embeddings: bool = True  # share source, target and output embeddings (Press & Wolf 2017)
    norm_first: bool = True  # pre-norm (True) or the original post-norm (False)
    max_len: int = 128  # positions per side; inputs are capped here (models/limits.py)
    pad_id: int = 0  # SentencePiece ids of the special pieces
    bos_id: int = 1  # the decoder's first input (Marian: its decoder_start_token_id, the pad id)
    eos_id: int = 2
    # The switches of translators read from Hugging Face folders (models/io/hf_translators.py); defaults: ours.
    family: str = "translator"  # "translator" (trained here) or "marian": what the views call it
    positions: str = "interleaved"  # sinusoidal table layout: "interleaved" (the paper) or "half" (Marian)
    activation: str = "relu"  # feed-forward activation: "relu", "swish" (opus-mt) or "gelu"
    scale_embedding: bool = True  # embeddings × √d_model (§3.4; Marian's scale_embedding)
    tie_output: bool = False  # with tie_embeddings False (separate source and target tables): the output
    # projection is still the target table (Marian with separate vocabularies); False: a matrix of its own
    logits_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
    blocked_ids: tuple[int, ...] = ()  # tokens never produced (Marian's generation_config bad_words_ids: <pad>)
    forced_eos: bool = False  # the last allowed step can only produce eos (forced_eos_token_id)
    d_ff_dec: int = 0  # the decoder's feed-forward width; 0: d_ff (Marian's decoder_ffn_dim may differ from the
    # encoder's encoder_ffn_dim)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("family", "positions", "activation", "scale_embedding", "tie_output",
                                           "logits_bias", "blocked_ids", "forced_eos", "d_ff_dec")  # newer than
    # the checkpoint

    @property
    def decoder_ff(self) -> int:
        """The decoder's feed-forward width."""
        return self.d_ff_dec or self.d_ff

    @property
    def n_layers(self) -> int:
        """The encoder's layers: the stack the score split and patching walk (the vocabulary of models/registry.py)."""
        return self.n_enc_layers


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, norm_first: bool = True,
                 activation: str = "relu") -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, y: Tensor, memory: Tensor | None, self_mask: Tensor | None, mem_mask: Tensor | None,
        need_weights: bool = False, cache: tuple[KVCache, KVCache] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """y: (B, T, D); memory: (B, S, D) (None when the cross cache is filled).

        Returns (y, self weights (B, H, T, T), cross weights (B, H, T, S)), weights None unless asked.
        """
        sc, cc = cache if cache is not None else (None, None)
        if self.norm_first:
            a, ws = self.self_attn(self.norm1(y), mask=self_mask, need_weights=need_weights, cache=sc)
            y = y + self.drop(a)
            a, wc = self.cross_attn(self.norm2(y), memory, mask=mem_mask, need_weights=need_weights, cache=cc)
            y = y + self.drop(a)
            return y + self.drop(self.ff(self.norm3(y))), ws, wc
        a, ws = self.self_attn(y, mask=self_mask, need_weights=need_weights, cache=sc)
        y = self.norm1(y + self.drop(a))
        a, wc = self.cross_attn(y, memory, mask=mem_mask, need_weights=need_weights, cache=cc)
        y = self.norm2(y + self.drop(a))
        return self.norm3(y + self.drop(self.ff(y))), ws, wc


@dataclass
class DecoderState:
    """Per decoder layer: (self-attention cache, appended each step; cross cache, projected once)."""

    caches: list[tuple[KVCache, KVCache]]
    mem_mask: Tensor | None  # (N, 1, 1, S) or None when the source has no padding

    @property
    def length(self) -> int:
        return self.caches[0][0].length

    def reorder(self, index: Tensor) -> None:
        # Only the self caches: beams never leave their source sentence, and the cross caches hold
        # the same memory for every beam of one source.
        for sc, _ in self.caches:
            sc.reorder(index)


@dataclass
class SearchOutput:
    """The result of greedy or beam search for one source sentence (ids; labels come later)."""

    tokens: list[int]  # chosen hypothesis, ending in eos when it finished
    score: float  # length-normalised: logprob / len(tokens) ** length_penalty
    logprob: float  # cumulative log-probability
    steps: list[dict[str, list[Any]]] = field(default_factory=list)  # per step: tokens, parents, scores, finished
    chosen: list[int] = field(default_factory=list)  # index into steps[t] of the chosen hypothesis
    hypotheses: list[tuple[list[int], float]] = field(default_factory=list)  # all finals (tokens, score)


def _normalised(logprob: float, length: int, alpha: float) -> float:
    return logprob / max(length, 1) ** alpha


class Translator(nn.Module):
    def __init__(self, config: TranslatorConfig, tokenizer: Any | None = None) -> None:
        super().__init__()
        self.config = c = config
        self.tokenizer = tokenizer  # models.inputs.tokenizer.Tokenizer; set by models.load
        self.labels: list[str] = []
        self.src_embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = self.src_embed if c.tie_embeddings else nn.Embedding(c.vocab_size, c.d_model,
                                                                                padding_idx=c.pad_id)
        self.positions = SinusoidalPositions(c.max_len, c.d_model, c.positions)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first, c.activation)
                                     for _ in range(c.n_enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c.d_model, c.n_heads, c.decoder_ff, c.dropout, c.norm_first,
                                                  c.activation) for _ in range(c.n_dec_layers))
        # pre-norm stacks end with a LayerNorm (the residual stream is never normalised otherwise)
        self.enc_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.generator = nn.Linear(c.d_model, c.vocab_size, bias=c.logits_bias)
        self._init_weights()
        if c.logits_bias:
            nn.init.zeros_(self.generator.bias)
        if c.tie_embeddings or c.tie_output:
            self.generator.weight = self.tgt_embed.weight  # §3.4: one matrix for both embeddings and output

    def _init_weights(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for emb in (self.src_embed, self.tgt_embed):  # N(0, d^-1/2): × √d gives unit-scale inputs (§3.4)
            nn.init.normal_(emb.weight, std=self.config.d_model ** -0.5)
            with torch.no_grad():
                emb.weight[self.config.pad_id].zero_()

    # ---------------------------------------------------------------- forward passes
    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        # §3.4: embeddings are multiplied by √d_model before the positions are added
        return self.drop(self.positions(emb(ids) * self.embed_scale, offset))

    @property
    def embed_scale(self) -> float:
        """√d_model (§3.4), or 1 for a model trained without it (Marian's scale_embedding false)."""
        return math.sqrt(self.config.d_model) if self.config.scale_embedding else 1.0

    def _restrict(self, logp: Tensor, t: int, limits: Sequence[int], rows_per_source: int = 1) -> None:
        """Block ``blocked_ids`` everywhere and, with ``forced_eos``, every token but eos at each source's last
        step (t = its limit − 1), eos then scored 0, in place on log-probabilities (N, V) (as transformers' logits
        processors act on beam scores, so the same hypothesis wins)."""
        c = self.config
        if c.blocked_ids:
            logp[:, list(c.blocked_ids)] = float("-inf")
        if c.forced_eos:
            for i, limit in enumerate(limits):
                if t == limit - 1:
                    rows = slice(i * rows_per_source, (i + 1) * rows_per_source)
                    logp[rows] = float("-inf")
                    logp[rows, c.eos_id] = 0.0  # at no cost, as transformers' ForcedEOSTokenLogitsProcessor

    def encode(self, src: Tensor, need_weights: bool = False,
               src_pad: Tensor | None = None) -> tuple[Tensor, Tensor | None, list[Tensor]]:
        """src: (B, S) ids -> (memory (B, S, D), key mask (B, 1, 1, S) or None, weights per layer (B, H, S, S)).
        src_pad: (B, S) bool, True on padding (default: ids == pad_id)."""
        mask = padding_mask(src == self.config.pad_id if src_pad is None else src_pad)  # None without padding
        x, weights = self._embed(self.src_embed, src), []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights)
            if w is not None:
                weights.append(w)
        return self.enc_norm(x), mask, weights

    def decode(self, tgt: Tensor, memory: Tensor, mem_mask: Tensor | None, need_weights: bool = False,
               last_only: bool = False) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Whole target prefix at once, no cache. tgt: (B, T) -> (logits (B, T, V), self ws, cross ws).

        ``last_only``: project only the last position to the vocabulary (logits (B, 1, V)).
        """
        y = self._embed(self.tgt_embed, tgt)
        self_mask = causal_mask(tgt.size(1), device=tgt.device)  # (T, T); pads only follow real tokens
        self_ws, cross_ws = [], []
        for layer in self.decoder:
            y, ws, wc = layer(y, memory, self_mask, mem_mask, need_weights)
            if ws is not None and wc is not None:
                self_ws.append(ws)
                cross_ws.append(wc)
        if last_only:
            y = y[:, -1:]
        return self.generator(self.dec_norm(y)), self_ws, cross_ws

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher forcing (fused attention). src: (B, S), tgt: decoder inputs (B, T) -> logits (B, T, V)."""
        memory, mask, _ = self.encode(src)
        return self.decode(tgt, memory, mask)[0]

    def forward_with_attention(self, src: Tensor, tgt: Tensor,
                               src_pad: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """As forward, on the explicit path: also {"encoder" (B, L, H, S, S), "decoder" (B, L, H, T, T),
        "cross" (B, L, H, T, S)}. A target padded at its end needs no mask: under the causal mask no real
        position sees the padding after it."""
        memory, mask, enc = self.encode(src, need_weights=True, src_pad=src_pad)
        logits, dec, cross = self.decode(tgt, memory, mask, need_weights=True)
        attn = {"encoder": torch.stack(enc, 1), "decoder": torch.stack(dec, 1), "cross": torch.stack(cross, 1)}
        return logits, attn

    # ---------------------------------------------------------------- incremental decoding
    def start_decoding(self, memory: Tensor, mem_mask: Tensor | None, repeats: int = 1) -> DecoderState:
        """Project the memory into each layer's cross K/V once, then repeat them per beam."""
        caches = []
        for layer in self.decoder:
            cc = layer.cross_attn.project_kv(memory)
            if repeats > 1:
                cc.k, cc.v = cc.k.repeat_interleave(repeats, 0), cc.v.repeat_interleave(repeats, 0)
            caches.append((KVCache(), cc))
        if mem_mask is not None and repeats > 1:
            mem_mask = mem_mask.repeat_interleave(repeats, 0)
        return DecoderState(caches, mem_mask)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """tokens: (N, 1), the newest token of each row -> log-probabilities (N, V) for the next one."""
        y = self._embed(self.tgt_embed, tokens, offset=state.length)
        for layer, cache in zip(self.decoder, state.caches):
            # one query attending to every cached key: causal by construction, no mask needed
            y, _, _ = layer(y, None, None, state.mem_mask, cache=cache)
        logits = self.generator(self.dec_norm(y[:, -1]))  # (N, V)
        return torch.log_softmax(logits.float(), dim=-1)

    def default_max_len(self, src_len: int) -> int:
        return min(self.config.max_len - 1, 2 * src_len + 10)

    @torch.no_grad()
    def greedy(self, src: Tensor, max_len: int | None = None, min_len: int = 0,
               length_penalty: float = 1.0, src_pad: Tensor | None = None,
               max_lens: Sequence[int] | None = None) -> list[SearchOutput]:
        """Greedy decoding of a batch src (B, S), cached; eos is blocked before ``min_len`` tokens.
        src_pad: (B, S) True on padding; max_lens: each source's own step limit (default: all ``max_len``)."""
        c = self.config
        max_len = self.default_max_len(src.size(1)) if max_len is None else min(max_len, c.max_len - 1)
        limits = [max_len] * src.size(0) if max_lens is None else [min(m, c.max_len - 1) for m in max_lens]
        max_len = max(limits)
        memory, mask, _ = self.encode(src, src_pad=src_pad)
        state = self.start_decoding(memory, mask)
        b = src.size(0)
        tokens = torch.full((b, 1), c.bos_id, dtype=torch.long, device=src.device)
        hyps: list[list[int]] = [[] for _ in range(b)]
        logps = [0.0] * b
        steps: list[list[dict[str, list[Any]]]] = [[] for _ in range(b)]
        done = [False] * b
        for t in range(max_len):
            logp = self.decode_step(tokens, state)
            self._restrict(logp, t, limits)
            if t < min_len:
                logp[:, c.eos_id] = float("-inf")
            best, tok = logp.max(dim=-1)
            for i, (s, k) in enumerate(zip(best.tolist(), tok.tolist())):
                if done[i]:
                    continue
                logps[i] += s
                hyps[i].append(k)
                done[i] = k == c.eos_id or t + 1 >= limits[i]
                steps[i].append({"tokens": [k], "parents": [0 if t else -1], "scores": [logps[i]],
                                 "finished": [k == c.eos_id]})
            if all(done):
                break
            tokens = tok[:, None]
        return [SearchOutput(h, _normalised(lp, len(h), length_penalty), lp, st, [0] * len(st),
                             [(h, _normalised(lp, len(h), length_penalty))])
                for h, lp, st in zip(hyps, logps, steps)]

    @torch.no_grad()
    def beam_search(self, src: Tensor, beam_size: int = 5, max_len: int | None = None,
                    length_penalty: float = 1.0, min_len: int = 0, src_pad: Tensor | None = None,
                    max_lens: Sequence[int] | None = None) -> list[SearchOutput]:
        """Beam search batched over B sources × K beams with a KV cache.

        Each step ranks the 2K best continuations of the live beams; an eos among the first K ranks
        finishes a hypothesis, the K best others live on (the fairseq scheme). A source stops when K
        hypotheses have finished, or at ``max_len`` (its live beams then count as unfinished
        hypotheses). The winner has the best logprob / length ** length_penalty (first one on ties).
        """
        c, k = self.config, beam_size
        max_len = self.default_max_len(src.size(1)) if max_len is None else min(max_len, c.max_len - 1)
        b, dev = src.size(0), src.device
        # each source stops at its own limit (a batch of sentences searches each as it would be searched alone)
        limits = [max_len] * b if max_lens is None else [min(m, c.max_len - 1) for m in max_lens]
        max_len = max(limits)
        memory, mask, _ = self.encode(src, src_pad=src_pad)
        state = self.start_decoding(memory, mask, repeats=k)  # rows b*K + beam
        scores = torch.full((b, k), float("-inf"), device=dev)
        scores[:, 0] = 0.0  # K copies of <s>: only the first is live, so step 0 picks K distinct tokens
        tokens = torch.full((b * k, 1), c.bos_id, dtype=torch.long, device=dev)
        hist: list[list[int]] = [[] for _ in range(b * k)]  # tokens of each row's hypothesis
        paths: list[list[int]] = [[] for _ in range(b * k)]  # its node index at each step
        finals: list[list[tuple[list[int], float, list[int]]]] = [[] for _ in range(b)]
        cut: list[list[tuple[list[int], float, list[int]]]] = [[] for _ in range(b)]  # live beams at a limit
        steps: list[list[dict[str, list[Any]]]] = [[] for _ in range(b)]
        done = [False] * b
        for t in range(max_len):
            logp = self.decode_step(tokens, state)  # (B*K, V)
            self._restrict(logp, t, limits, k)
            if t < min_len:
                logp[:, c.eos_id] = float("-inf")
            v = logp.size(-1)
            cand = scores.view(-1, 1) + logp  # (B*K, V): cumulative score of every continuation
            # the 2K best of a source are among its rows' own 2K best: rank those (B, K*2K), not all K*V
            n = min(2 * k, v)
            row_s, row_i = cand.topk(n, dim=1)
            flat = (row_i + torch.arange(k, device=dev).repeat(b)[:, None] * v).view(b, k * n)
            top_s, pos = row_s.view(b, k * n).topk(min(2 * k, k * n), dim=1)  # (B, 2K)
            top_i = flat.gather(1, pos)
            rows, new_tok, new_scores, new_hist, new_paths = [], [], [], [], []
            for i, (ss, ii) in enumerate(zip(top_s.tolist(), top_i.tolist())):
                step: dict[str, list[Any]] = {"tokens": [], "parents": [], "scores": [], "finished": []}
                live = 0
                for rank, (s, flat) in enumerate(zip(ss, ii)):
                    row, tok = i * k + flat // v, flat % v
                    parent = paths[row][-1] if t else -1
                    if tok == c.eos_id:
                        if rank < k and not done[i]:
                            finals[i].append((hist[row] + [tok], s, paths[row] + [len(step["tokens"])]))
                            self._record(step, tok, parent, s, True)
                        continue
                    rows.append(row)
                    new_tok.append(tok)
                    new_scores.append(s)
                    new_hist.append(hist[row] + [tok])
                    new_paths.append(paths[row] + [len(step["tokens"])])
                    self._record(step, tok, parent, s, False)
                    live += 1
                    if live == k:
                        break
                if not done[i]:
                    steps[i].append(step)
                    done[i] = len(finals[i]) >= k
                    # its limit: the live beams count as unfinished hypotheses, also when this very step finished
                    # the K-th hypothesis (transformers ranks them with the finished ones at the last step)
                    if t + 1 >= limits[i]:
                        cut[i] = [(h, sc, p) for h, sc, p in zip(new_hist[i * k:], new_scores[i * k:],
                                                                 new_paths[i * k:])][:k]
                        done[i] = True
            if all(done):
                break
            index = torch.tensor(rows, device=dev)
            state.reorder(index)
            tokens = torch.tensor(new_tok, device=dev)[:, None]
            scores = torch.tensor(new_scores, device=dev).view(b, k)
            hist, paths = new_hist, new_paths
        outputs = []
        for i in range(b):
            pool = finals[i] + cut[i]
            normed = [_normalised(s, len(h), length_penalty) for h, s, _ in pool]
            best = max(range(len(pool)), key=lambda j: normed[j])
            h, s, p = pool[best]
            outputs.append(SearchOutput(h, normed[best], s, steps[i], p,
                                        [(hh, n) for (hh, _, _), n in zip(pool, normed)]))
        return outputs

    @staticmethod
    def _record(step: dict[str, list[Any]], tok: int, parent: int, score: float, finished: bool) -> None:
        step["tokens"].append(tok)
        step["parents"].append(parent)
        step["scores"].append(score)
        step["finished"].append(finished)

    # ---------------------------------------------------------------- the app's entry point
    def _label(self, i: int) -> str:
        return self.tokenizer.id_to_piece(i) if self.tokenizer is not None else str(i)

    def translate(self, text: str | Sequence[int], beam_size: int = 5, max_len: int | None = None,
                  length_penalty: float = 1.0) -> TranslationResult:
        """Translate a sentence (or source ids, specials included) with attention and the beam tree.

        ``target_tokens`` are the decoder inputs of the chosen hypothesis, ``<s> y1 … y_{n-1}`` (the
        final </s> is produced, never fed), so row t of "decoder"/"cross" is the step that produced
        y_{t+1}.
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {beam_size}")
        result = self.translate_many([text], beam_size, max_len, length_penalty)[0]
        if isinstance(result, Exception):
            raise result
        return result

    @torch.no_grad()
    def translate_many(self, texts: Sequence[str | Sequence[int]], beam_size: int = 5, max_len: int | None = None,
                       length_penalty: float = 1.0) -> list[TranslationResult | Exception]:
        """``translate`` of several sentences in one batched search and one batched attention pass: sources padded
        on the right with a key-padding mask, each with its own step limit, targets padded after their end (the
        causal mask hides that padding), so that each answer equals the sentence's own ``translate`` (up to float
        summation order). A sentence the model refuses comes back as its exception, in its place."""

        c, dev = self.config, next(self.parameters()).device
        if beam_size < 1:
            return [ValueError(f"beam_size must be at least 1, got {beam_size}") for _ in texts]
        results: list[TranslationResult | Exception] = [ValueError("not run")] * len(texts)
        encoded: dict[int, tuple[list[int], list[str], str]] = {}
        for i, text in enumerate(texts):
            try:
                found = encode_input(self.tokenizer, text, c.max_len, "Translator")
                if not found[0]:
                    raise ValueError("the input has no tokens")
                encoded[i] = found
            except Exception as err:  # bad input: this request's answer, not the batch's
                results[i] = err
        keys = list(encoded)
        was_training = self.training
        self.eval()
        try:
            # beams multiply the rows: a run holds at most 32 sentences of 128 tokens' worth of beams
            for run in length_runs([len(encoded[i][0]) for i in keys], cells=32 * 128 * 128 // beam_size):
                rows = [keys[j] for j in run]
                for r, result in zip(rows, self._translate_rows([encoded[r] for r in rows], beam_size, max_len,
                                                                length_penalty, dev)):
                    results[r] = result
        finally:
            self.train(was_training)
        return results

    def _translate_rows(self, encoded: list[tuple[list[int], list[str], str]], beam_size: int, max_len: int | None,
                        length_penalty: float, dev: torch.device) -> list[TranslationResult]:
        c = self.config
        lengths = [len(ids) for ids, _, _ in encoded]
        src, src_pad = self._padded([ids for ids, _, _ in encoded], dev)
        limits = [self.default_max_len(n) if max_len is None else max_len for n in lengths]
        if beam_size == 1:
            outs = self.greedy(src, length_penalty=length_penalty, src_pad=src_pad, max_lens=limits)
        else:
            outs = self.beam_search(src, beam_size, length_penalty=length_penalty, src_pad=src_pad, max_lens=limits)
        dec_ins = [[c.bos_id, *(o.tokens[:-1] if o.tokens and o.tokens[-1] == c.eos_id else o.tokens)] for o in outs]
        tgt, _ = self._padded(dec_ins, dev)
        _, attn = self.forward_with_attention(src, tgt, src_pad)
        attn = {kind: a.float().cpu().numpy() for kind, a in attn.items()}  # (B, L, H, ·, ·)
        results = []
        for b, ((_, src_tokens, notice), out, dec_in) in enumerate(zip(encoded, outs, dec_ins)):
            s, t = lengths[b], len(dec_in)
            tgt_tokens = [self._label(i) for i in dec_in]
            maps = {
                "encoder": AttentionMap(np.ascontiguousarray(attn["encoder"][b, :, :, :s, :s]), src_tokens, src_tokens),
                "decoder": AttentionMap(np.ascontiguousarray(attn["decoder"][b, :, :, :t, :t]), tgt_tokens, tgt_tokens),
                "cross": AttentionMap(np.ascontiguousarray(attn["cross"][b, :, :, :t, :s]), tgt_tokens, src_tokens),
            }
            body = [i for i in out.tokens if i != c.eos_id]
            out_text = self.tokenizer.decode(body) if self.tokenizer is not None else " ".join(str(i) for i in body)
            beam = [BeamStep([self._label(i) for i in st["tokens"]], list(st["parents"]), list(st["scores"]),
                             list(st["finished"])) for st in out.steps]
            results.append(TranslationResult(out_text, src_tokens, tgt_tokens, maps, beam, list(out.chosen), out.score,
                                             notice))
        return results

    def _padded(self, rows: list[list[int]], dev: torch.device) -> tuple[Tensor, Tensor]:
        """Id lists -> (ids (B, N) padded on the right with pad_id, pad mask (B, N) True on padding); every id of a
        row is real, even one that equals pad_id."""
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), self.config.pad_id, dtype=torch.long, device=dev)
        pad = torch.ones((len(rows), n), dtype=torch.bool, device=dev)
        for b, r in enumerate(rows):
            ids[b, : len(r)] = torch.tensor(r, dtype=torch.long, device=dev)
            pad[b, : len(r)] = False
        return ids, pad
