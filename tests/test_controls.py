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
    head, experts, ablation, roles, *_ = generate.model_controls("mamba-tiny")
    assert (_visible(head), _visible(experts), _visible(ablation), _visible(roles)) == (False, False, False, False)
    assert head["value"] == "mean"  # the one map of each layer
    head, experts, ablation, roles, *_ = generate.model_controls("my-mixtral")
    assert (_visible(head), _visible(experts), _visible(ablation), _visible(roles)) == (True, True, True, True)
    head, experts, ablation, roles, *_ = generate.model_controls("gpt-tiny")
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


def _ablation_sliders(update_layer: dict, update_head: dict) -> tuple:
    return update_layer.get("maximum"), update_head.get("maximum"), update_layer.get("interactive")


def test_switch_a_head_off_spans_the_chosen_model_before_it_runs(generate, root: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """"Switch a head off" had layer and head sliders of 0 … 1 until a first run set them: a model of 4 heads offered
    heads 0 and 1 only. Choosing a model (and the page, for its first model) sets them from its config.json with
    nothing loaded; a model whose shape is known only once it loads (a GGUF file) keeps them still, saying so, until
    then. The reference is the loaded model's own config."""
    import gradio as gr

    from tests.gguf_files import write_model

    gguf, _ = write_model(tmp_path / "gguf", "qwen2")  # 5 layers of 8 heads, read from the file only when it loads
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    catalogue.configure([str(gguf)])
    shown = {}
    for name in ("gpt-tiny", "my-mixtral", "my-mistral", "model.gguf"):
        *_, layer_u, head_u = generate.model_controls(name)
        shown[name] = layer_u, head_u
    assert store.MODELS._models == {}  # from config.json: nothing loaded
    for name in ("gpt-tiny", "my-mixtral", "my-mistral"):
        c = store.MODELS.get(name).config
        layer_u, head_u = shown[name]
        assert (layer_u["maximum"], layer_u["value"], head_u["maximum"], head_u["value"]) == (
            c.n_layers - 1, c.n_layers - 1, c.n_heads - 1, 0), name
        assert layer_u["interactive"] and head_u["interactive"]
    assert shown["my-mixtral"][1]["maximum"] != 1  # not the 0 … 1 placeholder
    layer_u, head_u = shown["model.gguf"]
    assert layer_u["interactive"] is False and "once the model has run" in layer_u["info"] and "maximum" not in layer_u
    net = store.MODELS.get("model.gguf")  # loaded (by a run): its own shape
    *_, layer_u, head_u = generate.model_controls("model.gguf")
    assert (layer_u["maximum"], head_u["maximum"]) == (net.config.n_layers - 1, net.config.n_heads - 1) == (4, 7)
    # the page opens with the first model's range: the tiny gpt-tiny's 4 heads, not 0 … 1
    with gr.Blocks() as demo:
        generate.build()
    model = next(b for b in demo.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "model")
    changed = next(fn for fn in demo.fns.values() if (model._id, "change") in list(fn.targets)
                   and any(getattr(o, "label", "") == "layer of the head" for o in fn.outputs))
    layer_s, head_s = changed.outputs[-2:]  # another model chosen: the sliders follow
    assert (layer_s.label, head_s.label) == ("layer of the head", "head")
    c = store.MODELS.get("gpt-tiny").config
    assert layer_s.maximum == c.n_layers - 1 and head_s.maximum == c.n_heads - 1 == 3


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


# ------------------------------------------------------------------------------ issue 61, item 10: the words on screen
def test_a_figure_shown_before_predicting_is_said_to_be_below(tiny_checkpoints: Path, monkeypatch) -> None:
    """The figure a step shows before the prediction is laid out under the question (tabs/lessons.py: prompt, then
    ``before``), so the question never points "above" to it (lessons 4·1, 4·2 and 7·1 did), and lesson 1·1 says
    its scores are drawn below."""
    import re

    from tabs import lessons

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    above = re.compile(r"\b(figure|maps?|chart|image|drawn)\s+above\b")
    with_figures = 0
    for number, lesson in enumerate(lessons.LESSONS, 1):
        for step in range(1, len(lesson.steps) + 1):
            q = lessons.question(number, step, "")
            if q.before is not None:
                with_figures += 1
                assert not above.search(q.text), (number, step, q.text)
    assert with_figures >= 4
    assert "drawn below" in lessons.question(1, 1, "").text


def test_the_vision_intro_names_the_image_a_click_reads() -> None:
    """The clickable image is under the figures (left of the clicked patch's attention at 1400 px, stacked on a
    phone): the intro names it by its label, not by a side."""
    from tabs import vision

    assert "on the right" not in vision.INTRO and "*what the model saw*" in vision.INTRO


def test_check_before_the_lesson_starts_says_to_start_it() -> None:
    import gradio as gr

    from tabs import lessons

    title = lessons.LESSONS[0].title
    with pytest.raises(gr.Error, match="Start the lesson first"):
        lessons.answer_step(title, 1, "", None, {}, "")  # nothing asked yet
    with pytest.raises(gr.Error, match="Pick a prediction first"):
        lessons.answer_step(title, 1, "", None, {}, lessons.question(1, 1, "").text)


def test_head_statistics_titles_fit_a_narrow_column() -> None:
    """A long title is cut where the figure is narrow (Plotly does not wrap titles): the head statistics keep a
    short title, the attention kind (and a paragraph's sentence) under it, and take their column's width."""
    from models.outputs import AttentionMap
    from tabs.common import stats_figure

    rng = np.random.default_rng(0)
    kind = "Sentence 2 of 5 · Cross-attention (target → source)"
    cross = AttentionMap(rng.dirichlet(np.ones(5), size=(3, 4, 7)).astype(np.float32), [f"q{i}" for i in range(7)],
                         [f"k{i}" for i in range(5)])
    self_ = AttentionMap(rng.dirichlet(np.ones(7), size=(3, 4, 7)).astype(np.float32), [f"t{i}" for i in range(7)],
                         [f"t{i}" for i in range(7)])
    for amap, short in ((cross, "Entropy per head"), (self_, "Where each head looks")):
        fig = stats_figure(amap, kind)
        title = fig.layout.title.text
        assert title.split("<br>")[0] == short and kind in title, title
        assert fig.layout.width is None


def test_compare_draws_b_and_b_minus_a_each_the_page_s_width() -> None:
    """B's map and B − A stand one under the other (side by side, each had half the page: a 41-token map's cells
    shrank to a few pixels)."""
    import gradio as gr

    from tabs.sections import compare

    with gr.Blocks() as demo:
        state = gr.State()
        layer, head, view = gr.Slider(), gr.Dropdown(["mean"]), gr.Radio(["heatmap"])
        compare.comparison("generate", state, lambda s: s, lambda *a: None, [], layer, head, view)
    plots = [c for c in demo.blocks.values() if isinstance(c, gr.Plot) and str(c.label).startswith(("B,", "B −"))]
    assert len(plots) == 2
    assert not any(isinstance(getattr(p, "parent", None), gr.Row) for p in plots)


def test_the_readme_names_no_lesson_range_the_course_does_not_have() -> None:
    """The API section said "lesson 1–8" when there were nine: any range of lessons it names ends at the last one."""
    import re

    from tabs import lessons

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    api = readme[readme.index("client.predict("):]
    api = api[: api.index("```")]
    for low, high in re.findall(r"lessons? (\d+)\s*[–-]\s*(\d+)", api):
        assert int(high) == len(lessons.LESSONS), (low, high)
    assert "/lesson" in api


class _Tok:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("▁", " ").strip()


class _Net:
    def __init__(self, pieces: list[str], probs: dict[int, float] | None = None) -> None:
        self.tokenizer = _Tok(pieces)
        self.pieces = pieces
        self.probs = probs or {}
        self.asked: list[list[int]] = []

    def piece(self, i: int) -> str:
        return self.pieces[i]

    def next_token_probs(self, ids: list[int]) -> np.ndarray:
        self.asked.append(list(ids))
        p = np.zeros(len(self.pieces), np.float32)
        for i, v in self.probs.items():
            p[i] = v
        return p


def test_the_repeat_notice_reads_the_prompt_s_own_copy() -> None:
    """Constructed ids: a prompt that ends by repeating an earlier span (4+ tokens) whose next token the model did not
    write gets the notice, naming the phrase, the expected and written tokens, the model's probability of the copy
    after the prompt and the words split into pieces; a copied one, a short repeat and an unrepeated prompt get none."""
    from models.outputs import GenerationResult, GenerationStep
    from tabs.generate import repeat_notice

    pieces = ["<s>", "▁The", "▁red", "▁f", "ox", "▁jumped", "▁over", "▁the", "▁fence", "▁.", "▁water", "▁cat"]
    net = _Net(pieces, {8: 0.125, 10: 0.6})

    def result(prompt: list[int], wrote: int) -> GenerationResult:
        step = GenerationStep([pieces[wrote]], np.array([0.6], np.float32), pieces[wrote], 0.6)
        return GenerationResult("", [pieces[i] for i in prompt + [wrote]], prompt + [wrote], len(prompt), {}, [step])

    copy = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7]  # "The red fox jumped over the fence . The … the"
    said = repeat_notice(result(copy, 10), net, "gpt-tiny")
    assert "“The red fox jumped over the”" in said and "where “fence” came next" in said
    assert "wrote “water” (it gave “fence” 12.5%)" in said and net.asked == [copy]
    assert "splits “f · ox” into pieces" in said  # "jumped" is one piece here: not named
    assert repeat_notice(result(copy, 8), net, "gpt-tiny") == ""  # copied
    short = [0, 1, 2, 3, 8, 9, 11, 1, 2, 3]  # only 3 tokens repeated
    assert repeat_notice(result(short, 10), net, "gpt-tiny") == ""
    assert repeat_notice(result([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11], 10), net, "gpt-tiny") == ""


def test_gpt_tiny_copies_the_offered_phrase_and_says_why_not_another() -> None:
    """The shipped gpt-tiny: the example phrase it is offered is copied; "The red fox jumped over the fence" is not
    (it writes "water" where "fence" came, a phrase it splits into pieces), and the notice says so."""
    from tabs import generate

    offered = next(p for p in generate.PROMPTS if p.count("Two dogs play in the") == 2)
    text, notice, *_ = generate.generate(offered, 3, "gpt-tiny")
    assert text.split()[0].startswith("snow") and "repeating" not in notice
    text, notice, *_ = generate.generate("The red fox jumped over the fence . The red fox jumped over the", 3,
                                         "gpt-tiny")
    assert not text.startswith("fence")
    assert "repeating “The red fox jumped over the”" in notice and "where “fence” came next" in notice
    assert "“f · ox”" in notice


def test_a_late_model_choice_event_keeps_the_answer_of_that_same_choice(tiny_checkpoints: Path, monkeypatch) -> None:
    """A model's .input event (which takes the figures down) can run after a Classify clicked just after it, on a
    busy server (the e2e test of configured models saw its figures vanish): the state it reads is then that very
    choice's answer, which stays; a state from another choice is cleared, as before."""
    import gradio as gr

    from tabs import classify, common, vision

    monkeypatch.setattr(catalogue, "CHECKPOINTS", tiny_checkpoints)
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    kept = classify.classify("a warm , funny film .")[5]
    same = classify.model_changed("SST-2 sentiment", "trained from scratch", kept)
    assert len(same) == 8 and all(u == gr.skip() for u in same)
    other = classify.model_changed("AG News topic", "trained from scratch", kept)
    assert other[5] is None and "AG News topic chosen" in other[0]
    assert classify.model_changed("SST-2 sentiment", "no such model", kept)[5] is None  # refused name: cleared
    assert classify.model_changed("SST-2 sentiment", "trained from scratch", None)[5] is None

    image = vision.classify_image(common.EXAMPLE_IMAGES[0], "vit-fashion")[7]
    assert all(u == gr.skip() for u in vision.model_changed("vit-fashion", image))
    cleared = vision.model_changed("swin-fashion", image)
    assert cleared[7] is None and "swin-fashion chosen" in cleared[6]
