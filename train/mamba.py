"""Train ``mamba-tiny``: a small Mamba language model (models/families/mamba.py: a selective state-space scan per
layer, no attention) on the same English text and with the same SentencePiece tokeniser as ``gpt-tiny``, so that
the Generate tab and the ninth lesson can set its implicit attention beside a Transformer's on the same pieces:

    python -m train.mamba --data-dir ../shared/data --out checkpoints/mamba-tiny --run-dir runs/mamba-tiny \\
        --time-budget 50 --threads 1

Data, packing, validation and the checkpoint's last-weights rule are train.lm's (``load_corpus``,
``training_documents``, ``LMTask``, ``perplexity_sums``): Multi30k train.en, AG News less its 1,000 held-out lines
(twice an epoch), SST-2 less the grouped hold-out with its phrases packed by sentence; validation perplexity per
piece on Multi30k val.en, those AG News lines and those SST-2 sentences, ``</s>`` included, so it compares with
gpt-tiny's directly. The tokeniser is gpt-tiny's own ``tokenizer.model`` (``--tokenizer``), not a new one. No
synthetic repeated spans by default (``--repeat-share``): they were gpt-tiny's knob for induction heads, which a
state-space model does not have.

Initialisation follows Mamba's reference code (Gu & Dao 2023, §3.6 and ``mamba_simple.py``): Δ's bias so that
softplus gives step sizes log-uniform in [0.001, 0.1], dt_proj's weight uniform in ±rank^−½, A = −(1..N) per
channel (S4D-real, already the Mixer's default), embeddings N(0, 0.02), and out_proj scaled by 1/√n_layers.
A_log and D take no weight decay (train.loop.make_optimizer).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from torch import nn

from train.data import DEFAULT_DATA_DIR
from train.lm import (
    OVERSAMPLE,
    LMTask,
    encode_documents,
    load_corpus,
    row_length,
    rows_per_batch,
    run_commands,
    training_documents,
)
from train.loop import (
    TrainConfig,
    add_train_args,
    cleanup_distributed,
    config_from_args,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.tokenizers import BOS_ID, EOS_ID, PAD_ID

DEFAULTS = TrainConfig(epochs=20, lr=2e-3, min_lr_ratio=0.1, weight_decay=0.1, betas=(0.9, 0.95),
                       warmup_steps=100, label_smoothing=0.0, log_every=25)
GPT_TINY_TOKENIZER = Path("checkpoints/gpt-tiny/tokenizer.model")
DT_RANGE = (1e-3, 1e-1)  # initial step sizes Δ, log-uniform (Mamba's dt_min, dt_max)


def init_mamba(model: nn.Module, seed: int = 0) -> None:
    """Mamba's reference initialisation (the module docstring) on a freshly built ``Mamba``."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    with torch.no_grad():
        model.embed.weight.normal_(0.0, 0.02, generator=g)
        for block in model.blocks:
            m = block.mixer
            bound = c.rank ** -0.5
            m.dt_proj.weight.uniform_(-bound, bound, generator=g)
            lo, hi = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
            dt = torch.exp(torch.rand(c.d_inner, generator=g) * (hi - lo) + lo).clamp_min(1e-4)
            m.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
            m.A_log.copy_(torch.log(torch.arange(1, c.d_state + 1, dtype=torch.float32)).repeat(c.d_inner, 1))
            m.D.fill_(1.0)
            m.out_proj.weight.div_(math.sqrt(c.n_layers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs and resumable state")
    ap.add_argument("--tokenizer", type=Path, default=GPT_TINY_TOKENIZER, help="SentencePiece model (gpt-tiny's)")
    ap.add_argument("--context", type=int, default=256, help="tokens per training context")
    ap.add_argument("--batch-size", type=int, default=16, help="contexts per batch per process")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-state", type=int, default=16)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--repeat-share", type=float, default=0.0,
                    help="share of every batch's tokens in train.lm's synthetic repeated spans (at most 0.10)")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many lines per source (tests)")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    if not 0 <= args.repeat_share <= 0.10:
        ap.error("--repeat-share must be between 0 and 0.10")
    if not args.tokenizer.is_file():
        ap.error(f"--tokenizer {args.tokenizer} is not a file")
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    from models.families.mamba import Mamba, MambaConfig
    from models.inputs.tokenizer import SentencePieceTokenizer
    from models.io.checkpoint import save_checkpoint

    corpus = load_corpus(args.data_dir)
    if args.train_limit:
        corpus = {split: {k: v[: args.train_limit] for k, v in part.items()} for split, part in corpus.items()}
    text = {"lowercase": False}
    tok = SentencePieceTokenizer(args.tokenizer, text)
    train_docs, groups = training_documents(tok, corpus["train"], OVERSAMPLE, group_phrases=True)
    val_docs = {name: encode_documents(tok, texts) for name, texts in corpus["val"].items()}
    repeat_rows = rows_per_batch(args.repeat_share, args.batch_size, args.context)
    task = LMTask(train_docs, val_docs, args.context, args.batch_size, tok.vocab_size, cfg.seed, d.device,
                  repeat_rows=repeat_rows, groups=groups)

    torch.manual_seed(cfg.seed)
    mcfg = MambaConfig(vocab_size=tok.vocab_size, d_model=args.d_model, n_layers=args.layers,
                       d_state=args.d_state, expand=args.expand, max_len=args.context,
                       bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)
    model = Mamba(mcfg)
    init_mamba(model, cfg.seed)
    model = model.to(d.device)
    cmd = ["python", "-m", "train.mamba", *(argv if argv is not None else sys.argv[1:])]
    commands = run_commands(Path(args.run_dir), " ".join(cmd), args.resume) if d.main else []
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc="mamba")
    if result.finished and d.main:
        last = result.history[-1]  # the weights as the run ended, with the last validation
        metrics = {k: v for k, v in last.items() if k not in ("epoch", "step", "train_loss", "seconds")}
        record = training_record(result, model, d, cfg, cmd)
        record["selection"] = f"the last weights (epoch {last['epoch']}, step {result.step:,})"
        syn, total = task.token_counts(result.step)
        record["data"] = {
            "train": {k: f"{len(v):,} lines" for k, v in corpus["train"].items()},
            "sources": "as gpt-tiny (train.lm.load_corpus): Multi30k train.en; AG News train.tsv less 1,000 held-out "
                       "lines (seed 0), every line twice an epoch; SST-2 train.tsv less the grouped hold-out",
            "tokenizer": f"{args.tokenizer} (gpt-tiny's SentencePiece model)",
            "natural_tokens_per_epoch": sum(len(doc) for doc in train_docs),
            "synthetic_repeated_spans": {"rows_per_batch": repeat_rows, "row_tokens": row_length(args.context),
                                         "synthetic_tokens": syn, "training_tokens": total},
        }
        if len(commands) > 1:
            record["commands"] = commands
        record["validation"] = {"split": "as gpt-tiny: Multi30k val.en (1,014), 1,000 held-out AG News train lines, "
                                         "1,000 grouped-held-out SST-2 sentences; perplexity per piece, </s> included",
                                **metrics}
        save_checkpoint(args.out, model, labels=[], text=text, extra_files={"tokenizer.model": args.tokenizer},
                        metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "epoch": last["epoch"], **metrics}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
