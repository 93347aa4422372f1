import pytest

from t2mlr_jax.data.answers import (exact_answer_correct, extract_gsm_answer, gsm_answer_correct,
                                    normalize_gsm_answer)


@pytest.mark.parametrize("text, answer", [
    ("a\nb\n#### 1,234.<|endoftext|>", "1,234."),
    ("steps\n### 42!!!! ", "42"),
    ("x ### 1 ### 7", "7"),
    ("no marker\nlast line 9<|eot_id|>", "last line 9"),
    ("### \nfallback", "fallback"),
    ("", None),
])
def test_extract_gsm_answer(text, answer):
    assert extract_gsm_answer(text) == answer


def test_gsm_comparison_normalises():
    assert normalize_gsm_answer("1,234.") == "1234"
    assert gsm_answer_correct("work\n### 1234<|im_end|>", "steps\n### 1,234")
    assert not gsm_answer_correct("### 12", "### 1,234")
    assert exact_answer_correct(" 8<|im_end|>", "8") and not exact_answer_correct("80", "8")
