"""torchvision's ImageNet ViT-B/16 and Swin-T weights, mapped into ``models.families.vit.ViT`` and
``models.families.swin.Swin`` so they run with their attention returned.

The weights come through torchvision's own mechanism: the file named in the weights' URL, cached under
``torch.hub.get_dir()/checkpoints`` (``$TORCH_HOME/hub/checkpoints``). ``load_imagenet`` looks at that
cache first and never touches the network unless ``download=True``; then it downloads with a short
timeout, so an offline machine fails within seconds with a message that says what to do. The cached file
is read with ``torch.load(weights_only=True)`` (no pickle code runs).
"""

from __future__ import annotations

import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from models.families.swin import ShiftedWindowAttention, Swin, SwinConfig, relative_position_index
from models.families.vit import ViT, ViTConfig

if TYPE_CHECKING:
    from torchvision.models import WeightsEnum

ImageNetModel = Literal["vit_b_16", "swin_t"]
NAMES: tuple[str, ...] = ("vit_b_16", "swin_t")


class WeightsUnavailableError(RuntimeError):
    """The pretrained weights are neither cached nor downloadable right now."""


def vit_b_16_config() -> ViTConfig:
    """ViT-B/16 at 224×224 (Dosovitskiy et al. 2021, Table 1), as torchvision's ``vit_b_16``."""
    return ViTConfig(image_size=224, in_channels=3, patch=16, dim=768, depth=12, heads=12, mlp_dim=3072,
                     num_classes=1000, dropout=0.0, attention_dropout=0.0, norm_eps=1e-6, input="imagenet",
                     resize=256, interpolation="bilinear", prefix_tokens=1)  # torchvision's class_token alone


def swin_t_config() -> SwinConfig:
    """Swin-T (Liu et al. 2021, §3.3: C = 96, depths 2/2/6/2, patch 4, window 7), as torchvision's ``swin_t``."""
    return SwinConfig(image_size=224, in_channels=3, patch=4, embed_dim=96, depths=(2, 2, 6, 2),
                      heads=(3, 6, 12, 24), window=7, mlp_ratio=4.0, num_classes=1000, dropout=0.0,
                      attention_dropout=0.0, drop_path=0.2, norm_eps=1e-5, input="imagenet", resize=232,
                      interpolation="bicubic")


def _weights(name: str) -> WeightsEnum:
    """torchvision's IMAGENET1K_V1 weights entry (URL, categories, transforms) for ``name``."""
    from torchvision.models import Swin_T_Weights, ViT_B_16_Weights

    if name == "vit_b_16":
        return ViT_B_16_Weights.IMAGENET1K_V1
    if name == "swin_t":
        return Swin_T_Weights.IMAGENET1K_V1
    raise ValueError(f"unknown ImageNet model {name!r}; expected one of {NAMES}")


def imagenet_labels(name: ImageNetModel = "vit_b_16") -> list[str]:
    """The 1000 ImageNet class names from torchvision's weights metadata."""
    return list(_weights(name).meta["categories"])


# ----------------------------------------------------------------------------------- state-dict maps
def convert_vit(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """torchvision ``VisionTransformer`` state dict -> ``ViT`` state dict (fused in_proj split into q/k/v)."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        m = re.fullmatch(r"encoder\.layers\.encoder_layer_(\d+)\.(.+)", key)
        if m:
            i, rest = m.groups()
            prefix = f"blocks.{i}."
            if rest == "self_attention.in_proj_weight" or rest == "self_attention.in_proj_bias":
                kind = rest.rsplit("_", 1)[1]  # weight | bias
                q, k, v = value.chunk(3, dim=0)  # in_proj stacks W_q, W_k, W_v along the output dim
                out[prefix + f"attn.q_proj.{kind}"] = q.clone()  # own storage: safetensors refuses shared
                out[prefix + f"attn.k_proj.{kind}"] = k.clone()
                out[prefix + f"attn.v_proj.{kind}"] = v.clone()
                continue
            rest = rest.replace("self_attention.out_proj", "attn.out_proj")
            rest = rest.replace("mlp.linear_1", "mlp.0").replace("mlp.linear_2", "mlp.3")  # older file layout
            out[prefix + rest] = value
            continue
        renamed = {"class_token": "cls_token", "encoder.pos_embedding": "pos_embed",
                   "conv_proj.weight": "patch_embed.weight", "conv_proj.bias": "patch_embed.bias",
                   "encoder.ln.weight": "norm.weight", "encoder.ln.bias": "norm.bias",
                   "heads.head.weight": "head.weight", "heads.head.bias": "head.bias"}.get(key)
        if renamed is None:
            raise ValueError(f"unexpected key in the ViT state dict: {key}")
        out[renamed] = value
    return out


def convert_swin(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """torchvision ``SwinTransformer`` state dict -> ``Swin`` state dict.

    torchvision keeps everything in ``features``: index 0 is the patch embedding (conv, permute, norm),
    odd indices 2s+1 are the stages and even indices 2s+2 the patch mergings after stage s.
    """
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.endswith("relative_position_index"):
            continue  # derived from the window size; ours is a non-persistent buffer
        m = re.fullmatch(r"features\.(\d+)\.(.+)", key)
        if m is None:
            if not key.startswith(("norm.", "head.")):
                raise ValueError(f"unexpected key in the Swin state dict: {key}")
            out[key] = value
            continue
        index, rest = int(m.group(1)), m.group(2)
        if index == 0:
            module = {"0": "patch_embed", "2": "patch_norm"}[rest.split(".")[0]]
            out[f"{module}.{rest.split('.', 1)[1]}"] = value
        elif index % 2 == 1:
            out[f"stages.{(index - 1) // 2}.{rest}"] = value
        else:
            out[f"merges.{(index - 2) // 2}.{rest}"] = value
    return out


def vit_from_torchvision(state: dict[str, Tensor], config: ViTConfig | None = None,
                         labels: list[str] | None = None) -> ViT:
    """A ``ViT`` holding the weights of a torchvision ViT state dict (default config: ViT-B/16)."""
    return _build(ViT, config or vit_b_16_config(), labels, convert_vit(state))


def swin_from_torchvision(state: dict[str, Tensor], config: SwinConfig | None = None,
                          labels: list[str] | None = None) -> Swin:
    """A ``Swin`` holding the weights of a torchvision Swin state dict (default config: Swin-T)."""
    return _build(Swin, config or swin_t_config(), labels, convert_swin(state))


def _build(cls: type[ViT] | type[Swin], config: ViTConfig | SwinConfig, labels: list[str] | None,
           state: dict[str, Tensor]) -> ViT | Swin:
    """Construct on the meta device (no time spent initialising 86M parameters that are overwritten at
    once), then take the given tensors as the parameters (float32 tensors are used as they are, not
    copied: converting a live torchvision model's state dict shares its storage)."""
    with torch.device("meta"):
        model = cls(config, labels=labels)  # type: ignore[arg-type]
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    for m in model.modules():  # non-persistent buffers are not in the state dict: rebuild them
        if isinstance(m, ShiftedWindowAttention):
            m.relative_position_index = relative_position_index(m.window)
    return model.eval()


# -------------------------------------------------------------------------------------------- loading
def weights_path(name: ImageNetModel) -> Path:
    """Where torchvision caches the weights file: ``torch.hub.get_dir()/checkpoints/<file of the URL>``."""
    url = _weights(name).url
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def _download(url: str, dst: Path, timeout: float) -> None:
    """torch.hub's download (hash-prefix check, atomic rename) with a socket timeout, so an offline or
    stalled connection fails in ``timeout`` seconds instead of hanging."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout).close()  # quick reachability check
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise WeightsUnavailableError(f"Could not reach {url} within {timeout:.0f} s ({e}).") from e
    hash_prefix = re.search(r"-([a-f0-9]+)\.", dst.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)  # torch.hub's urlopen has no timeout argument; this bounds each read
    try:
        torch.hub.download_url_to_file(url, str(dst), hash_prefix.group(1) if hash_prefix else None, progress=True)
    except (urllib.error.URLError, OSError, TimeoutError, RuntimeError) as e:
        raise WeightsUnavailableError(f"Downloading {url} failed: {e}") from e
    finally:
        socket.setdefaulttimeout(previous)


def load_imagenet(name: ImageNetModel, download: bool = False, timeout: float = 5.0,
                  device: torch.device | str = "cpu") -> ViT | Swin:
    """The torchvision ImageNet weights of ``name`` ("vit_b_16" or "swin_t") in our model, eval mode.

    Uses the file in torchvision's cache; without it, downloads only when ``download`` is True (with
    ``timeout`` seconds per network operation). Raises ``WeightsUnavailableError`` with a clear message
    when the weights cannot be had.
    """
    weights = _weights(name)
    path = weights_path(name)
    if not path.is_file():
        if not download:
            raise WeightsUnavailableError(
                f"The ImageNet weights for {name} are not cached ({path} is missing) and downloading is off. "
                f"Run once online with download=True, or copy {weights.url} to that path."
            )
        _download(weights.url, path, timeout)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which one
        raise WeightsUnavailableError(f"The cached weights file {path} could not be read ({e}); delete it "
                                      "and download again.") from e
    labels = imagenet_labels(name)
    model: ViT | Swin
    if name == "vit_b_16":
        model = vit_from_torchvision(state, labels=labels)
    else:
        model = swin_from_torchvision(state, labels=labels)
    return model.to(device).eval()
