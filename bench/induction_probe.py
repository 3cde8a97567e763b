"""How fast a decoder of gpt-tiny's shape learns to copy: train it on synthetic repeated spans alone
(``train.lm.repeated_spans``: ``<s> x x [x]`` rows, spans drawn uniformly from the ordinary pieces) and measure,
every ``--every`` steps, the best induction and previous-token scores at N = 50 (``GPT.head_role_scores``,
``--seeds`` seeds) and the loss. A probe for choosing a training recipe, not a shipped model.

    python bench/induction_probe.py --context 32 --spans 4 10 --steps 2000
    python bench/induction_probe.py --context 64 --spans 4 31 --init RUN_DIR/best.pt   # from a text model

One JSON object per measurement on stdout (step, tokens, loss, induction, its layer and head, previous token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=32, help="tokens per synthetic row")
    ap.add_argument("--spans", type=int, nargs=2, default=(4, 10), metavar=("MIN", "MAX"), help="pieces per span")
    ap.add_argument("--pool", type=int, default=0, help="pieces per span's own pool (0: all; train.lm.repeated_spans)")
    ap.add_argument("--tokens-per-step", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--recipe", choices=["llama", "gpt2"], default="llama", help="models/gpt.py recipe")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--smear-keys", action="store_true", help="models/gpt.py smear_keys (Olsson et al. 2022)")
    ap.add_argument("--qkv-bias", action="store_true", help="models/gpt.py qkv_bias (LLaMA recipe)")
    ap.add_argument("--n", type=int, default=50, help="tokens per copy for the head scores")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--init", type=Path, default=None, help="a train.lm state or best.pt of the same shape")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from models.gpt import GPT, GPTConfig
    from train.lm import repeated_spans
    from train.loop import load_state
    from train.tokenizers import BOS_ID, EOS_ID, PAD_ID

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(recipe=args.recipe, vocab_size=args.vocab, max_len=max(256, 2 * args.n + 1),
                          d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                          dropout=args.dropout, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
                          smear_keys=args.smear_keys, qkv_bias=args.qkv_bias))
    if args.init is not None:
        model.load_state_dict(load_state(args.init)["model"])
    uniform = np.ones(args.vocab)
    uniform[:4] = 0  # the specials
    uniform /= uniform.sum()
    rows = max(1, args.tokens_per_step // args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.1)
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / 100)
        b = repeated_spans(rows, args.context, uniform, seed=10_000 + step, lengths=tuple(args.spans), pool=args.pool)
        loss = F.cross_entropy(model(b[:, :-1]).logits.reshape(-1, args.vocab).float(), b[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.steps - 1:
            scores = model.head_role_scores(args.n, range(args.seeds))  # in eval mode
            induction, previous = scores["induction"], scores["previous"]
            il, ih = np.unravel_index(int(np.argmax(induction)), induction.shape)
            print(json.dumps({"step": step, "tokens": (step + 1) * rows * args.context,
                              "loss": round(float(loss.detach()), 3),
                              "induction": round(float(induction.max()), 3), "induction_head": [int(il), int(ih)],
                              "previous_token": round(float(previous.max()), 3),
                              "seconds": round(time.time() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
