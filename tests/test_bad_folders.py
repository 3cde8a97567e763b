"""Hugging Face folders that cannot be read are refused by name (models.load), and the app's store says so for that
model while every other model keeps loading: a missing tensor, a tensor of the wrong shape, an unknown model_type,
and a repository with only pickled .bin weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import models
from models.io.checkpoint import CheckpointError
from tests.families import classifier_folder, marian_folder, t5_folder

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("good")
    classifier_folder("roberta", base / "roberta")
    marian_folder(base / "marian")
    t5_folder(base / "t5")
    return {"roberta": base / "roberta", "marian": base / "marian", "t5": base / "t5"}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("spm"))
    return dst


def _edit_weights(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("family, tensor", [("roberta", "roberta.encoder.layer.2.attention.self.key.weight"),
                                            ("marian", "model.decoder.layers.1.encoder_attn.v_proj.bias"),
                                            ("t5", "decoder.block.1.layer.1.EncDecAttention.v.weight")])
def test_a_missing_tensor_is_named(good, tmp_path: Path, family: str, tensor: str) -> None:
    folder = _copy(good[family], tmp_path / "f")
    _edit_weights(folder, lambda s: s.pop(tensor))
    name = tensor.removeprefix("roberta.").removeprefix("model.")
    with pytest.raises(CheckpointError, match=rf"model\.safetensors.*{name}"):
        models.load(str(folder))


@pytest.mark.parametrize("family, tensor", [("roberta", "roberta.encoder.layer.1.intermediate.dense.weight"),
                                            ("marian", "model.encoder.layers.0.fc1.weight"),
                                            ("t5", "encoder.block.2.layer.1.DenseReluDense.wi_1.weight")])
def test_a_wrong_shape_is_named(good, tmp_path: Path, family: str, tensor: str) -> None:
    folder = _copy(good[family], tmp_path / "f")
    _edit_weights(folder, lambda s: s.__setitem__(tensor, s[tensor][:-1].clone()))
    with pytest.raises(CheckpointError, match=r"shape \(51, 36\).*\(52, 36\)"):
        models.load(str(folder))


def test_an_unknown_model_type_is_named(good, tmp_path: Path) -> None:
    folder = _copy(good["roberta"], tmp_path / "f")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "reformer"}))
    with pytest.raises(CheckpointError, match=r"model_type .reformer. is not supported.*marian.*roberta"):
        models.load(str(folder))


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_a_pickle_only_repository_is_refused(good, tmp_path: Path, family: str) -> None:
    folder = _copy(good[family], tmp_path / "f")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not read")  # never opened: pickles are not loaded
    with pytest.raises(CheckpointError, match=r"only pytorch_model\.bin \(pickle, refused\)"):
        models.load(str(folder))


def test_the_store_refuses_a_bad_folder_and_serves_the_rest(good, tmp_path: Path, monkeypatch) -> None:
    from serving import catalogue
    from serving.errors import ModelUnavailable
    from serving.store import ModelStore

    broken = _copy(good["roberta"], tmp_path / "broken")
    (broken / "model.safetensors").unlink()
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    catalogue.configure([str(broken), str(good["marian"])])
    assert catalogue.configured("classify") == ["broken"] and catalogue.configured("translate") == ["marian"]
    store = ModelStore()
    with pytest.raises(ModelUnavailable, match=r"`broken`.*no model\.safetensors.*other models keep working"):
        store.get("broken")
    assert store.get("marian").config.family == "marian"  # the other configured model still loads


# ------------------------------------------------------------------ issue 61, item 8: the folder's own names
def test_every_good_folder_passes_the_start_up_check(hf_folders) -> None:
    """check_folder runs each family's reader on the safetensors headers (meta tensors, no weight read): every
    registered folder of tests/parity_folders.py passes, so the start-up check refuses nothing that loads."""
    from models.io.hf import check_folder
    from tests.parity_folders import CASES

    unchecked = [case.name for case in CASES if not check_folder(hf_folders.get(case.name).path)]
    assert unchecked == ["t5"]  # its reader reads a value (the tied head's scale): only the load can tell


def _broken_bert(hf_folders, tmp_path: Path) -> Path:
    folder = _copy(hf_folders.get("bert").path, tmp_path / "broken-bert")
    _edit_weights(folder, lambda s: s.pop("bert.encoder.layer.1.attention.self.query.weight"))
    return folder


def test_a_missing_bert_tensor_is_named_as_the_folder_names_it(hf_folders, tmp_path: Path) -> None:
    """A BERT folder without one tensor: the message names model.safetensors and the folder's own key, never the
    app's internal tensor (it said "config.json: ... missing ['bert.layers.1.self_attn.q_proj.weight']"); so does the
    start-up check, and a wrong shape is named the same way."""
    from models.io.hf import check_folder

    folder = _broken_bert(hf_folders, tmp_path)
    for attempt in (lambda: models.load(str(folder)), lambda: check_folder(folder)):
        with pytest.raises(CheckpointError) as err:
            attempt()
        said = str(err.value)
        assert said.startswith("model.safetensors") and "bert.encoder.layer.1.attention.self.query.weight" in said
        assert "self_attn" not in said and "q_proj" not in said
    shaped = _copy(hf_folders.get("bert").path, tmp_path / "shaped")
    _edit_weights(shaped, lambda s: s.__setitem__("bert.encoder.layer.0.intermediate.dense.weight",
                                                  s["bert.encoder.layer.0.intermediate.dense.weight"][:-1].clone()))
    for attempt in (lambda: models.load(str(shaped)), lambda: check_folder(shaped)):
        with pytest.raises(CheckpointError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight has shape"):
            attempt()


def _page_notice() -> str:
    """The text the app's one page-load event (tabs/permalink.wire's restore) puts into the page's notice."""
    import app

    demo = app.build_demo()
    load = next(fn for fn in demo.fns.values() if any(k == "load" for _, k in fn.targets))
    values = load.fn(None)  # a page opened without a query
    return next(v["value"] for v in values if isinstance(v, dict) and isinstance(v.get("value"), str))


def test_a_broken_folder_is_refused_at_start_up(hf_folders, tmp_path: Path, monkeypatch) -> None:
    """After start-up's check (tabs/startup.warm_stack) a broken configured folder is refused like the entries that
    configure refuses: the page's notice at load (tabs/permalink.py's restore) and the Classify tab's notice name the
    missing tensor in the folder's own names, the store answers at once without loading it, and the good folder beside
    it loads."""
    from serving import catalogue
    from serving.errors import ModelUnavailable
    from serving.store import ModelStore
    from tabs import startup

    broken = _broken_bert(hf_folders, tmp_path)
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(catalogue, "CHECK_PROBLEMS", [])
    catalogue.configure([str(broken), str(hf_folders.get("bert").path)])
    assert catalogue.configuration_notice("classify") == ""
    assert startup.warm_stack() == []  # imports the stack, then checks the configured folders
    for notice in (catalogue.configuration_notice("classify"), _page_notice()):
        assert "`broken-bert`" in notice and "bert.encoder.layer.1.attention.self.query.weight" in notice
    store = ModelStore()
    monkeypatch.setattr(store, "_models", {})
    with pytest.raises(ModelUnavailable, match=r"`broken-bert`.*bert\.encoder\.layer\.1\.attention\.self\.query"):
        store.get("broken-bert")
    assert store.get("bert").config.pooling == "pooler"


@pytest.mark.parametrize("tab_name, run_label", [("classify", "Classify"), ("vision", "Classify image")])
def test_choosing_another_model_takes_the_old_figures_down(tab_name: str, run_label: str) -> None:
    """Issue 61, item 8: the previous model's verdict and figures stayed on screen under a broken model that had been
    chosen. Choosing a model (a person's input) empties every figure and the kept result of the tab and says which
    model is chosen, so no answer stays under another model's name."""
    import importlib

    import gradio as gr

    tab = importlib.import_module(f"tabs.{tab_name}")
    with gr.Blocks() as demo:
        tab.build()
    model = next(b for b in demo.blocks.values() if isinstance(b, gr.Radio) and b.label == "model")
    plots = [b for b in demo.blocks.values() if isinstance(b, gr.Plot)]
    states = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    clearing = [fn for fn in demo.fns.values() if (model._id, "input") in list(fn.targets)
                and sum(o in plots for o in fn.outputs) >= 4]
    assert len(clearing) == 1
    fn = clearing[0]
    kept_before = {"model": "an earlier model", "result": None}  # the state the event reads when it runs
    values = fn.fn(*(["SST-2 sentiment"] if len(fn.inputs) == 3 else []), "broken-one", kept_before)
    shown = {o: v for o, v in zip(fn.outputs, values, strict=True)}
    assert all(shown[o] is None for o in fn.outputs if o in plots or o in states)
    assert any(isinstance(v, str) and "broken-one" in v and run_label in v for v in values)
    kept = next(o for o in fn.outputs if o in states)
    assert shown[kept] is None


def test_a_folder_refused_at_start_up_is_left_out_of_the_model_choices(hf_folders, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """A configured folder that the start-up check refused stayed a model choice in every tab that lists configured
    folders (Classify, Generate, Heads' two), and picking it gave the error at once. The page is built before the
    check (app.main), so the one page-load event leaves the refused folders out of every such choice, the good ones
    kept; a link cannot name one; the notice still says why; a page built after the check never lists them; and a
    request that names one (the API) still gets the reason."""
    from types import SimpleNamespace

    import gradio as gr

    import app
    from serving import catalogue, store
    from tabs import generate, startup

    broken = _broken_bert(hf_folders, tmp_path)
    decoder = _copy(hf_folders.get("gpt2").path, tmp_path / "broken-gpt2")
    _edit_weights(decoder, lambda s: s.pop(next(k for k in s if k.endswith("h.1.attn.c_attn.weight"))))
    monkeypatch.setattr(catalogue, "CONFIGURED", {})
    monkeypatch.setattr(catalogue, "CONFIG_PROBLEMS", [])
    monkeypatch.setattr(catalogue, "CHECK_PROBLEMS", [])
    monkeypatch.setattr(store, "MODELS", store.ModelStore())
    catalogue.configure([str(broken), str(hf_folders.get("bert").path), str(decoder)])
    refused = {"broken-bert", "broken-gpt2"}

    def model_choices(demo) -> dict:  # every model choice of the page that lists a configured folder
        return {b: [v for _, v in b.choices] for b in demo.blocks.values() if isinstance(b, (gr.Radio, gr.Dropdown))
                and "model" in str(b.label) and {v for _, v in b.choices} & {"bert", *refused}}

    demo = app.build_demo()  # as app.main builds it: before the check
    listed = model_choices(demo)
    assert sorted(b.label for b in listed) == ["model", "model", "model", "other model"]  # Classify, Generate, Heads
    assert all("broken-bert" in names or "broken-gpt2" in names for names in listed.values())
    assert startup.warm_stack() == []  # imports the stack, then checks the configured folders: both refused
    load = next(fn for fn in demo.fns.values() if any(k == "load" for _, k in fn.targets))

    def opened(query: dict) -> dict:
        values = load.fn(SimpleNamespace(query_params=query))
        return dict(zip(load.outputs, values, strict=True))

    def notice(shown: dict) -> str:
        return next(v["value"] for v in shown.values() if isinstance(v, dict) and isinstance(v.get("value"), str))

    shown = opened({})
    for control, names in listed.items():
        kept = [v for _, v in shown[control]["choices"]]
        assert kept == [n for n in names if n not in refused] and control.value in kept, control.label
    assert "bert" in [v for _, v in shown[next(b for b in listed if b.label == "model" and "bert" in listed[b])][
        "choices"]]  # the good folder stays
    said = notice(shown)
    assert "`broken-bert`" in said and "`broken-gpt2`" in said and "h.1.attn.c_attn.weight" in said
    linked = opened({"tab": "generate", "model": "broken-gpt2"})  # a link cannot pick it
    assert "`model` is not allowed here" in notice(linked)
    picker = next(b for b in listed if "gpt-tiny" in listed[b] and "sst2" not in listed[b] and b.label == "model")
    assert "value" not in linked[picker] and "broken-gpt2" not in [v for _, v in linked[picker]["choices"]]
    with pytest.raises(gr.Error, match=r"broken-gpt2.*cannot be loaded.*h\.1\.attn\.c_attn\.weight"):
        generate.generate("a cat", 2, "broken-gpt2")  # the API: the reason, at once
    assert not refused & {n for names in model_choices(app.build_demo()).values() for n in names}  # built after
