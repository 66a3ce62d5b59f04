"""A byte-level tokenizer built in code, for the toy models and the toy lab: no download, any text.

Token id b (0..255) is the byte b; id 256 is <bos>, prepended to every sequence so causal models have a first token
that is not part of the text (the usual home of an attention sink). Also readable_tokens: any tokenizer's tokens,
one readable string each (GPT-2's byte-to-character table reads byte-level pieces).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

BOS = "<bos>"
VOCAB_SIZE = 257


@lru_cache(maxsize=1)
def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per UTF-8 byte, <bos> first. Shared instance: tokenizers' fast tokenizers are thread-safe."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=_byte_of)
    vocab = {ch: _byte_of(ch) for ch in byte_chars}
    vocab[BOS] = 256
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=BOS))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        pre_tokenizers.Split(pattern="", behavior="isolated"),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 256)])
    # split_special_tokens: a text that contains the string "<bos>" is read as its five bytes, not as the token
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, unk_token=BOS, pad_token=BOS,
                                   split_special_tokens=True)


def _byte_of(ch: str) -> int:
    """The byte that GPT-2's byte-to-unicode table maps to the printable character ch."""
    return _BYTE_OF[ch]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the one ByteLevel pre-tokenization uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_OF = {ch: b for b, ch in _bytes_to_unicode().items()}


def readable_tokens(tokenizer, token_ids: list[int]) -> list[str]:
    """Each token decoded on its own, with whitespace made visible. A piece of a multi-byte character (which
    decodes alone to U+FFFD) is shown by its bytes, as <0xC3>, when its vocabulary string is byte-level (GPT-2's
    byte-to-character table), else by that vocabulary string. Any other control character is shown by its code as
    <0x10>: in a chart's label it would stop plotly's exporter, and on screen it shows nothing."""
    out = []
    for tid in token_ids:
        text = tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in text or text == "":
            piece = str(tokenizer.convert_ids_to_tokens(tid))
            raw = [_BYTE_OF.get(ch) for ch in piece]
            text = "".join(f"<0x{b:02X}>" for b in raw) if None not in raw else piece
        text = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")
        out.append("".join(f"<0x{ord(c):02X}>" if unicodedata.category(c) == "Cc" else c for c in text))
    return out
