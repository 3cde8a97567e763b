"""One small tokenizer interface over SentencePiece (.model, our models) and Hugging Face ``tokenizers``
(tokenizer.json, MiniLM), with the checkpoint's text normalisation and the input caps in one place.

    tok = load_tokenizer(folder, text_settings)
    enc = tok.encode("A man is running.")   # Encoded(ids, pieces, notice)
    tok.decode(enc.ids)                     # text, special tokens dropped

Conventions: SentencePiece encodings are ``<s> pieces </s>`` (the translator's source, the scratch
classifiers' input: position 0 is their CLS); tokenizer.json encodings are what its post-processor
adds (``[CLS] ... [SEP]`` for MiniLM). Training code must encode through this class too, so the model
sees at inference exactly what it saw in training.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.limits import MAX_TOKENS_MINILM, MAX_TOKENS_SCRATCH

# Settings allowed in config.json "text" (a typo should fail loudly, not silently change the input).
TEXT_DEFAULTS: dict[str, Any] = {
    "lowercase": False,  # SST-2 is lower-cased; AG News and Multi30k keep case
    "nfkc": True,  # Unicode NFKC: fold compatibility characters (full-width forms, ligatures)
    "split_punct": False,  # PTB-style: "it's good." -> "it 's good ." as in the SST-2 text
    "strip_accents": False,  # drop combining marks (uncased BERT vocabularies)
}

_CLITIC = re.compile(r"(?i)(\w)(n't|'s|'re|'ve|'m|'ll|'d)\b")
_PUNCT = re.compile(r"([.,!?;:()\"\[\]{}]|--)")


def normalize_text(text: str, settings: dict[str, Any] | None = None) -> str:
    """Apply the checkpoint's text settings (see TEXT_DEFAULTS) and collapse whitespace."""
    s = {**TEXT_DEFAULTS, **(settings or {})}
    unknown = sorted(set(s) - set(TEXT_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown text settings {unknown}; known: {sorted(TEXT_DEFAULTS)}")
    if s["nfkc"]:
        text = unicodedata.normalize("NFKC", text)
    if s["strip_accents"]:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    if s["lowercase"]:
        text = text.lower()
    if s["split_punct"]:
        text = _PUNCT.sub(r" \1 ", _CLITIC.sub(r"\1 \2", text))
    return " ".join(text.split())


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (Radford et al. 2019, encoder.py's bytes_to_unicode): how a
    byte-level BPE vocabulary spells each byte ("Ġ" is the space, "Ċ" the newline)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_SPELLED = {c: b for b, c in byte_alphabet().items()}
# what a label shows for a character that would not read as itself on an axis; the space as SentencePiece's own mark,
# so a byte-level model's words start as a SentencePiece model's do ("▁the")
SPACE_MARK = "▁"
_SHOWN = {" ": SPACE_MARK, "\n": "↵", "\t": "⇥"}


class Piece(str):
    """A token label as people read it (``str``: what figures show), carrying the tokenizer's own piece as ``raw``
    (what figures show on hover). Made only where the two differ (byte-level BPE pieces); equal as a string to the
    label, so code that compares labels keeps working."""

    raw: str

    def __new__(cls, label: str, raw: str) -> Piece:
        obj = super().__new__(cls, label)
        obj.raw = raw
        return obj

    def __reduce__(self) -> tuple:  # copies (gr.State) keep the raw piece
        return (Piece, (str(self), self.raw))


def raw_piece(label: str) -> str:
    """The tokenizer's own piece behind a label (``Piece.raw``), the label itself where they are the same."""
    return getattr(label, "raw", label)


def readable_piece(piece: str, byte_level: bool) -> str:
    """A vocabulary piece as people read it: the one mapping from a tokenizer's piece to a label (docs/ARCHITECTURE.md
    §3). SentencePiece and WordPiece pieces already read as text ("▁the", "##ing") and are returned unchanged. A
    byte-level BPE piece (GPT-2, RoBERTa, Qwen2, LLaMA 3, SmolLM2) spells bytes as characters ("ĠCafÃ©" is the bytes
    of " Café"): its bytes are decoded as UTF-8, a space shown as ``▁`` (as SentencePiece shows it), a newline as
    ``↵``, a tab as ``⇥``, another control character and every byte that is not part of a whole character inside
    this piece (an emoji split over two pieces) as ``<0xF0>``, SentencePiece's own spelling of a byte, never as
    mojibake. A piece not spelled in the byte alphabet (an added token such as ``<|im_start|>``) is returned as it is.
    Returns a ``Piece`` (label with ``raw``) where the label differs from the piece."""
    if not byte_level:
        return piece
    try:
        data = bytes(_SPELLED[c] for c in piece)
    except KeyError:
        return piece
    out = []
    for ch in data.decode("utf-8", errors="surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte outside a whole character (surrogateescape's spelling of it)
            out.append(f"<0x{code - 0xDC00:02X}>")
        elif ch in _SHOWN:
            out.append(_SHOWN[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or ch in (SPACE_MARK, "↵", "⇥"):
            # a control or invisible character, or one of the marks themselves: its bytes, so no label misleads
            out.append("".join(f"<0x{b:02X}>" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    label = "".join(out)
    return piece if label == piece else Piece(label, piece)


def is_byte_level(tk: Any) -> bool:
    """Whether a ``tokenizers.Tokenizer`` is byte-level BPE: its decoder (or pre-tokenizer) is ``ByteLevel``, alone
    or in a sequence, as in GPT-2's, RoBERTa's, Qwen2's and LLaMA 3's tokenizer.json."""
    import json

    for part in (tk.decoder, tk.pre_tokenizer):
        if part is None:
            continue
        try:
            spec = json.loads(part.__getstate__())
        except (AttributeError, TypeError, ValueError):
            continue
        kinds = [spec.get("type")] + [d.get("type") for d in spec.get("decoders", spec.get("pretokenizers")) or []]
        if "ByteLevel" in kinds:
            return True
    return False


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # token ids, special tokens included
    pieces: list[str]  # the matching token labels: readable_piece of each piece, the raw piece as ``.raw``
    notice: str = ""  # non-empty when the input was truncated


class Tokenizer:
    """Common interface; see SentencePieceTokenizer and JsonTokenizer."""

    pad_id: int = -1
    unk_id: int = -1
    bos_id: int = -1  # <s>, or [CLS]
    eos_id: int = -1  # </s>, or [SEP]
    byte_level: bool = False  # byte-level BPE: its pieces spell bytes ("Ġold"), labels decode them (readable_piece)

    def __init__(self, text: dict[str, Any] | None, max_tokens: int) -> None:
        self.text = dict(text or {})
        normalize_text("", self.text)  # validate the settings now
        self.max_tokens = max_tokens

    # -- to implement
    def _encode_pieces(self, text: str) -> tuple[list[int], list[str]]:
        raise NotImplementedError

    def id_to_piece(self, i: int) -> str:
        """The label of id ``i``: its piece as people read it (``readable_piece``), the piece itself as ``.raw``."""
        return readable_piece(self.raw_piece(i), self.byte_level)

    def raw_piece(self, i: int) -> str:
        """The vocabulary's own piece of id ``i`` ("Ġold")."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    # -- shared
    @property
    def cls_id(self) -> int:
        return self.bos_id

    @property
    def sep_id(self) -> int:
        return self.eos_id

    def normalize(self, text: str) -> str:
        return normalize_text(text, self.text)

    def encode(self, text: str, add_special: bool = True, max_tokens: int | None = None) -> Encoded:
        """Normalise, tokenise, add the specials and cap at ``max_tokens`` (default: the model's cap).

        Over the cap the content is cut and the closing special kept; ``notice`` says so.
        """
        cap = self.max_tokens if max_tokens is None else max_tokens
        ids, pieces = self._encode_pieces(self.normalize(text))
        n_special = 2 if add_special else 0
        notice = ""
        if len(ids) + n_special > cap:
            notice = f"Input truncated to {cap} tokens (it had {len(ids) + n_special})."
            ids, pieces = ids[: cap - n_special], pieces[: cap - n_special]
        if add_special:
            ids = [self.bos_id, *ids, self.eos_id]
            pieces = [self.id_to_piece(self.bos_id), *pieces, self.id_to_piece(self.eos_id)]
        return Encoded(ids, pieces, notice)

    adds_bos: bool = True  # encode_prompt puts BOS first (the project's own language models)

    def encode_prompt(self, text: str) -> tuple[list[int], list[str]]:
        """A language model's prompt, uncapped (the model keeps its last tokens): BOS, then the pieces,
        no EOS (the project's own models were trained so)."""
        ids, pieces = self._encode_pieces(self.normalize(text))
        return [self.bos_id, *ids], [self.id_to_piece(self.bos_id), *pieces]


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (Kudo & Richardson 2018); our models trained from scratch use these."""

    def __init__(self, path: str | Path, text: dict[str, Any] | None = None,
                 max_tokens: int = MAX_TOKENS_SCRATCH) -> None:
        import sentencepiece as spm

        super().__init__(text, max_tokens)
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        if min(self.bos_id, self.eos_id) < 0:
            raise ValueError(f"{Path(path).name}: the SentencePiece model needs <s> and </s> pieces")

    def _encode_pieces(self, text: str) -> tuple[list[int], list[str]]:
        ids = self.sp.encode(text)
        return ids, [self.sp.id_to_piece(i) for i in ids]

    def raw_piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def decode(self, ids: list[int]) -> str:
        special = {self.pad_id, self.bos_id, self.eos_id}
        return self.sp.decode([i for i in ids if i not in special])

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()


class JsonTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer.json (WordPiece for MiniLM, [CLS]/[SEP] added by it)."""

    def __init__(self, path: str | Path, text: dict[str, Any] | None = None,
                 max_tokens: int = MAX_TOKENS_MINILM, tokenizer: Any = None) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        super().__init__(text, max_tokens)
        self.tk = tokenizer if tokenizer is not None else HFTokenizer.from_file(str(path))
        self.tk.no_truncation()
        self.tk.no_padding()

        def find(*names: str) -> int:
            for n in names:
                i = self.tk.token_to_id(n)
                if i is not None:
                    return i
            return -1

        self.pad_id, self.unk_id = find("[PAD]", "<pad>"), find("[UNK]", "<unk>")
        self.bos_id, self.eos_id = find("[CLS]", "<s>"), find("[SEP]", "</s>")
        self.byte_level = is_byte_level(self.tk)
        self.added = set(self.tk.get_added_tokens_decoder())  # added tokens are stored as they read, not as bytes

    def _encode_pieces(self, text: str) -> tuple[list[int], list[str]]:
        enc = self.tk.encode(text, add_special_tokens=False)
        # the vocabulary's piece of each id: a unigram model (ALBERT, DeBERTa-v3) reports an unknown character as
        # itself in enc.tokens, while the model sees <unk>
        return list(enc.ids), [self.id_to_piece(i) for i in enc.ids]

    def encode_prompt(self, text: str) -> tuple[list[int], list[str]]:
        """Exactly as transformers encodes it: the tokenizer's own normaliser and post-processor decide the
        specials (GPT-2's adds none), so the same text gives the same ids on both sides."""
        enc = self.tk.encode(text, add_special_tokens=True)
        return list(enc.ids), [self.id_to_piece(i) for i in enc.ids]

    def id_to_piece(self, i: int) -> str:
        piece = self.raw_piece(i)
        return piece if i in self.added else readable_piece(piece, self.byte_level)

    def raw_piece(self, i: int) -> str:
        return self.tk.id_to_token(i) or f"<{i}>"

    def decode(self, ids: list[int]) -> str:
        special = {self.pad_id, self.bos_id, self.eos_id}
        return self.tk.decode([i for i in ids if i not in special], skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)


def encode_input(tokenizer: Tokenizer | None, text: str | Sequence[int], max_len: int, owner: str = "model"
                 ) -> tuple[list[int], list[str], str]:
    """(ids, token labels, notice) of a model input: a text goes through ``tokenizer`` (capped at ``max_len``
    tokens), token ids (specials included) are cut at ``max_len``; the notice says when input was cut."""
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError(f"this {owner} has no tokenizer: pass token ids or set .tokenizer")
        enc = tokenizer.encode(text, max_tokens=max_len)
        return enc.ids, enc.pieces, enc.notice
    ids, notice = [int(i) for i in text], ""
    if len(ids) > max_len:
        notice = f"Input truncated to {max_len} tokens (it had {len(ids)})."
        ids = ids[:max_len]
    return ids, [tokenizer.id_to_piece(i) if tokenizer is not None else str(i) for i in ids], notice


def load_tokenizer(folder: str | Path, text: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer stored in a checkpoint folder: tokenizer.model (SentencePiece) or tokenizer.json."""
    folder = Path(folder)
    if (folder / "tokenizer.model").is_file():
        return SentencePieceTokenizer(folder / "tokenizer.model", text, MAX_TOKENS_SCRATCH)
    if (folder / "tokenizer.json").is_file():
        return JsonTokenizer(folder / "tokenizer.json", text, MAX_TOKENS_MINILM)
    from models.paths import CheckpointError

    raise CheckpointError(folder / "tokenizer.model", f"no tokenizer.model or tokenizer.json in {folder}")


def folder_tokenizer(folder: str | Path, model_type: str) -> Any:
    """A Hugging Face folder's tokenizer as a ``tokenizers.Tokenizer``: its tokenizer.json, or else the older
    files, assembled into the pipeline those files mean: BERT's ``vocab.txt`` (BERT normaliser with the
    folder's ``do_lower_case`` / ``strip_accents`` / ``tokenize_chinese_chars``, BERT pre-tokeniser, WordPiece,
    ``[CLS] … [SEP]``), GPT-2's ``vocab.json`` + ``merges.txt`` (byte-level BPE, no specials added) or RoBERTa's
    (the same BPE, ``<s> … </s>``). Raises
    ``FileNotFoundError`` naming what is missing."""
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, WordPiece

    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer.from_file(str(folder / "tokenizer.json"))
    try:
        options = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        options = {}
    if model_type in ("bert", "distilbert", "electra") and (folder / "vocab.txt").is_file():  # all WordPiece
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
        vocab = {tok: i for i, tok in enumerate(t.rstrip("\r") for t in lines) if tok}
        names = {k: str(options.get(f"{k}_token", f"[{k.upper()}]")) for k in ("unk", "cls", "sep", "pad", "mask")}
        tk = HFTokenizer(WordPiece(vocab, unk_token=names["unk"]))
        tk.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=bool(options.get("tokenize_chinese_chars", True)),
            strip_accents=options.get("strip_accents"), lowercase=bool(options.get("do_lower_case", True)))
        tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tk.decoder = decoders.WordPiece(prefix="##")
        tk.add_special_tokens([n for n in names.values() if n in vocab])
        cls, sep = names["cls"], names["sep"]
        tk.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, vocab.get(cls, 2)), (sep, vocab.get(sep, 3))])
        return tk
    if model_type in ("gpt2", "roberta") and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        merges = [tuple(line.split(" ")) for line in (folder / "merges.txt").read_text(encoding="utf-8").split("\n")
                  if line and not line.startswith("#version") and len(line.split(" ")) == 2]
        tk = HFTokenizer(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                             fuse_unk=False))
        prefix = bool(options.get("add_prefix_space", False))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
        tk.decoder = decoders.ByteLevel()
        if model_type == "gpt2":  # no specials added around the text
            end = str(options.get("eos_token") or "<|endoftext|>")
            if end in vocab:
                tk.add_special_tokens([end])
            return tk
        # RoBERTa: the same byte-level BPE, the text between <s> and </s> (RobertaProcessing), as transformers' own
        names = {k: str(options.get(f"{k}_token") or default) for k, default in
                 (("bos", "<s>"), ("eos", "</s>"), ("pad", "<pad>"), ("unk", "<unk>"), ("mask", "<mask>"))}
        missing = [n for n in (names["bos"], names["eos"]) if n not in vocab]
        if missing:
            raise ValueError(f"vocab.json has no {' or '.join(missing)}")
        tk.add_special_tokens([n for n in names.values() if n in vocab])
        tk.post_processor = processors.RobertaProcessing((names["eos"], vocab[names["eos"]]),
                                                         (names["bos"], vocab[names["bos"]]),
                                                         trim_offsets=True, add_prefix_space=prefix)
        return tk
    wanted = {"bert": "vocab.txt", "distilbert": "vocab.txt", "electra": "vocab.txt",
              "gpt2": "vocab.json and merges.txt", "roberta": "vocab.json and merges.txt"}.get(model_type)
    raise FileNotFoundError("no tokenizer.json" + (f" (nor {wanted})" if wanted else ""))


def then_eos(ids: list[int], pieces: list[str], eos_id: int, add_special: bool, cap: int) -> Encoded:
    """A translator's source as transformers encodes it: the pieces then ``</s>`` (no ``<s>``), cut at ``cap``
    tokens with ``</s>`` kept, and a notice when cut."""
    n_special = 1 if add_special else 0
    notice = ""
    if len(ids) + n_special > cap:
        notice = f"Input truncated to {cap} tokens (it had {len(ids) + n_special})."
        ids, pieces = ids[: cap - n_special], pieces[: cap - n_special]
    if add_special:
        ids, pieces = [*ids, eos_id], [*pieces, "</s>"]
    return Encoded(ids, pieces, notice)


class MarianTokenizer(Tokenizer):
    """A Marian (opus-mt) folder's tokenizer: SentencePiece ``source.spm`` cuts the source into pieces that
    ``vocab.json`` numbers (a piece it lacks is ``<unk>``), then ``</s>``; no ``<s>`` (Marian sources have none).
    Target ids are named by the same vocabulary (``target_vocab.json`` where the folder has separate ones) and
    joined into text by ``target.spm``. Language codes (``>>de<<``, multilingual models) are not read."""

    def __init__(self, folder: str | Path, max_tokens: int = 512) -> None:
        import json

        import sentencepiece as spm

        super().__init__({"nfkc": False}, max_tokens)  # SentencePiece normalises as it was trained to
        folder = Path(folder)
        self.source = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(folder / "target.spm"))
        self.vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        target = folder / "target_vocab.json"
        target_vocab = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else self.vocab
        self.names = {i: p for p, i in target_vocab.items()}
        self.pad_id, self.unk_id, self.eos_id = self.vocab["<pad>"], self.vocab["<unk>"], self.vocab["</s>"]
        self.bos_id = self.pad_id  # Marian starts decoding from <pad> (decoder_start_token_id)

    def _encode_pieces(self, text: str) -> tuple[list[int], list[str]]:
        pieces = self.source.encode(text, out_type=str)
        ids = [self.vocab.get(p, self.unk_id) for p in pieces]
        return ids, [p if i != self.unk_id else "<unk>" for p, i in zip(pieces, ids)]

    def encode(self, text: str, add_special: bool = True, max_tokens: int | None = None) -> Encoded:
        """Source pieces then ``</s>`` (transformers' MarianTokenizer), cut at the cap with ``</s>`` kept."""
        return then_eos(*self._encode_pieces(self.normalize(text)), self.eos_id, add_special,
                        self.max_tokens if max_tokens is None else max_tokens)

    def raw_piece(self, i: int) -> str:
        return self.names.get(i, f"<{i}>")

    def decode(self, ids: list[int]) -> str:
        special = {self.pad_id, self.eos_id}
        return self.target.decode_pieces([self.raw_piece(i) for i in ids if i not in special])

    @property
    def vocab_size(self) -> int:
        return len(self.names)


class T5Tokenizer(JsonTokenizer):
    """A T5 folder's tokenizer.json (a SentencePiece unigram model in ``tokenizers`` form): the text's pieces, then
    ``</s>`` (no ``<s>``: T5 sources have none), exactly as transformers' T5 tokenizer encodes it; ``prefix`` (the
    task prefix, "translate English to German: ") is put before the text, so every view sees the sentence the
    model translates. Decoding starts from ``<pad>`` (the decoder's first input)."""

    def __init__(self, path: str | Path, max_tokens: int = 512, prefix: str = "") -> None:
        super().__init__(path, {"nfkc": False}, max_tokens)  # the tokenizer's own normaliser decides
        self.prefix = prefix
        self.eos_id = self.tk.token_to_id("</s>")
        self.pad_id = self.tk.token_to_id("<pad>")
        if self.eos_id is None or self.pad_id is None:
            raise ValueError("a T5 tokenizer.json needs the pieces </s> and <pad>")
        self.bos_id = self.pad_id

    def encode(self, text: str, add_special: bool = True, max_tokens: int | None = None) -> Encoded:
        """``prefix + text``'s pieces then ``</s>``, cut at the cap with ``</s>`` kept."""
        return then_eos(*self._encode_pieces(self.prefix + self.normalize(text)), self.eos_id, add_special,
                        self.max_tokens if max_tokens is None else max_tokens)

    @property
    def vocab(self) -> dict[str, int]:
        return self.tk.get_vocab(with_added_tokens=True)
