"""models/families/gpt.py and models/io/hf.py: the GPT-2 folder's tokenizer encodes as transformers' (its logits,
attention and greedy tokens, and the LLaMA folder's, are tests/test_parity.py's); the LLaMA recipe (grouped-query
attention included) gives the same outputs through the explicit and the fused path; generation, ablation and the logit
lens behave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.blocks.loop import sample
from models.families.gpt import GPT, GPTConfig

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def gpt2_folder(hf_folders) -> tuple[Path, object]:
    """A small random GPT-2 written by transformers, with a byte-level BPE tokenizer.json (tests/parity_folders.py)."""
    built = hf_folders.get("gpt2")
    return built.path, built.ref.model


def test_gpt2_tokenizer_encodes_as_transformers(gpt2_folder) -> None:
    from transformers import PreTrainedTokenizerFast

    import models

    folder, _ = gpt2_folder
    ours = models.load(str(folder))
    ref = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    for text in ["the cat sat", "Hello  world, again!", "ünïcödé 🙂 text"]:
        ids, pieces = ours.encode_prompt(text)
        assert ids == ref(text)["input_ids"] and len(pieces) == len(ids)


def test_hf_folder_with_only_pickle_weights_is_refused(gpt2_folder, tmp_path: Path) -> None:
    import shutil

    import models
    from models.io.checkpoint import CheckpointError

    folder, _ = gpt2_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="pickle, refused"):
        models.load(str(tmp_path))


LLAMA = GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2,
                  bos_id=1, eos_id=2)


@pytest.mark.parametrize("config", [LLAMA, GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=32,
                                                     n_layers=2, n_heads=4, rope_layout="half", qkv_bias=True),
                                    GPTConfig(recipe="gpt2", vocab_size=64, max_len=48, d_model=32, n_layers=2,
                                              n_heads=4),
                                    GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=48, n_layers=2,
                                              n_heads=6, n_kv_heads=2, qkv_bias=True)],
                         ids=["llama-gqa", "llama-half-qkv-bias", "gpt2", "gpt-tiny-shape"])
def test_explicit_equals_fused_and_cache(config: GPTConfig) -> None:
    torch.manual_seed(0)
    model = GPT(config).eval()
    ids = torch.randint(3, 64, (2, 20))
    with torch.no_grad():
        fused = model(ids).logits
        explicit = model(ids, need_weights=True)
        from models.blocks.attention import KVCache

        caches = [KVCache() for _ in model.blocks]
        stepped = torch.cat([model(ids[:, :12], caches).logits]
                            + [model(ids[:, t : t + 1], caches).logits for t in range(12, 20)], 1)
    torch.testing.assert_close(explicit.logits, fused, atol=1e-5, rtol=0)
    torch.testing.assert_close(stepped, fused, atol=1e-5, rtol=0)
    for w in explicit.attention:
        assert w.shape == (2, config.n_heads, 20, 20)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, config.n_heads, 20), atol=1e-5, rtol=0)
        assert float(torch.triu(w, 1).abs().max()) == 0.0  # causal: nothing above the diagonal


def test_query_key_biases_alone_make_a_previous_token_head() -> None:
    """With qkv_bias the LLaMA recipe can score by position alone: q = b_q, k = b_k for every token, and RoPE
    turns b_qᵀ R(j − i) b_k into a peak one token back when b_q is b_k turned by one position backwards."""
    c = GPTConfig(recipe="llama", vocab_size=64, max_len=48, d_model=32, n_layers=1, n_heads=4, qkv_bias=True)
    model = GPT(c).eval()
    attn = model.blocks[0].attn
    assert attn.o_proj.bias is None and GPT(LLAMA).blocks[0].attn.k_proj.bias is None
    from models.blocks.positional import apply_rope as rotate
    from models.blocks.positional import rope_angles

    key = torch.ones(1, 4, 1, 8)
    query = 60 * rotate(key, rope_angles(1, 8, offset=-1), c.rope_layout)  # b_k turned one position back
    with torch.no_grad():
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        attn.q_proj.bias.copy_(query.flatten())
        attn.k_proj.bias.copy_(key.flatten())
        w = model(torch.randint(3, 64, (2, 12)), need_weights=True).attention[0]  # (B, H, T, T)
    i = torch.arange(1, 12)
    assert float(w[:, :, i, i - 1].min()) > 0.95  # every head, every token, whatever the tokens are


def test_grouped_query_heads_share_their_keys() -> None:
    torch.manual_seed(0)
    model = GPT(LLAMA).eval()
    assert model.blocks[0].attn.k_proj.out_features == 2 * LLAMA.d_head
    with torch.no_grad():  # ablating every query head of one group equals zeroing that group's values
        ids = torch.randint(3, 64, (1, 10))
        mask = torch.ones(2, 6)
        mask[0, :3] = 0  # heads 0-2 read key/value head 0
        a = model(ids, head_mask=mask).logits
        v = model.blocks[0].attn.v_proj
        saved = v.weight.detach().clone()
        v.weight.data[: LLAMA.d_head] = 0
        b = model(ids).logits
        v.weight.data.copy_(saved)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_generation_records_steps_and_attention_for_every_token() -> None:
    torch.manual_seed(0)
    model = GPT(LLAMA).eval()
    r = model.generate([1, 5, 6, 7], max_new_tokens=6)
    t = len(r.tokens)
    assert r.prompt_len == 4 and len(r.steps) == t - 4
    w = r.attention["decoder"].weights
    assert w.shape == (2, 6, t, t) and np.allclose(w.sum(-1), 1, atol=1e-5)
    for step, chosen in zip(r.steps, r.ids[4:]):
        assert step.chosen == str(chosen) and step.candidates[0] == step.chosen  # greedy takes the top one
        assert np.all(np.diff(step.probs) <= 0) and 0 < step.chosen_prob <= 1
    # surprisal: −log2 p of each token given the ones before it, from the same model
    assert np.isnan(r.surprisal[0])
    probs = model.next_token_probs(r.ids[:5])
    assert r.surprisal[5] == pytest.approx(-np.log2(probs[r.ids[5]]), abs=1e-4)
    again = model.generate([1, 5, 6, 7], max_new_tokens=6, strategy="sample", temperature=0.7, top_k=5, seed=3)
    assert again.ids == model.generate([1, 5, 6, 7], max_new_tokens=6, strategy="sample", temperature=0.7,
                                       top_k=5, seed=3).ids  # seeded


def test_long_prompt_keeps_its_last_tokens_and_bos() -> None:
    model = GPT(LLAMA).eval()  # 48 positions: prompt + new tokens fit in 48
    r = model.generate([1] + list(range(3, 63)), max_new_tokens=8)
    assert r.ids[0] == 1 and r.ids[1 : r.prompt_len] == list(range(3, 63))[-(40 - 1):]
    assert r.prompt_len == 40 and "shortened" in r.notice


def test_sampling_filters() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([5.0, 4.0, 1.0, 0.0, -1.0])
    assert {sample(logits, 1.0, 2, 1.0, g) for _ in range(200)} <= {0, 1}  # top-k 2
    # nucleus: p(0) ≈ 0.72 < 0.8, so token 1 joins; nothing else
    assert {sample(logits, 1.0, 0, 0.8, g) for _ in range(200)} == {0, 1}
    assert {sample(logits, 1.0, 0, 0.5, g) for _ in range(50)} == {0}


def test_ablation_and_logit_lens() -> None:
    torch.manual_seed(0)
    model = GPT(LLAMA).eval()
    ids = [1, 9, 10, 11, 12]
    base = model.next_token_probs(ids)
    off = torch.ones(2, 6)
    off[1, 4] = 0
    assert not np.allclose(model.next_token_probs(ids, off), base)
    np.testing.assert_allclose(model.next_token_probs(ids, torch.ones(2, 6)), base, atol=1e-6)
    lens = model.logit_lens(ids)
    assert lens.top_probs.shape == lens.target_probs.shape == (2, 5) and len(lens.top_tokens) == 2
    # the last layer's reading is the model's own output
    assert lens.targets[:-1] == [str(i) for i in ids[1:]]
    assert lens.target_probs[-1, 0] == pytest.approx(float(model.next_token_probs(ids[:1])[ids[1]]), abs=1e-5)
    assert lens.top_tokens[-1][-1] == lens.targets[-1]


def test_head_role_scores_average_the_seeds_sequences_drawn_from_the_pieces() -> None:
    from models.analysis import head_roles

    torch.manual_seed(0)
    model = GPT(LLAMA).train()
    pieces = np.arange(20, 40)
    scores = model.head_role_scores(6, [0, 3], pieces)
    assert model.training  # its mode is given back
    runs = []
    for seed in (0, 3):
        ids = model.repeated_tokens(6, seed, pieces)
        assert ids[1:7] == ids[7:] and set(ids[1:]) <= set(pieces.tolist())
        runs.append(head_roles(model.eval().token_losses(ids)[1], 6))
    for role, value in scores.items():
        assert value.shape == (2, 6)
        np.testing.assert_allclose(value, (runs[0][role] + runs[1][role]) / 2, atol=1e-6)
    assert not np.allclose(runs[0]["induction"], runs[1]["induction"])  # two seeds, two sequences
    with pytest.raises(ValueError, match="no ordinary token"):
        model.repeated_tokens(6, 0, [LLAMA.bos_id, LLAMA.eos_id])

