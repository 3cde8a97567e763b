"""The training loop shared by every task: AdamW, warm-up then cosine or inverse-sqrt decay, label smoothing
(in the tasks' losses), gradient clipping, optional bf16 autocast and gradient checkpointing, DDP under
``torchrun --nproc_per_node N`` (gloo on CPU, nccl on GPU), tqdm progress bars, a log file and resumable
state saved every few minutes.

A task supplies three things (``Task``): the global list of training batches of an epoch (deterministic
given the epoch, so a resumed run sees the same batches), the loss of a batch, and a validation function
whose ``"score"`` (higher is better) selects the best epoch.

Resumable state (``RUN_DIR/state.pt``, ``torch.save`` of tensors and plain containers, read back with
``torch.load(weights_only=True)``) holds the model, optimiser, scheduler, step, epoch, position in the
epoch, the torch RNG and the validation history; the best epoch's weights are kept in ``RUN_DIR/best.pt``.
Data order comes from ``(seed, epoch)`` and augmentation from ``(seed, step)``, so a resumed run repeats
an uninterrupted one exactly on the CPU.

``--time-budget MINUTES`` makes the cosine decay follow the clock (whichever of step and time progress is
further) and ends training when the budget is used, validating the last partial epoch: on a shared, busy
machine the run still anneals and finishes on time. Resuming with a larger budget continues the decay from
the new, earlier point of the curve (a mild warm restart).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm


@dataclass
class TrainConfig:
    epochs: int = 10  # passes over the training batches
    max_steps: int | None = None  # if set, stop after this many optimiser steps (also sizes the schedule)
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    min_lr_ratio: float = 0.0  # the cosine schedule ends at lr * min_lr_ratio
    weight_decay: float = 0.01  # AdamW decoupled decay on matrices (not on biases, norms, embeddings' bias)
    betas: tuple[float, float] = (0.9, 0.98)  # Adam betas (Vaswani et al. 2017 use 0.98 for beta2)
    warmup_steps: int = 200  # linear warm-up from 0 to lr
    schedule: str = "cosine"  # "cosine" decay to min_lr_ratio, or "inverse_sqrt" (Vaswani et al. 2017)
    clip: float = 1.0  # max global gradient norm (0 disables)
    label_smoothing: float = 0.1  # used by the tasks' cross-entropy
    bf16: bool = False  # bfloat16 autocast for forward and loss
    grad_checkpoint: bool = False  # recompute each layer's activations in the backward pass
    save_every_s: float = 180.0  # seconds between resumable-state saves (also saved after each epoch)
    seed: int = 0  # model init, data order, dropout, augmentation
    stop_after: int | None = None  # save state and exit after this many steps (simulates an interruption)
    time_budget_s: float | None = None  # if set, the decay runs over this much training time and ends it
    log_every: int = 50  # steps between log lines
    keep_last: int = 0  # keep the weights of the last K epochs (RUN_DIR/epoch-N.pt) for averaging


class Task(Protocol):
    def train_batches(self, epoch: int) -> list[Any]:
        """All global training batches of ``epoch`` in order (same on every rank)."""

    def loss(self, model: nn.Module, batch: Any, step: int, label_smoothing: float) -> Tensor:
        """Mean training loss of ``batch`` (``model`` may be DDP-wrapped: call it, don't reach inside)."""

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Validation metrics of the bare model (eval mode); must contain ``"score"`` (higher is better)."""


@dataclass
class TrainResult:
    finished: bool  # False when stopped by ``stop_after``
    step: int
    best_epoch: int
    best_score: float
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock training time over all sessions of this run
    cpu_seconds: float = 0.0  # CPU time of this process (rank 0) over all sessions: shows a busy machine


# ----------------------------------------------------------------------------------------------------------
# distributed helpers


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str | None = None) -> Dist:
    """Join the process group when started by torchrun (WORLD_SIZE > 1): nccl on GPU, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank, world, dev)


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def broadcast_float(x: float, d: Dist) -> float:
    if d.world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=d.device if d.device.type == "cuda" else "cpu")
    dist.broadcast(t, src=0)
    return float(t.item())


# ----------------------------------------------------------------------------------------------------------
# optimiser, schedule, checkpointing of layers


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only (not biases, norms, position tables, CLS tokens)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_matrix = (p.ndim >= 2 and "pos" not in name and "norm" not in name and "bias_table" not in name
                     and not name.endswith("A_log"))  # Mamba's state matrix A = −exp(A_log): not a weight to shrink
        (decay if is_matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def lr_factor(step: int, total: int, cfg: TrainConfig, time_progress: float = 0.0) -> float:
    """Multiplier of the peak lr at ``step``: linear warm-up, then cosine or inverse-sqrt decay.

    The cosine runs over the steps after warm-up, or over the time budget (``time_progress``, the
    fraction of it used) when that is further along, so a run on a busy machine still anneals fully.
    """
    warm = max(1, cfg.warmup_steps)
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(warm / (step + 1))
    progress = min(1.0, max((step - warm) / max(1, total - warm), time_progress))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def enable_grad_checkpointing(model: nn.Module) -> int:
    """Recompute the activations of every block in the model's ``nn.ModuleList``s during backward.

    Patches each block's ``forward`` on the instance, so parameter names (and checkpoints) are unchanged.
    Returns the number of blocks patched.
    """
    if hasattr(model, "gradient_checkpointing"):
        model.gradient_checkpointing = True
        return -1
    n = 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList):
            continue
        for block in module:
            if any(p.requires_grad for p in block.parameters()):
                orig = block.forward

                def fwd(*args: Any, _orig: Callable[..., Any] = orig, _block: nn.Module = block, **kw: Any) -> Any:
                    if _block.training and torch.is_grad_enabled():
                        return checkpoint(_orig, *args, use_reentrant=False, **kw)
                    return _orig(*args, **kw)

                block.forward = fwd  # type: ignore[method-assign]
                n += 1
    return n


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def weights_digest(model: nn.Module) -> str:
    """A short hash of every parameter and buffer (to compare ranks or runs)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()[:16]


def hardware() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu} ({os.cpu_count()} logical cores), {torch.get_num_threads()} torch thread(s){gpu}"


# ----------------------------------------------------------------------------------------------------------
# logging and state files


class Logger:
    """Appends timestamped lines to ``run_dir/train.log`` (rank 0 only) and echoes them to stderr."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / "train.log"
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, msg: str) -> None:
        if not self.enabled:
            return
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        tqdm.write(line, file=sys.stderr)


def atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def distillation_loss(logits: Tensor, labels: Tensor, teacher: Tensor | None, alpha: float,
                      temperature: float, label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy on the labels; with ``teacher`` logits, knowledge distillation as well (Hinton et al.
    2015): ``alpha · T² · KL(teacher_T ‖ student_T) + (1 − alpha) · CE``, both at temperature ``T``."""
    ce = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    if teacher is None:
        return ce
    t = temperature
    soft = F.log_softmax(teacher / t, -1)
    kd = F.kl_div(F.log_softmax(logits / t, -1), soft, log_target=True, reduction="batchmean") * t * t
    return alpha * kd + (1 - alpha) * ce


def cached_teacher(run_dir: str | Path, resume: bool, compute: Callable[[], Tensor], d: Dist) -> Tensor:
    """Teacher logits from ``run_dir/teacher_logits.pt`` when resuming, else ``compute()`` (saved by rank 0)."""
    cache = Path(run_dir) / "teacher_logits.pt"
    if resume and cache.exists():
        return torch.load(cache, map_location="cpu", weights_only=True)
    soft = compute()
    if d.main:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(soft, cache)
    return soft


def load_init(folder: str | Path, family: str) -> tuple[nn.Module, dict[str, Any]]:
    """A trained checkpoint's model (in train mode, to continue training it) and where it came from.

    SystemExit when the checkpoint holds a model of another family than ``family`` (a models.registry name). The
    returned record names the folder and keeps that checkpoint's own training record, so the history stays complete.
    """
    import models
    from models import registry

    folder = Path(folder)
    model = models.load(folder)
    if not registry.is_family(model, family):
        raise SystemExit(f"--init {folder}: a {type(model).__name__} checkpoint, but this command trains a "
                         f"{registry.FAMILIES[family].model_class}")
    metrics = folder / "metrics.json"
    training = json.loads(metrics.read_text()).get("training") if metrics.is_file() else None
    return model.train(), {"checkpoint": folder.name, "training": training}


def load_best(run_dir: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(state dict, info) of the best epoch saved in ``run_dir/best.pt``."""
    obj = load_state(Path(run_dir) / "best.pt")
    return obj["model"], {k: v for k, v in obj.items() if k != "model"}


# ----------------------------------------------------------------------------------------------------------
# the loop


def average_last(run_dir: str | Path, k: int) -> tuple[dict[str, Tensor], list[int]]:
    """Element-wise mean of the last ``k`` kept epoch weights (checkpoint averaging, Vaswani et al. 2017
    §6.1) and the epochs averaged. Needs a run trained with ``keep_last >= k``."""
    files = sorted(Path(run_dir).glob("epoch-*.pt"), key=lambda f: int(f.stem.split("-")[1]))[-k:]
    if not files:
        raise FileNotFoundError(f"{run_dir}: no epoch-N.pt weights (train with --keep-last)")
    states = [load_state(f)["model"] for f in files]
    mean = {name: (sum(s[name].double() for s in states) / len(states)).to(t.dtype) if t.is_floating_point()
            else t for name, t in states[-1].items()}
    return mean, [int(f.stem.split("-")[1]) for f in files]


def prefer_average(model: nn.Module, task: Task, run_dir: str | Path, k: int, state: dict[str, Tensor],
                   info: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The best epoch's ``(state, info)`` from :func:`load_best`, or the mean of the last ``k`` kept epochs
    when its validation score is higher (checkpoint averaging; with a constant learning rate this is
    stochastic weight averaging, Izmailov et al. 2018). Leaves ``model`` holding the averaged weights."""
    avg, epochs = average_last(run_dir, k)
    model.load_state_dict(avg)
    model.eval()
    with torch.no_grad():
        metrics = task.validate(model)
    print(f"average of epochs {epochs}: {json.dumps(metrics)}; best epoch {info['epoch']}: "
          f"{json.dumps(info['metrics'])}", file=sys.stderr)
    if metrics["score"] > info["score"]:
        return avg, {**info, "epoch": f"mean of {epochs}", "metrics": metrics, "score": metrics["score"]}
    return state, info


def train(model: nn.Module, task: Task, cfg: TrainConfig, run_dir: str | Path, resume: bool = False,
          d: Dist | None = None, desc: str = "train") -> TrainResult:
    """Train ``model`` (already on ``d.device``) on ``task``; returns when done or stopped by stop_after."""
    d = d or setup_distributed()
    run_dir = Path(run_dir)
    log = Logger(run_dir, d.main)
    state_path, best_path = run_dir / "state.pt", run_dir / "best.pt"

    torch.manual_seed(cfg.seed)
    if cfg.grad_checkpoint:
        enable_grad_checkpointing(model)
    opt = make_optimizer(model, cfg)

    steps_per_epoch = len(task.train_batches(0)) // d.world
    if steps_per_epoch == 0:
        raise ValueError("fewer training batches than processes")
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch
    epochs = math.ceil(total / steps_per_epoch)
    base_lrs = [g["lr"] for g in opt.param_groups]

    def set_lr() -> float:
        budget = cfg.time_budget_s
        used = (elapsed_before + time.time() - t0) / budget if budget else 0.0
        f = lr_factor(step, total, cfg, used)
        for g, lr in zip(opt.param_groups, base_lrs):
            g["lr"] = lr * f
        return base_lrs[0] * f

    def out_of_time() -> bool:
        budget = cfg.time_budget_s
        return budget is not None and broadcast_float(float(elapsed_before + time.time() - t0 >= budget), d) > 0

    step, epoch, pos, elapsed_before, cpu_before = 0, 0, 0, 0.0, 0.0
    history: list[dict[str, float]] = []
    best_score, best_epoch = -math.inf, -1
    if resume and state_path.exists():
        st = load_state(state_path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        step, epoch, pos = int(st["step"]), int(st["epoch"]), int(st["pos"])
        history = list(st["history"])
        best_score, best_epoch = float(st["best_score"]), int(st["best_epoch"])
        elapsed_before = float(st["seconds"])
        cpu_before = float(st.get("cpu_seconds", 0.0))
        torch.set_rng_state(st["rng"][d.rank] if d.rank < len(st["rng"]) else st["rng"][0])
        log(f"resumed from {state_path} at step {step} (epoch {epoch}, batch {pos})")
    elif resume:
        log(f"--resume: no state at {state_path}, starting from scratch")
    else:
        # a fresh start with a different seed per rank for dropout; DDP syncs the initial weights from rank 0
        torch.manual_seed(cfg.seed * 1000 + d.rank + 1)

    if d.main:
        log(f"start: {count_parameters(model):,} parameters, {steps_per_epoch} steps/epoch x {epochs} epochs "
            f"= {total} steps, world {d.world}, device {d.device}, config {json.dumps(asdict(cfg))}")

    net: nn.Module = model
    if d.world > 1:
        net = DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)

    def save() -> None:
        rng = _gather_rng(d)
        if d.main:
            atomic_save({"model": model.state_dict(), "optim": opt.state_dict(),
                         "step": step, "epoch": epoch, "pos": pos, "history": history,
                         "best_score": best_score, "best_epoch": best_epoch, "rng": rng,
                         "seconds": elapsed_before + time.time() - t0, "config": asdict(cfg),
                         "cpu_seconds": cpu_before + time.process_time() - c0}, state_path)

    t0, c0 = time.time(), time.process_time()
    last_save = t0
    lr_now = 0.0
    stop = False
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16) if cfg.bf16 else contextlib.nullcontext()
    while epoch < epochs and step < total and not stop:
        if step > 0 and out_of_time():  # resumed with its time budget used up: nothing more to train
            log(f"time budget of {cfg.time_budget_s:.0f}s used up before step {step + 1}")
            break
        batches = task.train_batches(epoch)
        mine = batches[d.rank::d.world][:steps_per_epoch]
        model.train()
        bar = tqdm(total=len(mine), initial=pos, desc=f"{desc} epoch {epoch + 1}/{epochs}", disable=not d.main,
                   mininterval=1.0 if sys.stderr.isatty() else 30.0, dynamic_ncols=True)
        run_loss, run_n = 0.0, 0
        while pos < len(mine) and step < total:
            lr_now = set_lr()
            with autocast:
                loss = task.loss(net, mine[pos], step, cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            step += 1
            pos += 1
            run_loss += float(loss.detach())
            run_n += 1
            bar.update(1)
            bar.set_postfix(loss=f"{run_loss / run_n:.3f}", lr=f"{lr_now:.2e}", refresh=False)
            if step % cfg.log_every == 0:
                log(f"step {step} epoch {epoch + 1} loss {run_loss / run_n:.4f} lr {lr_now:.3e} "
                    f"elapsed {elapsed_before + time.time() - t0:.0f}s")
            if cfg.stop_after is not None and step >= cfg.stop_after:
                save()
                bar.close()
                log(f"stopped after step {step} (--stop-after); resume with --resume")
                return TrainResult(False, step, best_epoch, best_score, history, elapsed_before + time.time() - t0,
                                   cpu_before + time.process_time() - c0)
            if step % cfg.log_every == 0 and out_of_time():
                stop = True
                log(f"time budget of {cfg.time_budget_s:.0f}s used up at step {step}")
                break
            if step % cfg.log_every == 0:  # rank 0 decides, so every rank joins the same save
                due = broadcast_float(float(time.time() - last_save > cfg.save_every_s), d)
                if due:
                    save()
                    last_save = time.time()
        bar.close()
        # end of epoch: validate on rank 0, share the score, keep the best weights
        metrics: dict[str, float] = {}
        if d.main:
            model.eval()
            with torch.no_grad():
                metrics = task.validate(model)
            model.train()
        score = broadcast_float(metrics.get("score", 0.0), d)
        entry = {"epoch": epoch + 1, "step": step, "train_loss": run_loss / max(1, run_n),
                 "seconds": elapsed_before + time.time() - t0, **metrics}
        history.append(entry)
        if score > best_score:
            best_score, best_epoch = score, epoch + 1
            if d.main:
                atomic_save({"model": model.state_dict(), "epoch": epoch + 1, "step": step, "score": score,
                             "metrics": metrics}, best_path)
        if d.main and cfg.keep_last > 0:
            atomic_save({"model": model.state_dict(), "epoch": epoch + 1}, run_dir / f"epoch-{epoch + 1}.pt")
            old = run_dir / f"epoch-{epoch + 1 - cfg.keep_last}.pt"
            old.unlink(missing_ok=True)
        log(f"epoch {epoch + 1} done: {json.dumps(entry)} (best epoch {best_epoch}, score {best_score:.4f})")
        epoch += 1
        pos = 0
        save()
        last_save = time.time()
    seconds = elapsed_before + time.time() - t0
    log(f"finished: {step} steps, {seconds / 60:.1f} min, best epoch {best_epoch} score {best_score:.4f}")
    return TrainResult(True, step, best_epoch, best_score, history, seconds, cpu_before + time.process_time() - c0)


def _gather_rng(d: Dist) -> list[Tensor]:
    """Every rank's torch CPU RNG state (each rank draws its own dropout masks)."""
    mine = torch.get_rng_state()
    if d.world == 1:
        return [mine]
    out = [torch.empty_like(mine) for _ in range(d.world)]
    if d.device.type == "cuda":  # nccl cannot gather CPU tensors
        g = [t.to(d.device) for t in out]
        dist.all_gather(g, mine.to(d.device))
        return [t.cpu() for t in g]
    dist.all_gather(out, mine)
    return out


# ----------------------------------------------------------------------------------------------------------
# command-line flags shared by the training commands


def add_train_args(ap: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    g = ap.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=defaults.epochs)
    g.add_argument("--max-steps", type=int, default=defaults.max_steps)
    g.add_argument("--lr", type=float, default=defaults.lr)
    g.add_argument("--min-lr-ratio", type=float, default=defaults.min_lr_ratio)
    g.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    g.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    g.add_argument("--schedule", choices=["cosine", "inverse_sqrt"], default=defaults.schedule)
    g.add_argument("--clip", type=float, default=defaults.clip)
    g.add_argument("--label-smoothing", type=float, default=defaults.label_smoothing)
    g.add_argument("--bf16", action="store_true", default=defaults.bf16)
    g.add_argument("--grad-checkpoint", action="store_true", default=defaults.grad_checkpoint)
    g.add_argument("--save-every", type=float, default=defaults.save_every_s, help="seconds between state saves")
    g.add_argument("--seed", type=int, default=defaults.seed)
    g.add_argument("--stop-after", type=int, default=None, help="stop (resumably) after this many steps")
    g.add_argument("--time-budget", type=float, default=None,
                   help="minutes of training: the cosine decay follows the clock and training ends there")
    g.add_argument("--log-every", type=int, default=defaults.log_every)
    g.add_argument("--keep-last", type=int, default=defaults.keep_last,
                   help="keep the last K epochs' weights in RUN_DIR for checkpoint averaging")
    g.add_argument("--threads", type=int, default=None, help="torch intra-op threads per process")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    g.add_argument("--resume", action="store_true", help="continue from RUN_DIR/state.pt")
    g.add_argument("--dump-digest", type=Path, default=None,
                   help="write this rank's weight digest to FILE.<rank> when done (used by the DDP test)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        epochs=args.epochs, max_steps=args.max_steps, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay, warmup_steps=args.warmup_steps, schedule=args.schedule, clip=args.clip,
        label_smoothing=args.label_smoothing, bf16=args.bf16, grad_checkpoint=args.grad_checkpoint,
        save_every_s=args.save_every, seed=args.seed, stop_after=args.stop_after, log_every=args.log_every,
        keep_last=args.keep_last,
        time_budget_s=args.time_budget * 60 if args.time_budget else None,
    )


def setup_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


def dump_digest(model: nn.Module, path: Path | None, d: Dist) -> None:
    if path is not None:
        Path(f"{path}.{d.rank}").write_text(weights_digest(model) + "\n")


def training_record(result: TrainResult, model: nn.Module, d: Dist, cfg: TrainConfig,
                    command: list[str]) -> dict[str, Any]:
    """What the training commands store under ``metrics.json["training"]``."""
    return {
        "command": " ".join(command), "parameters": count_parameters(model), "steps": result.step,
        "best_epoch": result.best_epoch, "best_validation_score": result.best_score,
        "minutes": round(result.seconds / 60, 1), "cpu_minutes": round(result.cpu_seconds / 60, 1),
        "processes": d.world, "hardware": hardware(),
        "torch": torch.__version__, "config": asdict(cfg), "history": result.history,
    }
