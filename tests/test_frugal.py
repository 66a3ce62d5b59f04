"""attnviz.capture.frugal: MLPs run over blocks of positions give transformers' own outputs, the model is left as it was
(also after an error, and for other threads meanwhile), the slimmed tokenizer tokenizes as before, and the blocked
MLP's peak memory is a fraction of the whole one's."""

import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch

from attnviz.capture import frugal
from attnviz.capture import capture_attention
from attnviz.capture import decoder_layers
from attnviz.models import LoadedModel, ModelSpec, shape_of
from tests.families import _configs

ROWS = 16  # positions per block in these tests (tiny models would otherwise never be long enough to block)
N = 100  # tokens: six whole blocks and a partial one
# families whose decoder layers' MLP takes the hidden states alone and returns one tensor: run in blocks
BLOCKED = ("llama", "gemma3_text", "qwen2", "gpt_neox", "gpt2", "falcon", "deepseek_v3")
# an MLP that returns (output, router scores) and one that takes the residual too: run whole, unchanged
WHOLE = ("gpt_oss", "bloom")


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(frugal, "MIN_ROWS", ROWS)
    monkeypatch.setattr(frugal, "BLOCK_BYTES", 1)


def _model(name: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_configs()[name][1], attn_implementation="eager",
                                             dtype=torch.float32).eval()
    return model


def _ids(n: int = N) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(1))


def _count_blocks(model) -> list[int]:
    """A counter of calls to each MLP's first linear layer (once per block when blocked, once per layer if not)."""
    calls = [0]
    for mlp in frugal.position_wise_modules(model):
        first = next(m for m in mlp.modules() if hasattr(m, "weight") and m.weight.dim() == 2)
        first.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("name", BLOCKED + WHOLE)
def test_blocked_forward_equals_transformers_own(small_blocks, name):
    model = _model(name)
    ids = _ids()
    with torch.no_grad():
        own = model(input_ids=ids).logits
        calls = _count_blocks(model)
        with frugal.lean_forward(model):
            lean = model(input_ids=ids).logits
    layers = len(decoder_layers(model))
    if name in BLOCKED:
        # every layer's MLP ran block by block (DeepSeek's routed layer calls its first expert once more per block)
        assert calls[0] >= layers * math.ceil(N / ROWS)
    torch.testing.assert_close(lean, own, rtol=1e-5, atol=1e-5)


def test_the_model_is_left_as_it_was_also_after_an_error(small_blocks):
    model = _model("gemma3_text")
    ids = _ids()
    mlps, layers = frugal.position_wise_modules(model), decoder_layers(model)
    assert len(mlps) == len(layers) == 2
    hooks_before = [dict(layer._forward_hooks) for layer in layers]
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with pytest.raises(RuntimeError, match="inside"):
            with frugal.lean_forward(model):
                assert all("forward" in vars(m) for m in mlps)
                raise RuntimeError("an error inside")
        assert not any("forward" in vars(m) for m in mlps)
        assert [dict(layer._forward_hooks) for layer in layers] == hooks_before
        calls = _count_blocks(model)
        after = model(input_ids=ids).logits
    assert calls[0] == 2  # one call per MLP: no block left behind
    assert torch.equal(after, before)


def test_other_threads_run_the_model_whole_meanwhile(small_blocks):
    model = _model("llama")
    ids = _ids()
    calls = _count_blocks(model)
    inside, done = threading.Event(), threading.Event()

    def lean_user():
        with frugal.lean_forward(model):
            inside.set()
            done.wait(30)

    user = threading.Thread(target=lean_user)
    user.start()
    try:
        assert inside.wait(30)
        with torch.no_grad():
            model(input_ids=ids)
        assert calls[0] == 2  # this thread is outside lean_forward: each MLP once
    finally:
        done.set()
        user.join(30)
    assert not any("forward" in vars(m) for m in frugal.position_wise_modules(model))


def test_a_capture_runs_its_mlps_in_blocks_and_equals_output_attentions(small_blocks):
    from attnviz.tokenizer import byte_tokenizer

    model = _model("gemma3_text")
    spec = ModelSpec("tiny-gemma3", "gemma3_text", "object", True, None, "test")
    from attnviz.capture import prepare_model

    prepare_model(model)
    loaded = LoadedModel(model=model, tokenizer=byte_tokenizer(), spec=spec, shape=shape_of(model, spec))
    text = "The quick brown fox jumps over the lazy dog; " * 3
    ids = torch.tensor([loaded.tokenizer(text).input_ids])
    assert ids.shape[1] > 4 * ROWS
    with torch.no_grad():
        model.config._attn_implementation = "eager"
        try:
            own = model(input_ids=ids, output_attentions=True).attentions
        finally:
            prepare_model(model)
    calls = _count_blocks(model)
    capture = capture_attention(loaded, text, store="pattern")
    # layer 0's MLP in blocks; the pass stops after the last layer's attention, so layer 1's MLP never runs
    assert calls[0] == math.ceil(ids.shape[1] / ROWS)
    for i, layer in enumerate(own):
        torch.testing.assert_close(torch.tensor(capture.pattern[i]), layer[0], rtol=1e-5, atol=1e-6)


def test_block_rows_follow_the_widest_activation():
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 2048, device="meta"), torch.nn.Linear(2048, 64, device="meta"))
    assert frugal.block_rows(mlp) == frugal.BLOCK_BYTES // (4 * 2048) == 1536
    assert frugal.block_rows(torch.nn.Linear(64, 2**20, device="meta")) == frugal.MIN_ROWS


@pytest.mark.parametrize("heap_bytes, free, check_tokens, releases", [
    (1, 0, N, 2 + 1),  # hidden states over HEAP_BYTES: after each of the 2 layers, and at the end
    (2**40, 0, N, 1),  # under it, with little freed: at the end only
    (2**40, 2**40, N, 2 + 1),  # freed memory grew by more than RETAIN_BYTES since the last release: after each layer
    (2**40, None, N, 2 + 1),  # the allocator cannot tell: after each layer
    (2**40, 2**40, N + 1, 1),  # a text under HEAP_CHECK_TOKENS: the heap is not read, given back at the end
])
def test_freed_memory_goes_back_after_a_layer_only_where_it_would_not_be_reused(monkeypatch, heap_bytes, free,
                                                                                 check_tokens, releases):
    monkeypatch.setattr(frugal, "HEAP_BYTES", heap_bytes)
    monkeypatch.setattr(frugal, "HEAP_CHECK_TOKENS", check_tokens)
    monkeypatch.setattr(frugal, "free_heap_bytes", lambda: free)
    monkeypatch.setattr(frugal, "_RELEASED", [0])
    calls = []
    monkeypatch.setattr(frugal, "release_free_memory", lambda: calls.append(1) or True)
    model = _model("llama")
    assert len(decoder_layers(model)) == 2
    with torch.no_grad(), frugal.lean_forward(model):
        model(input_ids=_ids())
    assert len(calls) == releases


_FREE_HEAP = """
import json, torch
from attnviz.capture import frugal
frugal.release_free_memory()  # a heap with little freed memory, so freeing the block below trims nothing
block = torch.ones(8 * 2**20 // 4)  # 8 MiB from the heap (under HEAP_BYTES)
held = frugal.free_heap_bytes()
del block
print(json.dumps([held, frugal.free_heap_bytes()]))
"""


def test_the_free_heap_is_read_from_the_allocator():
    if frugal._libc() is None or not hasattr(frugal._libc(), "mallinfo2"):
        assert frugal.free_heap_bytes() is None
        return
    done = subprocess.run([sys.executable, "-c", _FREE_HEAP], capture_output=True, text=True, timeout=120, check=True)
    held, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert after - held >= 8 * 2**20  # the freed block is counted while the heap keeps it


class _CLibrary:
    """A C library with mallopt but no malloc_trim (not glibc); _Glibc has both. Both record what mallopt set."""

    def __init__(self):
        self.set = []

    def mallopt(self, param, value):
        self.set.append((param, value))
        return 1


class _Glibc(_CLibrary):
    def malloc_trim(self, pad):
        return 1


def test_glibc_keeps_freed_heap_memory_for_the_next_layer():
    glibc, other = _Glibc(), _CLibrary()
    frugal._tune_allocator(glibc)
    # the mmap threshold first (glibc's own ceiling, 32 MiB), then the trim threshold: 128 MiB kept at the top
    assert glibc.set == [(-3, 32 * 2**20), (-1, 128 * 2**20)]
    frugal._tune_allocator(other)
    assert other.set == []


def test_slim_tokenizer_tokenizes_and_saves_as_before(tmp_path):
    from transformers import AutoTokenizer, GPT2Tokenizer

    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "Ġ": 4, "Ġab": 5, "abc": 6, "<|endoftext|>": 7}
    merges = [("a", "b"), ("Ġ", "ab"), ("ab", "c")]
    plain, slim = (GPT2Tokenizer(vocab=dict(vocab), merges=list(merges)) for _ in range(2))
    assert frugal.slim_tokenizer(slim) is slim
    assert slim._merges == [] and slim._vocab == {}  # the build-only copies are gone
    for text in ("ab abc", " ab ab c", "cab ba", "<|endoftext|>abc"):
        assert slim(text).input_ids == plain(text).input_ids
        assert slim.decode(plain(text).input_ids) == plain.decode(plain(text).input_ids)
    assert slim.get_vocab() == plain.get_vocab() and len(slim) == len(plain)
    assert slim.convert_ids_to_tokens(list(range(8))) == plain.convert_ids_to_tokens(list(range(8)))
    slim.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(" ab abc").input_ids == plain(" ab abc").input_ids


def test_a_tokenizer_without_a_rust_backend_is_left_alone():
    class Slow:
        _merges = [("a", "b")]

    slow = Slow()
    slow._vocab = {"a": 0}
    assert frugal.slim_tokenizer(slow) is slow and slow._vocab == {"a": 0}


_PEAK = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from attnviz.capture import frugal

def peak():  # this process's peak resident memory (ru_maxrss would start at the parent's, inherited at fork)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))

config = LlamaConfig(hidden_size=64, intermediate_size=16384, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=4096, vocab_size=257)
model = LlamaForCausalLM(config).eval()
ids = torch.zeros((1, 2048), dtype=torch.long)
with torch.no_grad():
    model.model(input_ids=ids[:, :8])
    before = peak()
    with frugal.lean_forward(model):  # first, so that the whole pass's peak comes after it
        model.model(input_ids=ids)
    lean = peak() - before
    model.model(input_ids=ids)
print(json.dumps([peak() - before, lean]))
"""


def _peak_bytes() -> tuple[int, int]:
    """The peak bytes a 2,048-token pass adds, (whole MLP, blocked MLP), measured in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_the_blocked_mlp_peaks_at_a_fraction_of_the_whole_one():
    # [2048, 16384] float32 is 128 MiB: the whole MLP holds gate, up and their product at once (384 MiB); in
    # blocks of 256 rows (MIN_ROWS, above BLOCK_BYTES / (4 * 16384)) each is 16 MiB
    whole, lean = _peak_bytes()
    assert whole > 300 * 2**20
    assert lean < whole / 2


def _resident_pages(ranges) -> tuple[int, int]:
    """(resident, total) pages of these (start, length) ranges of this process, read from /proc/self/pagemap."""
    import mmap
    import struct

    resident = total = 0
    with open("/proc/self/pagemap", "rb") as fh:
        for start, length in ranges:
            for page in range(start // mmap.PAGESIZE, (start + length) // mmap.PAGESIZE):
                fh.seek(8 * page)
                resident += struct.unpack("<Q", fh.read(8))[0] >> 63
                total += 1
    return resident, total


def _saved_model(folder):
    """A two-layer Gemma 3 with 3 MB of weights per layer, saved as a user's folder and written back to disk (the
    kernel reclaims clean pages only), then loaded by attnviz: its weights are mapped from the safetensors file."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    from attnviz.models import load_model
    from attnviz.tokenizer import byte_tokenizer

    config = Gemma3TextConfig(hidden_size=128, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, vocab_size=257, max_position_embeddings=512,
                              sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    byte_tokenizer().save_pretrained(folder)
    for file in folder.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return load_model(str(folder))


def test_a_long_lean_pass_pages_out_each_layers_mapped_weights(monkeypatch, tmp_path):
    model = _saved_model(tmp_path).model
    base = model.base_model
    ranges = [r for layer in decoder_layers(model) for r in frugal.mapped_weight_ranges(layer)]
    ids = _ids()
    with torch.no_grad():
        before = base(input_ids=ids).last_hidden_state
        resident, total = _resident_pages(ranges)
        assert total >= 1000 and resident == total  # a plain pass leaves every layer's weights resident
        monkeypatch.setattr(frugal, "LONG_TEXT", N + 1)
        with frugal.lean_forward(model):  # shorter than LONG_TEXT: nothing paged out
            base(input_ids=ids)
        assert _resident_pages(ranges)[0] == total
        monkeypatch.setattr(frugal, "LONG_TEXT", N)
        with frugal.lean_forward(model):
            lean = base(input_ids=ids).last_hidden_state
        # what stays are the pages next to those read later (the kernel maps up to 16 neighbours of a page read)
        assert _resident_pages(ranges)[0] <= 64
        after = base(input_ids=ids).last_hidden_state
    assert torch.equal(after, before)  # paged back in with the same values
    torch.testing.assert_close(lean, before, rtol=1e-5, atol=1e-5)


def test_a_short_lean_pass_reads_neither_the_memory_map_nor_the_heap(monkeypatch):
    """Under LONG_TEXT and HEAP_CHECK_TOKENS a pass reads neither /proc/self/maps (mapped_weight_ranges) nor
    glibc's heap walk (free_heap_bytes) after its layers: together they added about 0.2 s of CPU time to a
    256-token SmolLM2 capture of 0.7 s."""
    reads = []
    monkeypatch.setattr(frugal, "mapped_weight_ranges", lambda module: reads.append("maps") or [])
    monkeypatch.setattr(frugal, "_heap_grew", lambda: reads.append("heap") or False)
    model = _model("llama")
    for long_text, check_tokens, want in ((N + 1, N + 1, []), (N, N + 1, ["maps"] * 2), (N + 1, N, ["heap"] * 2)):
        monkeypatch.setattr(frugal, "LONG_TEXT", long_text)
        monkeypatch.setattr(frugal, "HEAP_CHECK_TOKENS", check_tokens)
        reads.clear()
        with torch.no_grad(), frugal.lean_forward(model):
            model(input_ids=_ids())
        assert reads == want
