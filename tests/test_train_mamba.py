"""train/mamba.py: Mamba's reference initialisation (step sizes log-uniform in [0.001, 0.1] through softplus, S4D-real
A, out_proj scaled) and the optimiser groups (A_log and D without weight decay); a training step through the scan
moves every parameter group the loss reaches."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.families.mamba import Mamba, MambaConfig
from train.loop import TrainConfig, make_optimizer
from train.mamba import DT_RANGE, init_mamba

CONFIG = MambaConfig(vocab_size=50, d_model=16, n_layers=3, d_state=4, expand=2, max_len=32)


def test_init_gives_mamba_step_sizes_and_state_matrix() -> None:
    torch.manual_seed(0)
    before = Mamba(CONFIG)
    out_before = [b.mixer.out_proj.weight.clone() for b in before.blocks]
    model = Mamba(CONFIG)
    model.load_state_dict(before.state_dict())
    init_mamba(model, seed=0)
    for block, w in zip(model.blocks, out_before, strict=True):
        m = block.mixer
        dt = F.softplus(m.dt_proj.bias.detach())  # Δ of a zero input: the bias alone
        assert DT_RANGE[0] * 0.999 <= float(dt.min()) and float(dt.max()) <= DT_RANGE[1] * 1.001
        assert float(dt.max()) / float(dt.min()) > 5  # spread over the range, not one value
        torch.testing.assert_close(-torch.exp(m.A_log), -torch.arange(1, 5.0).repeat(CONFIG.d_inner, 1))
        torch.testing.assert_close(m.out_proj.weight, w / math.sqrt(CONFIG.n_layers))
        assert float(m.dt_proj.weight.detach().abs().max()) <= CONFIG.rank ** -0.5
    assert abs(float(model.embed.weight.detach().std()) - 0.02) < 0.003


def test_a_log_and_d_take_no_weight_decay_and_a_step_trains() -> None:
    torch.manual_seed(0)
    model = Mamba(CONFIG)
    init_mamba(model)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1, lr=1e-2))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in decayed}
    assert not any(n.endswith(("A_log", ".D")) for n in names)
    assert any(n.endswith("in_proj.weight") for n in names) and any(n.endswith("x_proj.weight") for n in names)
    x = torch.randint(0, CONFIG.vocab_size, (2, 20))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = F.cross_entropy(model(x[:, :-1]).logits.reshape(-1, CONFIG.vocab_size), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {"blocks.0.mixer.A_log", "blocks.2.mixer.D", "blocks.1.mixer.dt_proj.bias", "embed.weight"} <= moved
