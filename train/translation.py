"""Train the en→de Translator on Multi30k and write its checkpoint folder.

    python -m train.tokenizers --only multi30k
    python -m train.translation --out checkpoints/translator-en-de --run-dir runs/translator-en-de \\
        --epochs 10 [--d-model 256 --layers 3 --heads 4 --d-ff 1024]

The source is ``<s> en </s>``, the decoder input ``<s> de`` and the target ``de </s>``, all encoded with
the joint SentencePiece model through ``models.inputs.tokenizer`` (as the app encodes). Model selection: cased
sacreBLEU of greedy output on Multi30k ``val`` after every epoch; the reported figure comes from
``python -m train.evaluate translation`` (beam 5) on ``test_2016_flickr``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from train.data import DEFAULT_DATA_DIR, load_multi30k
from train.loop import (
    TrainConfig,
    add_train_args,
    cleanup_distributed,
    config_from_args,
    dump_digest,
    load_best,
    prefer_average,
    setup_distributed,
    setup_threads,
    train,
    training_record,
)
from train.text import length_batches, pad
from train.tokenizers import BOS_ID, DEFAULT_OUT, EOS_ID, PAD_ID

DEFAULTS = TrainConfig(epochs=10, lr=1e-3, weight_decay=0.01, warmup_steps=400, label_smoothing=0.1)


def encode_corpus(tok: object, lines: list[str]) -> list[list[int]]:
    return [tok.encode(s).ids for s in lines]  # type: ignore[attr-defined]


@torch.no_grad()
def translate_batch(model: nn.Module, tok: object, sources: list[str], beam: int = 1, batch_size: int = 64,
                    progress: bool = False, length_penalty: float = 1.0) -> list[str]:
    """Detokenised translations of ``sources`` (batched greedy or beam search, in input order)."""
    from tqdm import tqdm

    model.eval()
    device = next(model.parameters()).device
    ids = encode_corpus(tok, sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    eos = model.config.eos_id
    with tqdm(total=len(ids), disable=not progress, desc=f"translate (beam {beam})", file=sys.stderr) as bar:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            src = pad([ids[j] for j in idx], model.config.pad_id).to(device)
            if beam <= 1:
                hyps = model.greedy(src)
            else:
                hyps = model.beam_search(src, beam_size=beam, length_penalty=length_penalty)
            for j, h in zip(idx, hyps):
                out[j] = tok.decode([t for t in h.tokens if t != eos])  # type: ignore[attr-defined]
            bar.update(len(idx))
    return out


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


class TranslationTask:
    def __init__(self, tok: object, train_src: list[list[int]], train_tgt: list[list[int]],
                 val_src: list[str], val_ref: list[str], max_tokens: int, seed: int, device: torch.device) -> None:
        self.tok, self.src, self.tgt = tok, train_src, train_tgt
        self.val_src, self.val_ref = val_src, val_ref
        self.lengths = [max(len(s), len(t)) for s, t in zip(train_src, train_tgt)]
        self.max_tokens, self.seed, self.device = max_tokens, seed, device

    def train_batches(self, epoch: int) -> list[list[int]]:
        return length_batches(self.lengths, self.max_tokens, 512, self.seed, epoch)

    def loss(self, model: nn.Module, batch: list[int], step: int, label_smoothing: float) -> Tensor:
        src = pad([self.src[i] for i in batch], PAD_ID).to(self.device)
        tgt = pad([self.tgt[i] for i in batch], PAD_ID).to(self.device)
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD_ID,
                               label_smoothing=label_smoothing)

    def validate(self, model: nn.Module) -> dict[str, float]:
        hyps = translate_batch(model, self.tok, self.val_src, beam=1, batch_size=128)
        score = bleu(hyps, self.val_ref)
        return {"score": score, "val_bleu_greedy": score}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_OUT / "multi30k.model",
                    help="SentencePiece model (python -m train.tokenizers --only multi30k)")
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--run-dir", type=Path, required=True, help="logs and resumable state")
    ap.add_argument("--src-lang", default="en")
    ap.add_argument("--tgt-lang", default="de")
    ap.add_argument("--max-tokens", type=int, default=3000, help="padded tokens per batch per process")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--post-norm", action="store_true", help="original post-norm layers (default pre-norm)")
    ap.add_argument("--train-limit", type=int, default=None, help="use only this many pairs (tests)")
    ap.add_argument("--val-limit", type=int, default=None, help="validate on this many val sentences")
    ap.add_argument("--average-last", type=int, default=0,
                    help="also try the mean of the last K epochs' weights (needs --keep-last K) and ship it if "
                         "its validation BLEU beats the best epoch's")
    add_train_args(ap, DEFAULTS)
    args = ap.parse_args(argv)
    setup_threads(args.threads)
    d = setup_distributed(args.device)
    cfg = config_from_args(args)

    from models.families.translator import Translator, TranslatorConfig
    from models.inputs.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer(args.tokenizer, {})
    if (tok.pad_id, tok.bos_id, tok.eos_id) != (PAD_ID, BOS_ID, EOS_ID):
        raise SystemExit(f"{args.tokenizer}: special ids differ from train.tokenizers' fixed ids")
    tr = load_multi30k(args.data_dir, "train", args.src_lang, args.tgt_lang)
    va = load_multi30k(args.data_dir, "val", args.src_lang, args.tgt_lang)
    n, nv = args.train_limit or len(tr), args.val_limit or len(va)
    task = TranslationTask(tok, encode_corpus(tok, tr.src[:n]), encode_corpus(tok, tr.tgt[:n]), va.src[:nv],
                           va.tgt[:nv], args.max_tokens, cfg.seed, d.device)

    torch.manual_seed(cfg.seed)
    mcfg = TranslatorConfig(vocab_size=tok.vocab_size, d_model=args.d_model, n_heads=args.heads,
                            n_enc_layers=args.layers, n_dec_layers=args.layers, d_ff=args.d_ff,
                            dropout=args.dropout, tie_embeddings=True, norm_first=not args.post_norm,
                            max_len=128, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    model = Translator(mcfg).to(d.device)
    result = train(model, task, cfg, args.run_dir, resume=args.resume, d=d, desc="translation")
    dump_digest(model, args.dump_digest, d)
    if result.finished and d.main:
        state, info = load_best(args.run_dir)
        if args.average_last > 1:
            state, info = prefer_average(model, task, args.run_dir, args.average_last, state, info)
        model.load_state_dict(state)
        from models.io.checkpoint import save_checkpoint

        cmd = ["python", "-m", "train.translation", *(argv if argv is not None else sys.argv[1:])]
        record = training_record(result, model, d, cfg, cmd)
        record["validation"] = {"split": f"Multi30k val ({nv} sentences), greedy, sacreBLEU cased",
                                **info["metrics"]}
        record["shipped_epoch"] = info["epoch"]  # an epoch number, or "mean of [...]" (--average-last)
        save_checkpoint(args.out, model, labels=[], text={"lowercase": False, "nfkc": True},
                        extra_files={"tokenizer.model": args.tokenizer}, metrics={"training": record})
        print(json.dumps({"checkpoint": str(args.out), "best_epoch": info["epoch"], **info["metrics"]}))
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
