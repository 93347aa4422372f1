import pytest

from t2mlr_jax.data.answers import (
    boxed_answer_correct,
    exact_answer_correct,
    extract_boxed,
    extract_gsm_answer,
    gsm_answer_correct,
    normalize_gsm_answer,
)


@pytest.mark.parametrize(
    "text, answer",
    [
        ("a\nb\n#### 1,234.<|endoftext|>", "1,234."),
        ("steps\n### 42!!!! ", "42"),
        ("x ### 1 ### 7", "7"),
        ("no marker\nlast line 9<|eot_id|>", "last line 9"),
        ("### \nfallback", "fallback"),
        ("", None),
    ],
)
def test_extract_gsm_answer(text, answer):
    assert extract_gsm_answer(text) == answer


def test_gsm_comparison_normalises():
    assert normalize_gsm_answer("1,234.") == "1234"
    assert gsm_answer_correct("work\n### 1234<|im_end|>", "steps\n### 1,234")
    assert not gsm_answer_correct("### 12", "### 1,234")
    assert exact_answer_correct(" 8<|im_end|>", "8") and not exact_answer_correct("80", "8")


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"so $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{3} then \boxed{ \{1, 2\} }", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"cut off \boxed{\frac{1}{", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text, answer):
    assert extract_boxed(text) == answer


def test_boxed_answers_compare_after_normalisation():
    reference = r"Adding up, the total is $\boxed{1,234}$."
    assert boxed_answer_correct(r"... \boxed{1234}", reference)
    assert boxed_answer_correct(r"\boxed{\dfrac{3}{4}}", r"\boxed{\frac{3}{4}}")
    assert boxed_answer_correct(r"\boxed{90^\circ}", r"\boxed{90}")
    assert not boxed_answer_correct(r"\boxed{1235}", reference)
    assert not boxed_answer_correct("1234 without a box", reference)
    assert boxed_answer_correct(" plain<|im_end|>", "plain")  # no box in the reference: the whole text
