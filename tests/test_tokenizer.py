"""attnviz.tokenizer: one token per UTF-8 byte, <bos> first, and back to the same text."""

import pytest

from attnviz.tokenizer import BOS, VOCAB_SIZE, byte_tokenizer


@pytest.mark.parametrize("text", ["The cat sat.", "", "naïve café — ünïcödé ✓ 🙂", "tabs\tand\nnewlines  and  spaces",
                                  "<bos> is only a string here"])
def test_ids_are_the_utf8_bytes_after_bos_and_decode_back(text):
    tok = byte_tokenizer()
    ids = tok(text).input_ids
    assert ids[0] == 256 and tok.convert_ids_to_tokens(256) == BOS
    assert ids[1:] == list(text.encode("utf-8"))  # Python's own UTF-8 encoder is the reference
    assert tok.decode(ids[1:]) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_every_byte_has_its_own_id_and_the_vocabulary_is_257():
    tok = byte_tokenizer()
    assert len(tok) == VOCAB_SIZE == 257
    all_bytes = bytes(range(256))
    # one token per byte for every byte value, including those that are not valid UTF-8 on their own
    ids = tok(all_bytes.decode("latin-1")).input_ids[1:]
    assert ids == list(all_bytes.decode("latin-1").encode("utf-8"))
    pieces = {tok.convert_ids_to_tokens(i) for i in range(256)}
    assert len(pieces) == 256 and BOS not in pieces


def test_shared_instance():
    assert byte_tokenizer() is byte_tokenizer()
