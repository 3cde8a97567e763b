"""Tokens as people read them (issue 61, item 7): a byte-level BPE tokenizer (GPT-2, RoBERTa, Qwen2 folders; GGUF's
gpt2 model) spells bytes as characters ("Ġold", "Café" as "CafÃ©", an emoji as "ðŁĺĢ"). Its labels are decoded
(models.inputs.tokenizer.readable_piece: a space as SentencePiece's "▁", a byte outside a whole character as
"<0xF0>"), the piece itself kept as the label's ``raw`` and shown on hover; SentencePiece and WordPiece labels are
unchanged. Folders are written here: a Qwen2-style tokenizer.json (split regex, then ByteLevel; added tokens) and a
GPT-2 vocab.json + merges.txt."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from models.inputs.tokenizer import JsonTokenizer, Piece, folder_tokenizer, raw_piece, readable_piece
from serving import catalogue, store
from tests.tiny_families import decoder_folder

TEXT = "Café 😀 old"
CORPUS = ["the old cat sat on the old mat", "Café au lait, an old café", "the dog ran in the old park"] * 20
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")


def qwen2_tokenizer(folder: Path, vocab: int = 290) -> Path:
    """A Qwen2-style tokenizer.json (Qwen2's split regex, then ByteLevel without its own regex; ByteLevel decoder;
    <|endoftext|>, <|im_start|>, <|im_end|> added), trained on CORPUS: the emoji is rare, so it stays in pieces."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tk = Tokenizer(BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tk.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def mistral_tokenizer(folder: Path, vocab: int = 300) -> Path:
    """A Mistral-style tokenizer.json (SentencePiece BPE in ``tokenizers`` form: Metaspace "▁", byte fallback
    <0x00>…<0xFF>, <unk> <s> </s>), trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tk = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(content=" ", left=1)])
    specials = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)]]
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials))
    # trained word by word (no merge across "▁", as SentencePiece trains), read as transformers' LLaMA/Mistral
    # conversion writes it: one Metaspace over the whole text
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def gpt2_files(folder: Path) -> Path:
    """GPT-2's older files, vocab.json + merges.txt (no tokenizer.json), from a byte-level BPE trained on CORPUS."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=280, special_tokens=["<|endoftext|>"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(folder))
    return folder


def spelled_out(labels: list[str]) -> str:
    """The text a row of labels stands for: ▁ a space, ↵ a newline, each <0xNN> its byte (readable_piece's rules)."""
    data = b""
    for label in labels:
        for part in re.split(r"(<0x[0-9A-F]{2}>)", label):
            if re.fullmatch(r"<0x[0-9A-F]{2}>", part):
                data += bytes([int(part[3:5], 16)])
            else:
                data += part.replace("▁", " ").replace("↵", "\n").encode("utf-8")
    return data.decode("utf-8")


def reference(folder: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))


def test_readable_piece_decodes_bytes_and_marks_spaces() -> None:
    """Known answers: GPT-2's spellings of " Café", " old", a newline, two spaces, an emoji cut after three bytes and
    its last byte; a piece outside the byte alphabet (an added token) and a SentencePiece piece stay as they are."""
    assert readable_piece("ĠCafÃ©", True) == "▁Café"
    assert readable_piece("Ġold", True) == "▁old" and readable_piece("Ġold", True).raw == "Ġold"
    assert readable_piece("Ċ", True) == "↵" and readable_piece("ĠĠ", True) == "▁▁"
    assert readable_piece("ĠðŁĺ", True) == "▁<0xF0><0x9F><0x98>" and readable_piece("Ģ", True) == "<0x80>"
    assert readable_piece("ðŁĺĢ", True) == "😀"
    assert readable_piece("ĉ", True) == "⇥" and readable_piece("č", True) == "<0x0D>"  # tab; carriage return
    for same in ("<|im_start|>", "hello"):
        assert readable_piece(same, True) == same and not isinstance(readable_piece(same, True), Piece)
    assert readable_piece("▁Café", False) == "▁Café" and readable_piece("ĠCafÃ©", False) == "ĠCafÃ©"


def test_a_character_cut_over_pieces_is_read_whole() -> None:
    """viz.common.across_pieces, known answers: an emoji cut after three bytes (a byte-level label) or into four
    byte pieces (SentencePiece's byte fallback) is shown once, where it starts, each piece noting "part of 😀"; bytes
    that make no character, and a lone control byte, stay escapes."""
    from viz.common import across_pieces

    shown, notes = across_pieces(["C", "af", "é", "▁<0xF0><0x9F><0x98>", "<0x80>", "▁old", "<0xFF>", "<0x0A>"])
    assert shown == ["C", "af", "é", "▁😀", "", "▁old", "<0xFF>", "<0x0A>"]
    assert notes == ["", "", "", "part of 😀", "part of 😀", "", "", ""]
    shown, notes = across_pieces(["<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "▁a", "<0xE2>"])
    assert shown == ["😀", "", "", "", "▁a", "<0xE2>"] and notes[:4] == ["part of 😀"] * 4 and notes[5] == ""
    assert across_pieces(["<0xF0><0x9F>", "x", "<0x98><0x80>"])[0] == ["<0xF0><0x9F>", "x", "<0x98><0x80>"]


def test_qwen2_style_tokenizer_labels_read_as_text(tmp_path: Path) -> None:
    """A Qwen2-style tokenizer.json: byte-level; the labels of "Café 😀 old" spell the text exactly (no mojibake: no
    Ġ, Ã or ð), their raw pieces are transformers' own tokens, and the added tokens keep their names."""
    qwen2_tokenizer(tmp_path)
    tok = JsonTokenizer(tmp_path / "tokenizer.json", {}, 512)
    assert tok.byte_level
    ids, labels = tok.encode_prompt(TEXT)
    ref = reference(tmp_path)
    assert ids == ref(TEXT)["input_ids"]
    assert [raw_piece(t) for t in labels] == ref.convert_ids_to_tokens(ids)
    assert spelled_out(labels) == TEXT
    assert "▁old" in labels and not any(c in "".join(labels) for c in "ĠÃð")
    assert any(t.startswith("▁<0xF0>") or t == "<0xF0>" for t in labels)  # the emoji is cut into pieces here
    assert tok.id_to_piece(tok.tk.token_to_id("<|im_start|>")) == "<|im_start|>"
    assert tok.encode(TEXT, add_special=False).pieces == labels


def test_gpt2_vocab_and_merges_are_byte_level(tmp_path: Path) -> None:
    """GPT-2's vocab.json + merges.txt assembled into a pipeline: byte-level too, the same labels' rules."""
    tok = JsonTokenizer(tmp_path / "tokenizer.json", {}, 512, tokenizer=folder_tokenizer(gpt2_files(tmp_path), "gpt2"))
    assert tok.byte_level
    ids, labels = tok.encode_prompt(TEXT)
    assert spelled_out(labels) == TEXT and "▁old" in labels


def test_sentencepiece_and_wordpiece_labels_unchanged(tiny_checkpoints: Path) -> None:
    """gpt-tiny (SentencePiece) and the MiniLM-style WordPiece: not byte-level, labels are the pieces themselves."""
    from models.inputs.tokenizer import load_tokenizer

    sp = load_tokenizer(tiny_checkpoints / "gpt-tiny")
    assert not sp.byte_level
    ids, labels = sp.encode_prompt("the old cat")
    assert labels == [sp.sp.id_to_piece(i) for i in ids] and not any(isinstance(t, Piece) for t in labels)


@pytest.fixture(scope="module")
def root(tiny_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    shutil.copytree(tiny_checkpoints / "gpt-tiny", root / "gpt-tiny")
    decoder_folder(root / "my-qwen2", "qwen2")
    qwen2_tokenizer(root / "my-qwen2")  # replaces the borrowed tokenizer.json: ids stay under the model's 300
    decoder_folder(root / "my-mistral", "mistral", vocab_size=400)  # 259 specials and bytes, then the words
    mistral_tokenizer(root / "my-mistral", 400)
    return root


@pytest.fixture()
def tab(root: Path, monkeypatch):
    from tabs import generate

    monkeypatch.setattr(catalogue, "CHECKPOINTS", root)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    return generate


def test_generate_shows_decoded_tokens_with_the_piece_on_hover(tab) -> None:
    """A Qwen2 folder in the Generate tab: the heatmap's axis labels, the surprisal text, the candidates and the
    logit lens read "Café" and "▁old"; the hover text names each piece ("(piece Ġold)"); the .npz keeps the pieces as
    transformers names them and the labels beside them."""
    text, _notice, html, cand, attn, lens, state, npz, *_ = tab.generate(TEXT, 3, "my-qwen2")
    result = state["result"]
    ticks = list(attn.layout.yaxis.ticktext) + list(attn.layout.xaxis.ticktext)
    assert any("▁old" in t for t in ticks) and not any(c in "".join(ticks) for c in "ĠÃð")
    hover = list(attn.data[0].y)
    assert any("▁old (piece Ġold)" in h for h in hover)
    import html as html_lib

    shown = html_lib.unescape("".join(re.findall(r">([^<]*)</span>", html)))  # the text a reader sees
    assert "Café" in shown and "Ã" not in shown and "Ġ" not in shown and "piece Ġold" in html
    assert shown.startswith("Café 😀 old")  # the emoji, cut over pieces, read whole in the running text
    assert any(h.endswith("part of 😀") for h in hover)  # and each of its pieces says so on hover
    assert not any(c in json.dumps(cand.to_plotly_json()["data"][0]["text"], ensure_ascii=False) for c in "ĠÃ")
    assert not any("Ġ" in str(x) for x in lens.data[0].x)
    ref = reference(Path(catalogue.CHECKPOINTS) / "my-qwen2")
    with np.load(npz) as arrays:
        assert list(arrays["tokens"]) == ref.convert_ids_to_tokens(result.ids)
        assert list(arrays["tokens_readable"]) == [str(t) for t in result.tokens]
    assert spelled_out(result.tokens[: result.prompt_len]) == TEXT


@pytest.mark.parametrize("name", ["my-qwen2", "my-mistral", "gpt-tiny"])
def test_the_induction_example_fills_inputs_patch_takes(tab, name: str) -> None:
    """Issue 61, item 8: "Induction example: first copy replaced" filled the boxes with texts that Patch then refused
    for Qwen2 and Mistral folders (96 against 94 tokens). The example is made of whole words of the vocabulary,
    repeated; both boxes' texts read back as exactly the ids patched, of equal length, so Patch on the boxes runs the
    same input and draws the same figure."""
    from models.inspect.patching import word_pool
    from tabs.sections import patching
    from tabs.sections.text import encode

    note, fig, kept, clean, corrupted = patching.patch_repeated(name, "heads", 6, 0)
    net = store.get_model(name)
    assert "Repeated random words" in note and len(word_pool(net)) >= 4
    a, b = encode(net, clean)[0], encode(net, corrupted)[0]
    assert len(a) == len(b) and a == kept["ids"]
    words = clean.split()
    assert words[len(words) // 2 + 1:] == words[: len(words) // 2]  # the words, then the same words again
    again_note, again, _ = patching.patch_texts(name, clean, corrupted, "", "heads")
    np.testing.assert_allclose(np.asarray(again.data[0].z, dtype=float), np.asarray(fig.data[0].z, dtype=float))
