"""Controls that apply to the chosen model only (issue 61, item 9): what a tab shows follows what the model can do,
read from its registration (models/registry.py) and its config.json before it loads, and from the loaded model after
a run. The browser side is tests/e2e/test_controls.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from models import registry
from serving import catalogue, store
from tests.tiny_families import decoder_folder, mamba_folder


def _visible(update: dict) -> bool | None:
    return update.get("visible")


@pytest.fixture(scope="module")
def root(tiny_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    for name in ("gpt-tiny", "mamba-tiny"):
        shutil.copytree(tiny_checkpoints / name, root / name)
    mamba_folder(root / "my-mamba")
    decoder_folder(root / "my-mixtral", "mixtral")
    decoder_folder(root / "my-mistral", "mistral")
    return root


@pytest.fixture()
def generate(root: Path, monkeypatch):
    from tabs import generate

    monkeypatch.setattr(catalogue, "CHECKPOINTS", root)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue._decoder_checkpoints.cache_clear()
    yield generate
    catalogue._decoder_checkpoints.cache_clear()


def test_a_family_says_whether_a_config_counts_experts() -> None:
    """The registration's ``experts`` keys, read from a config.json (top level: Hugging Face; under "config": the
    project's checkpoints) or a loaded config; a family without the keys never has experts."""
    gpt, mamba = registry.FAMILIES["gpt"], registry.FAMILIES["mamba"]
    assert gpt.has_experts({"model_type": "mixtral", "num_local_experts": 8})
    assert gpt.has_experts({"model": "GPT", "config": {"n_experts": 4, "experts_per_token": 2}})
    assert not gpt.has_experts({"model_type": "mistral"}) and not gpt.has_experts({"config": {"n_experts": 0}})
    assert not gpt.has_experts({"num_local_experts": True})  # not a count
    from models.families.gpt import GPTConfig

    assert gpt.has_experts(GPTConfig(n_experts=4, experts_per_token=2)) and not gpt.has_experts(GPTConfig())
    assert mamba.experts == () and not mamba.has_experts({"num_local_experts": 8})


def test_generate_offers_what_each_model_can_do_before_it_loads(generate) -> None:
    """Choosing a model shows or hides the head choice, "Switch a head off", the head roles and the Experts view
    from its registration and config.json, with no model loaded."""
    offers = {name: generate.offered_for(name) for name in ("gpt-tiny", "mamba-tiny", "my-mamba", "my-mixtral",
                                                           "my-mistral", "state-spaces/mamba-130m-hf")}
    assert offers["gpt-tiny"] == {"heads": True, "experts": False}
    assert offers["mamba-tiny"] == offers["my-mamba"] == {"heads": False, "experts": False}
    assert offers["state-spaces/mamba-130m-hf"]["heads"] is False  # a Hub Mamba, known before its download
    assert offers["my-mixtral"] == {"heads": True, "experts": True}
    assert offers["my-mistral"] == {"heads": True, "experts": False}
    assert store.MODELS._models == {}  # read from the registrations and config.json: nothing loaded
    head, experts, ablation, roles = generate.model_controls("mamba-tiny")
    assert (_visible(head), _visible(experts), _visible(ablation), _visible(roles)) == (False, False, False, False)
    assert head["value"] == "mean"  # the one map of each layer
    head, experts, ablation, roles = generate.model_controls("my-mixtral")
    assert (_visible(head), _visible(experts), _visible(ablation), _visible(roles)) == (True, True, True, True)
    head, experts, ablation, roles = generate.model_controls("gpt-tiny")
    assert (_visible(head), _visible(experts), _visible(ablation), _visible(roles)) == (True, False, True, True)
    # a name the dropdown does not offer is never looked up: the default's controls
    assert generate.offered_for("../../etc") == generate.offered_for("gpt-tiny")


def test_after_a_run_the_loaded_model_decides(generate) -> None:
    """A model whose config was not at hand before (a Hub model) is asked after its first run: the run's last step
    reads the loaded model's registration and config."""
    for name, heads, experts in (("my-mamba", False, False), ("my-mixtral", True, True), ("gpt-tiny", True, False)):
        state = generate.generate("the cat sat", 3, name)[6]
        head, experts_u, ablation, roles = generate.run_controls(state)
        assert (_visible(head), _visible(experts_u), _visible(ablation), _visible(roles)) == (
            heads, experts, heads, heads), name
    assert all(u == {"__type__": "update"} for u in generate.run_controls(None))


def test_a_one_map_model_names_no_head(generate) -> None:
    """Mamba's implicit attention has one map per layer: its title names no "mean of heads" (nor a head 0)."""
    _t, _n, _h, _c, attn, *_ = generate.generate("the cat sat", 3, "mamba-tiny")
    title = attn.layout.title.text
    assert "Implicit attention" in title and "heads" not in title and "head 0" not in title


def test_mistral_and_gemma_notices_say_which_layers_are_local(root: Path, tmp_path: Path) -> None:
    """Every layer slides (Mistral): "every layer", no "other layers global"; some layers (Gemma 3's pattern): those
    layers, the others global; none: nothing said."""
    import models
    from models.families.gpt import notice

    every = notice(models.load(str(root / "my-mistral")))
    assert "Local attention on every layer" in every and "global" not in every and "window of 4 tokens" in every
    decoder_folder(tmp_path / "gemma", "gemma3_text")
    some = notice(models.load(str(tmp_path / "gemma")))
    assert "Local attention on layers 0, 2 (the other layers global)" in some and "every layer" not in some
    assert "Local attention" not in notice(models.load(str(root / "my-mixtral")))


def test_classify_hides_the_task_for_a_classifier_with_its_own_labels() -> None:
    """The SST-2 / AG News choice is for the project's own checkpoints; a configured or Hub classifier reads its own
    labels (the task is ignored for it), so the choice is hidden."""
    from tabs import classify

    for own in classify.TEXT_MODELS:
        assert classify.task_shown(own)["visible"] is True
    hub = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
    assert hub in catalogue.offered("classify") and classify.task_shown(hub)["visible"] is False


def test_a_model_view_thumbnail_opens_its_head() -> None:
    """The model view says where each thumbnail is (the page script turns a click into "layer,head"), and the
    handler shows that layer's head as a heatmap, the view the cells of which split; a gap's click changes nothing.
    Its colour bar reads 0–1, as the heatmaps' do."""
    from tabs.sections import why
    from viz import attention as va

    w = np.random.default_rng(0).dirichlet(np.ones(6), size=(3, 4, 6)).astype(np.float32)
    fig = va.model_view(w, [f"t{i}" for i in range(6)])
    q, k, gap = fig.data[0].meta["thumbnails"]
    z = np.asarray(fig.data[0].z)
    layer, head = 2, 3
    np.testing.assert_array_equal(z[layer * (q + gap): layer * (q + gap) + q, head * (k + gap): head * (k + gap) + k],
                                  np.rint(w[layer, head] * 100).astype(np.uint8))
    bar = fig.data[0].colorbar
    assert list(bar.ticktext) == ["0", "0.2", "0.4", "0.6", "0.8", "1"] and list(bar.tickvals)[-1] == fig.data[0].zmax
    assert "%" not in bar.title.text and "%" not in fig.data[0].hovertemplate.replace("%{", "")
    layer_u, head_u, view_u = why.open_head("2,3,7")
    assert (layer_u["value"], head_u["value"], view_u["value"]) == (2, "3", "heatmap")
    assert all(u == {"__type__": "update"} for u in why.open_head("gap"))


def test_swin_sliders_offer_the_grid_s_windows_only() -> None:
    """The window slider starts at the default grid's 4 windows (0 … 3, not 0 … 63), its range follows the grid and
    window, a link may name any window some grid has (its grid is set first), and a window index past the grid's
    (the API's) is said, not clamped silently."""
    import gradio as gr

    from tabs import swin

    with gr.Blocks() as demo:
        link = swin.build()
    sliders = {c.label: c for c in demo.blocks.values() if isinstance(c, gr.Slider)}
    assert sliders["window to inspect"].maximum == 3 and sliders["shift (window // 2 in Swin)"].maximum == 3
    assert link.fields["index"].read("200") == 200 and link.fields["shift"].read("7") == 7
    for bad in ("256", "-1", "2.5", "x"):
        with pytest.raises(ValueError):
            link.fields["index"].read(bad)
    assert swin.limits_of(8, 4) == (3, 3) and swin.limits_of(16, 1) == (0, 255) and swin.limits_of(9, 4) == (3, 8)
    shift_u, index_u = swin.window_limits(16, 2, 1, 40)
    assert (shift_u["maximum"], index_u["maximum"], index_u["value"]) == (1, 63, 40)
    *_figures, note = swin.swin_windows(8, 4, 2, 40)
    assert "There is no window 40" in note and "4 windows (0 … 3)" in note and "showing window 3" in note
    assert "no window" not in swin.swin_windows(8, 4, 2, 3)[-1]
