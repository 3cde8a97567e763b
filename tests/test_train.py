"""The training loop and commands on tiny configurations and tiny synthetic data (written to tmp_path).

- resuming an interrupted run continues from the saved step and ends with the same weights as an
  uninterrupted run;
- two CPU processes under torchrun (gloo) end with identical weights;
- the training commands write checkpoint folders that load through models.load;
- the evaluation command prints one JSON object as its last stdout line and records it with
  --write-metrics.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from train import loop

ROOT = Path(__file__).resolve().parents[1]
TINY_VIT = ["--set", "dim=16", "depth=1", "heads=2", "mlp_dim=32", "dropout=0.1"]


def idx_bytes(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny data folder in the layout of ../shared/data (plain files; the loaders also read .gz)."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    fm = root / "fashion-mnist"
    fm.mkdir()
    n = 5000 + 96  # the last 5,000 are the validation split
    labels = (np.arange(n) % 10).astype(np.uint8)
    # class-dependent bright band plus noise: learnable, so accuracy can move
    images = rng.integers(0, 60, (n, 28, 28), dtype=np.uint8)
    for c in range(10):
        images[labels == c, 2 * c:2 * c + 4, :] = 220
    (fm / "train-images-idx3-ubyte").write_bytes(idx_bytes(images))
    (fm / "train-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    (fm / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(images[:50]))
    (fm / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels[:50]))

    words_en = ["a", "man", "woman", "dog", "runs", "sits", "on", "the", "street", "grass", "red", "ball"]
    words_de = ["ein", "mann", "frau", "hund", "rennt", "sitzt", "auf", "der", "straße", "wiese", "rot", "ball"]
    en, de = [], []
    for _ in range(200):
        idx = rng.integers(0, len(words_en), rng.integers(3, 8))
        en.append(" ".join(words_en[i] for i in idx).capitalize() + ".")
        de.append(" ".join(words_de[i] for i in idx).capitalize() + ".")
    mt = root / "multi30k"
    mt.mkdir()
    for split, sl in (("train", slice(0, 180)), ("val", slice(180, 190)), ("test_2016_flickr", slice(190, 200))):
        (mt / f"{split}.en").write_text("\n".join(en[sl]) + "\n")
        (mt / f"{split}.de").write_text("\n".join(de[sl]) + "\n")

    sst = root / "sst2"
    sst.mkdir()
    good, bad = ["great", "fine", "moving", "funny"], ["dull", "bad", "boring", "flat"]
    rows = []
    for i in range(2200):
        pol = i % 2
        w = (good if pol else bad)[i % 4]
        rows.append(f"a {w} film , really {w} .\t{pol}")
    (sst / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:20]) + "\n")

    ag = root / "agnews"
    ag.mkdir()
    topics = ["vote", "match", "shares", "chip"]
    classes = ["World", "Sports", "Business", "Sci/Tech"]
    news = [f"the {topics[i % 4]} news {words_en[i % 12]} today\t{classes[i % 4]}" for i in range(1100)]
    (ag / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(news) + "\n")
    return root


@pytest.fixture(scope="module")
def tokenizers(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from train.data import load_multi30k
    from train.tokenizers import train_sentencepiece

    out = tmp_path_factory.mktemp("spm")
    tr = load_multi30k(data_dir, "train")
    train_sentencepiece(tr.src + tr.tgt, out / "multi30k.model", vocab_size=60)
    texts = (data_dir / "sst2" / "train.tsv").read_text().splitlines()[1:]
    train_sentencepiece([t.split("\t")[0] for t in texts], out / "sst2.model", vocab_size=40)
    return out


def digest_of_run(run_dir: Path) -> tuple[str, int]:
    state = torch.load(run_dir / "state.pt", map_location="cpu", weights_only=True)

    class Holder(torch.nn.Module):
        def __init__(self, sd: dict[str, torch.Tensor]) -> None:
            super().__init__()
            for k, v in sd.items():
                self.register_buffer(k.replace(".", "_"), v)

    return loop.weights_digest(Holder(state["model"])), int(state["step"])


def vision_args(data_dir: Path, out: Path, run: Path, *extra: str) -> list[str]:
    return ["--model", "vit", "--data-dir", str(data_dir), "--out", str(out), "--run-dir", str(run),
            "--train-limit", "96", "--batch-size", "16", "--epochs", "2", "--warmup-steps", "3",
            "--threads", "1", "--log-every", "1", *TINY_VIT, *extra]


def test_lr_schedule() -> None:
    cfg = loop.TrainConfig(lr=1.0, warmup_steps=10)
    f = [loop.lr_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # cosine decays monotonically
    assert f[-1] < 0.01
    assert loop.lr_factor(50, 100, cfg, time_progress=1.0) == pytest.approx(0.0)  # time budget used up
    inv = loop.TrainConfig(lr=1.0, warmup_steps=10, schedule="inverse_sqrt")
    assert loop.lr_factor(39, 100, inv) == pytest.approx(0.5)


def test_average_last_is_the_mean_of_the_kept_epochs(tmp_path: Path) -> None:
    for epoch, value in [(1, 100.0), (2, 1.0), (3, 2.0), (4, 6.0)]:
        loop.atomic_save({"model": {"w": torch.full((2, 3), value), "step": torch.tensor(epoch)}, "epoch": epoch},
                         tmp_path / f"epoch-{epoch}.pt")
    avg, epochs = loop.average_last(tmp_path, 3)
    assert epochs == [2, 3, 4]
    torch.testing.assert_close(avg["w"], torch.full((2, 3), 3.0))
    assert avg["step"].item() == 4  # integer buffers come from the last epoch, not averaged
    with pytest.raises(FileNotFoundError, match="keep-last"):
        loop.average_last(tmp_path / "empty", 2)


def test_prefer_average_ships_the_mean_only_when_validation_prefers_it(tmp_path: Path) -> None:
    class Target:  # validation score: how close the single weight is to `target`
        def __init__(self, target: float) -> None:
            self.target = target

        def validate(self, model: torch.nn.Module) -> dict[str, float]:
            score = -abs(float(model.w) - self.target)
            return {"score": score, "val_accuracy": score}

    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.tensor(0.0))
    for epoch, value in [(1, 1.0), (2, 3.0)]:
        loop.atomic_save({"model": {"w": torch.tensor(value)}, "epoch": epoch}, tmp_path / f"epoch-{epoch}.pt")
    best = {"w": torch.tensor(3.0)}
    info = {"epoch": 2, "score": -1.0, "metrics": {"score": -1.0}}
    state, chosen = loop.prefer_average(model, Target(2.0), tmp_path, 2, best, info)  # the mean, 2.0, is exact
    assert float(state["w"]) == 2.0 and chosen["epoch"] == "mean of [1, 2]" and chosen["score"] == 0.0
    state, chosen = loop.prefer_average(model, Target(3.0), tmp_path, 2, best, {**info, "score": 0.0})
    assert state is best and chosen["epoch"] == 2


def test_vision_average_last(data_dir: Path, tmp_path: Path) -> None:
    import models
    from train import vision

    run = tmp_path / "run"
    assert vision.main(vision_args(data_dir, tmp_path / "vit", run, "--keep-last", "2", "--average-last", "2")) == 0
    shipped = models.load(tmp_path / "vit").state_dict()
    mean, _ = loop.average_last(run, 2)
    best, _ = loop.load_best(run)
    record = json.loads((tmp_path / "vit" / "metrics.json").read_text())["training"]
    chosen = mean if str(record["shipped_epoch"]).startswith("mean of") else best
    assert record["shipped_epoch"] in (record["best_epoch"], "mean of [1, 2]")
    for name, t in shipped.items():  # fp16 storage: the shipped weights are the chosen ones rounded
        torch.testing.assert_close(t, chosen[name].half().float(), atol=0, rtol=0)


def test_distillation_loss() -> None:
    from train.classifier import ClassificationTask  # its loss is train.loop.distillation_loss, as train.vision's

    class Fixed(torch.nn.Module):
        def __init__(self, logits: torch.Tensor) -> None:
            super().__init__()
            self.logits = logits

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.logits

    logits = torch.tensor([[2.0, -1.0], [0.5, 0.3], [-1.0, 1.0]])
    labels = [0, 1, 1]
    ids = [[5, 6], [7], [8, 9, 10]]

    def loss(teacher, alpha):
        task = ClassificationTask(ids, labels, ids, labels, 100, 8, 0, torch.device("cpu"), teacher=teacher,
                                  alpha=alpha, temperature=2.0)
        return task.loss(Fixed(logits), [0, 1, 2], 0, 0.0).item()

    ce = torch.nn.functional.cross_entropy(logits, torch.tensor(labels)).item()
    assert loss(None, 0.5) == pytest.approx(ce)
    assert loss(logits.clone(), 1.0) == pytest.approx(0.0, abs=1e-6)  # the student already equals its teacher
    other = torch.tensor([[0.0, 3.0], [1.0, 0.0], [2.0, 2.0]])
    p, q = torch.softmax(other / 2, -1), torch.softmax(logits / 2, -1)
    kl = (p * (p.log() - q.log())).sum(-1).mean().item() * 4  # T² · KL(teacher ‖ student)
    assert loss(other, 0.25) == pytest.approx(0.25 * kl + 0.75 * ce, rel=1e-5)


def test_resume_continues_from_saved_step(data_dir: Path, tmp_path: Path) -> None:
    from train import vision

    full = tmp_path / "full"
    assert vision.main(vision_args(data_dir, tmp_path / "ck_full", full)) == 0
    full_digest, full_steps = digest_of_run(full)
    assert full_steps == 12  # 96 images / 16 per batch x 2 epochs

    part = tmp_path / "part"
    assert vision.main(vision_args(data_dir, tmp_path / "ck_part", part, "--stop-after", "8")) == 0
    assert not (tmp_path / "ck_part").exists()  # interrupted: no checkpoint folder yet
    _, step = digest_of_run(part)
    assert step == 8
    state = torch.load(part / "state.pt", map_location="cpu", weights_only=True)
    assert state["epoch"] == 1 and state["pos"] == 2 and state["optim"]["state"]  # mid-epoch, Adam moments kept
    log = (part / "train.log").read_text()
    assert "stopped after step 8" in log

    assert vision.main(vision_args(data_dir, tmp_path / "ck_part", part, "--resume")) == 0
    assert "resumed from" in (part / "train.log").read_text()
    resumed_digest, resumed_steps = digest_of_run(part)
    assert resumed_steps == 12
    assert resumed_digest == full_digest  # same data order, dropout RNG and optimiser state
    import models

    model = models.load(tmp_path / "ck_part")
    assert model.classify(np.zeros((28, 28), np.uint8)).attention["encoder"].weights.shape == (1, 2, 50, 50)
    metrics = json.loads((tmp_path / "ck_part" / "metrics.json").read_text())
    assert metrics["training"]["steps"] == 12


@pytest.mark.slow
def test_ddp_two_cpu_processes_end_with_identical_weights(data_dir: Path, tmp_path: Path) -> None:
    digest = tmp_path / "digest"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "train.vision", *vision_args(data_dir, tmp_path / "ck", tmp_path / "run", "--device", "cpu",
                                              "--dump-digest", str(digest), "--epochs", "1")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d0, d1 = (Path(f"{digest}.{r}").read_text() for r in (0, 1))
    assert d0 == d1
    # 96 images / 16 per batch = 6 global batches, 3 per process: DDP steps once per pair of batches
    _, step = digest_of_run(tmp_path / "run")
    assert step == 3
    assert "world 2" in (tmp_path / "run" / "train.log").read_text()


def test_translation_and_evaluate(data_dir: Path, tokenizers: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from train import evaluate, translation

    ck = tmp_path / "translator"
    args = ["--data-dir", str(data_dir), "--tokenizer", str(tokenizers / "multi30k.model"), "--out", str(ck),
            "--run-dir", str(tmp_path / "run"), "--epochs", "2", "--max-tokens", "200", "--d-model", "16",
            "--heads", "2", "--layers", "1", "--d-ff", "32", "--threads", "1", "--warmup-steps", "2",
            "--keep-last", "1", "--average-last", "2"]
    assert translation.main(args) == 0
    assert sorted(f.name for f in (tmp_path / "run").glob("epoch-*.pt")) == ["epoch-2.pt"]  # keeps the last 1
    capsys.readouterr()
    mt = data_dir / "multi30k"
    assert evaluate.main(["translation", "--checkpoint", str(ck), "--src", str(mt / "test_2016_flickr.en"),
                          "--ref", str(mt / "test_2016_flickr.de"), "--beam", "2", "--write-metrics"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert set(result) == {"bleu", "sentences"} and result["sentences"] == 10 and 0 <= result["bleu"] <= 100
    metrics = json.loads((ck / "metrics.json").read_text())
    entry = metrics["evaluations"]["test_2016_flickr.de"]
    assert entry["bleu"] == result["bleu"] and entry["command"].startswith("python -m train.evaluate translation")
    assert "training" in metrics  # written by the training command, kept by evaluate

    import models

    r = models.load(ck).translate("A man runs.", beam_size=2)
    assert r.attention["cross"].weights.shape[:2] == (1, 2)


def test_classifier_and_vision_evaluate(data_dir: Path, tokenizers: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from train import classifier, evaluate, vision

    ck = tmp_path / "sst2"
    assert classifier.main(["--task", "sst2", "--data-dir", str(data_dir), "--tokenizer",
                            str(tokenizers / "sst2.model"), "--out", str(ck), "--run-dir", str(tmp_path / "run"),
                            "--epochs", "1", "--train-limit", "64", "--d-model", "16", "--heads", "2",
                            "--layers", "1", "--d-ff", "32", "--threads", "1"]) == 0
    capsys.readouterr()
    assert evaluate.main(["classification", "--checkpoint", str(ck), "--tsv",
                          str(data_dir / "sst2" / "dev.tsv")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"accuracy", "examples"} and result["examples"] == 20 and 0 <= result["accuracy"] <= 1
    config = json.loads((ck / "config.json").read_text())
    assert config["text"]["lowercase"] is True and config["labels"] == ["negative", "positive"]

    # distillation from that checkpoint: the cached teacher logits are the teacher's own predictions
    student_run = tmp_path / "student_run"
    assert classifier.main(["--task", "sst2", "--data-dir", str(data_dir), "--tokenizer",
                            str(tokenizers / "sst2.model"), "--out", str(tmp_path / "student"), "--run-dir",
                            str(student_run), "--epochs", "1", "--train-limit", "64", "--d-model", "16",
                            "--heads", "2", "--layers", "1", "--d-ff", "32", "--threads", "1",
                            "--teacher", str(ck), "--distill-alpha", "0.7", "--augment", "2",
                            "--augment-min-words", "5"]) == 0
    capsys.readouterr()
    import models
    from train.data import load_text_task
    from train.text import augment_texts

    teacher = models.load(ck)
    soft = torch.load(student_run / "teacher_logits.pt", weights_only=True)
    texts = load_text_task(data_dir, "sst2")["train"].texts[:64]
    texts += augment_texts(texts, 2, seed=0, min_words=5)  # the perturbed copies follow the training texts
    assert soft.shape == (64 * 3, 2)
    for i in (0, 17, 63, 64, len(texts) - 1):  # batched and padded = one text alone
        np.testing.assert_allclose(torch.softmax(soft[i], -1).numpy(), teacher.classify(texts[i]).probs, atol=1e-5)
    record = json.loads((tmp_path / "student" / "metrics.json").read_text())["training"]
    assert record["distillation"] == {"teacher": str(ck), "alpha": 0.7, "temperature": 2.0, "augmented_texts": 128}
    with pytest.raises(SystemExit):  # perturbed texts have no labels without a teacher
        classifier.main(["--task", "sst2", "--out", str(tmp_path / "x"), "--run-dir", str(tmp_path / "x"),
                         "--augment", "2"])

    vck = tmp_path / "vit"
    assert vision.main(vision_args(data_dir, vck, tmp_path / "vrun", "--epochs", "1")) == 0
    capsys.readouterr()
    fm = data_dir / "fashion-mnist"
    assert evaluate.main(["vision", "--checkpoint", str(vck), "--images", str(fm / "t10k-images-idx3-ubyte"),
                          "--labels", str(fm / "t10k-labels-idx1-ubyte"), "--write-metrics"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["examples"] == 50
    assert json.loads((vck / "metrics.json").read_text())["evaluations"]["t10k-images-idx3-ubyte"]["accuracy"] \
        == result["accuracy"]


def test_vision_distillation_from_an_ensemble(data_dir: Path, tmp_path: Path) -> None:
    import models
    from train import vision
    from train.data import load_fashion

    teachers = [tmp_path / "t0", tmp_path / "t1"]
    for seed, ck in enumerate(teachers):
        assert vision.main(vision_args(data_dir, ck, tmp_path / f"r{seed}", "--epochs", "1", "--seed", str(seed))) == 0
    run = tmp_path / "student_run"
    assert vision.main(vision_args(data_dir, tmp_path / "student", run, "--epochs", "1", "--teacher",
                                   *map(str, teachers), "--distill-alpha", "0.7")) == 0
    # the cached targets: the teachers' mean probabilities over each image and its mirror image
    soft = torch.load(run / "teacher_logits.pt", weights_only=True)
    images = load_fashion(data_dir)["train"][0][:96]
    assert soft.shape == (96, 10)
    ms = [models.load(t) for t in teachers]
    for i in (0, 41, 95):
        views = (images[i], np.ascontiguousarray(images[i][:, ::-1]))
        probs = np.mean([m.classify(v).probs for m in ms for v in views], axis=0)
        np.testing.assert_allclose(soft[i].exp().numpy(), probs, atol=1e-5)
    record = json.loads((tmp_path / "student" / "metrics.json").read_text())["training"]
    assert record["distillation"] == {"teachers": [str(t) for t in teachers], "alpha": 0.7, "temperature": 2.0,
                                      "views": "image and mirror image"}


def test_vision_init_continues_from_a_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    import models
    from train import vision

    first = tmp_path / "vit"
    assert vision.main(vision_args(data_dir, first, tmp_path / "run1", "--epochs", "1")) == 0
    # lr 0: the continued model must be exactly the one it started from, config and all
    base = [a for a in vision_args(data_dir, tmp_path / "vit2", tmp_path / "run2", "--epochs", "1", "--lr", "0")
            if a not in TINY_VIT and a != "--set"]
    assert vision.main([*base, "--init", str(first)]) == 0
    a, b = models.load(first), models.load(tmp_path / "vit2")
    assert a.config == b.config
    for (n, ta), tb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(ta, tb), n
    record = json.loads((tmp_path / "vit2" / "metrics.json").read_text())["training"]
    first_record = json.loads((first / "metrics.json").read_text())["training"]
    assert record["init"] == {"checkpoint": "vit", "training": first_record}
    with pytest.raises(SystemExit, match="drop --set"):
        vision.main([*vision_args(data_dir, tmp_path / "x", tmp_path / "x"), "--init", str(first)])
    swin = [a if a != "vit" else "swin" for a in base]
    with pytest.raises(SystemExit, match="a ViT checkpoint"):
        vision.main([*swin, "--init", str(first)])


def test_grad_checkpointing_keeps_names_and_gradients() -> None:
    from models.families.vit import ViT, ViTConfig

    torch.manual_seed(0)
    a = ViT(ViTConfig(dim=16, depth=2, heads=2, mlp_dim=32, dropout=0.0))
    b = ViT(ViTConfig(dim=16, depth=2, heads=2, mlp_dim=32, dropout=0.0))
    b.load_state_dict(a.state_dict())
    assert loop.enable_grad_checkpointing(b) == 2
    assert list(a.state_dict()) == list(b.state_dict())
    x = torch.randn(3, 1, 28, 28)
    a(x).sum().backward()
    b(x).sum().backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), n


def test_train_lm_ships_a_decoder_and_its_record(data_dir: Path, tmp_path: Path) -> None:
    """python -m train.lm end to end on the tiny folder: a checkpoint that loads and generates, with qkv biases
    and plain keys, its last weights (selection fixed in advance), and the synthetic share it measured (never
    above the 10 % cap)."""
    import models
    from train import lm

    out, run = tmp_path / "lm", tmp_path / "run"
    argv = ["--data-dir", str(data_dir), "--out", str(out), "--run-dir", str(run), "--vocab", "60", "--context",
            "32", "--batch-size", "16", "--d-model", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--repeat-share", "0.02", "--train-limit", "64", "--epochs", "1", "--warmup-steps", "2", "--threads", "1"]
    assert lm.main(argv) == 0
    model = models.load(out)
    assert model.config.qkv_bias and model.blocks[0].attn.k_proj.bias.shape == (16,)
    assert model.generate("a man runs", max_new_tokens=3).steps
    record = json.loads((out / "metrics.json").read_text())["training"]
    assert record["command"] == "python -m train.lm " + " ".join(argv)
    assert record["selection"].startswith("the last weights (epoch 1")
    spans = record["data"]["synthetic_repeated_spans"]
    assert spans["rows"].startswith("1 rows of 32 tokens in every batch")  # rows no longer than the context
    shipped = spans["up_to_shipped_weights"]
    assert shipped["synthetic_tokens"] == shipped["steps"] * 32
    assert shipped["training_tokens"] == shipped["steps"] * (32 + 16 * 32)
    assert shipped["share_of_training_tokens"] == round(shipped["synthetic_tokens"] / shipped["training_tokens"], 4)
    for bad in (["--repeat-share", "0.2"], ["--repeat-share", "0.02", "--batch-size", "4"]):  # over 10 % refused
        with pytest.raises(SystemExit):
            lm.main([*argv, *bad])


def test_train_lm_resumed_with_other_flags_records_every_command(data_dir: Path, tmp_path: Path) -> None:
    """A run resumed with changed flags: the record's "commands" lists each command with the step it started
    from, "command" is the last one (checkpoints/rebuild.json replays them in order)."""
    from train import lm

    out, run = tmp_path / "lm", tmp_path / "run"
    base = ["--data-dir", str(data_dir), "--out", str(out), "--run-dir", str(run), "--vocab", "60", "--context",
            "32", "--batch-size", "16", "--d-model", "32", "--layers", "2", "--heads", "4", "--train-limit", "64",
            "--warmup-steps", "2", "--threads", "1"]
    first = [*base, "--repeat-share", "0.05", "--epochs", "1"]
    assert lm.main(first) == 0
    steps = json.loads((out / "metrics.json").read_text())["training"]["steps"]
    assert "commands" not in json.loads((out / "metrics.json").read_text())["training"]  # one command: no list
    second = [*base, "--repeat-share", "0", "--epochs", "2", "--resume"]
    assert lm.main(second) == 0
    record = json.loads((out / "metrics.json").read_text())["training"]
    assert record["commands"] == [{"command": "python -m train.lm " + " ".join(first), "from_step": 0},
                                  {"command": "python -m train.lm " + " ".join(second), "from_step": steps}]
    assert record["command"] == record["commands"][-1]["command"] and record["steps"] == 2 * steps


def test_train_lm_select_last_ships_the_final_weights_and_a_spent_budget_trains_no_further(
        data_dir: Path, tmp_path: Path) -> None:
    """--select last: the checkpoint holds the weights the run ended with (its resumable state), and the record
    says it is not the best validation epoch; a run resumed with its time budget used up takes no step."""
    from safetensors.torch import load_file

    from train import lm

    out, run = tmp_path / "lm", tmp_path / "run"
    argv = ["--data-dir", str(data_dir), "--out", str(out), "--run-dir", str(run), "--vocab", "60", "--context",
            "32", "--batch-size", "4", "--d-model", "32", "--layers", "2", "--heads", "4", "--repeat-share", "0",
            "--train-limit", "64", "--epochs", "3", "--log-every", "1", "--time-budget", "0.0001", "--threads", "1"]
    assert lm.main(argv) == 0
    first = json.loads((out / "metrics.json").read_text())["training"]
    assert first["steps"] < 3 * 36  # the budget (6 ms) ran out long before the three epochs
    assert lm.main([*argv, "--resume", "--select", "last"]) == 0
    record = json.loads((out / "metrics.json").read_text())["training"]
    assert record["steps"] == first["steps"] and record["history"] == first["history"]
    assert [h["epoch"] for h in record["history"]] == [1]  # stopped within the first epoch: last and best alike
    assert record["selection"] == f"the last weights (epoch 1, step {first['steps']}), also the best validation epoch"
    final = loop.load_state(run / "state.pt")["model"]
    shipped = {k: v.float() for k, v in load_file(next(out.glob("*.safetensors"))).items()}
    assert shipped.keys() <= final.keys() and shipped
    assert all(torch.allclose(shipped[k], final[k].float(), atol=1e-3) for k in shipped)
