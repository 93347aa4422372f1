import numpy as np
import pytest

from t2mlr_jax.data.sft import encode_prompt, encode_prompt_response, gsm8k_aug_record, hotpotqa_record


def test_prompt_response_layout(smollm2):
    example = encode_prompt_response("What is 2+2?", "2+2=4\n### 4", smollm2)
    prompt = encode_prompt("What is 2+2?", smollm2)
    response = smollm2.encode("2+2=4\n### 4")
    tokens, p = example["tokens"], len(prompt)
    assert smollm2.decode(prompt).endswith("?\n\n")
    assert (tokens == np.concatenate([prompt, response, [smollm2.eos_id]])).all()
    assert (example["control_flow"] == [1] * p + [2] * (len(tokens) - p)).all()
    assert (example["targets"][:-1] == tokens[1:]).all()
    # The loss counts exactly where the next token is a response token (the response and its EOS).
    t = np.arange(len(tokens))
    assert (example["loss_mask"] == ((t + 1 >= p) & (t < len(tokens) - 1))).all()
    assert example["loss_mask"].sum() == len(response) + 1


def test_chat_all_recurrent_and_prompt_loss_options(smollm2):
    example = encode_prompt_response("Q", "A", smollm2, chat=True, all_recurrent=True, prompt_loss=True)
    assert smollm2.decode(example["tokens"]).startswith("<|im_start|>system\n")
    assert example["control_flow"][0] == 1 and (example["control_flow"][1:] == 2).all()
    assert example["loss_mask"][:-1].all() and example["loss_mask"][-1] == 0


def test_gsm8k_aug_and_hotpotqa_formats():
    gsm = gsm8k_aug_record(
        {"question": "Q?", "steps": ["<<600*30/100=180>>", " <<180+60=240>> "], "answer": "360"}
    )
    assert gsm == {"prompt": "Q?", "response": "<<600*30/100=180>>\n<<180+60=240>>\n### 360", "answer": "360"}
    hotpot = hotpotqa_record(
        {
            "question": "Which magazine was founded first?",
            "context": {
                "title": ["The Economist", "The Atlantic"],
                "sentences": [["The Economist is a weekly", " founded in 1843."], ["The Atlantic, 1857."]],
            },
            "cot": "The Economist was founded in 1843.\n1843 is earlier than 1857.",
            "answer": "The Economist",
        }
    )
    assert hotpot["prompt"] == (
        "Which magazine was founded first?\nContext:\nDocument 1: The Economist is a weekly "
        "founded in 1843.\nDocument 2: The Atlantic, 1857."
    )
    assert hotpot["response"].endswith("1843 is earlier than 1857.\n### The Economist")
    with pytest.raises(ValueError, match="missing fields"):
        gsm8k_aug_record({"question": "Q"})
