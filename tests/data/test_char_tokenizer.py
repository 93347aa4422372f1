import numpy as np
import pytest

from t2mlr_jax.data.char_tokenizer import S5CharTokenizer


def test_vocabulary_layout_mirrors_the_release():
    tok = S5CharTokenizer()
    assert tok.vocab_size == 188
    assert tok.tokens[:4] == ("<pad>", "<unk>", "<bos>", "<eos>")
    assert [tok.token_to_id(c) for c in "azAZ09 |"] == [4, 29, 30, 55, 56, 65, 66, 67]
    assert tok.token_to_id("<A_12345>") == 68 and tok.token_to_id("<A_54321>") == 187


def test_encode_decode_round_trip_with_atomic_permutation_tokens():
    tok = S5CharTokenizer()
    text = "<A_21345>xY9 |<A_54321>  "
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and len(ids) == 9
    assert tok.decode(ids) == text


def test_unknown_characters_raise():
    with pytest.raises(ValueError, match="not in the S5 char vocabulary"):
        S5CharTokenizer().encode("ab-c")
