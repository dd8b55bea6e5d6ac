"""``arguments.read_request``: generate's arguments as plain values (padding stripped, the mask
inferred as generate does, the budget from max_new_tokens or max_length, the seed from torch's
generator) and one-line refusals of what the decode loop cannot honour."""

import pytest
import torch

from latticedraft.decoding.custom_generate.arguments import read_request
from latticedraft.errors import InputError
from tests.decoding.tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama", vocab=64)
    m.generation_config.eos_token_id = 63
    m.generation_config.pad_token_id = 0
    return m


def test_left_padding_is_stripped_per_row(model):
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    r = read_request(model, ids, None, {"attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
                                        "max_new_tokens": 5, "drafter": "top1", "heads": "h"})
    assert [p.tolist() for p in r.prompts] == [[5, 6], [7, 8, 9, 10]]
    assert (r.max_new_tokens, r.eos_token_id, r.pad_token_id, r.sampling, r.return_dict) == (5, [63], 0, None, False)
    assert r.options == {"drafter": "top1", "heads": "h"} and r.input_ids is ids


def test_the_mask_is_inferred_from_the_pad_id_unless_it_ends_text(model):
    ids = torch.tensor([[0, 0, 5, 6]])
    assert read_request(model, ids, None, {"max_new_tokens": 2}).prompts[0].tolist() == [5, 6]
    same = read_request(model, ids, None, {"max_new_tokens": 2, "eos_token_id": [0, 63]})
    assert same.prompts[0].tolist() == [0, 0, 5, 6]  # pad = an end id: generate cannot tell padding apart


def test_the_budget_comes_from_max_new_tokens_else_max_length(model):
    ids = torch.tensor([[1, 2, 3]])
    assert read_request(model, ids, None, {"max_length": 10}).max_new_tokens == 7
    assert read_request(model, ids, None, {"max_length": 10, "max_new_tokens": 4}).max_new_tokens == 4
    assert read_request(model, ids, None, {}).max_new_tokens == 17  # transformers' default max_length 20


def test_sampling_reads_generate_settings_and_the_seed(model):
    ids = torch.tensor([[1, 2, 3]])
    kw = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.1}
    s = read_request(model, ids, None, {**kw, "seed": 11}).sampling
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed) == (0.7, 5, 0.9, 1.1, 11)
    torch.manual_seed(3)
    a = read_request(model, ids, None, kw).sampling.seed
    torch.manual_seed(3)
    assert read_request(model, ids, None, kw).sampling.seed == a  # torch.manual_seed repeats a run
    assert read_request(model, ids, None, kw).sampling.seed != a


def test_a_given_generation_config_is_the_base_of_the_keywords(model):
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=3, do_sample=True, top_k=2, eos_token_id=[4, 5])
    r = read_request(model, torch.tensor([[1, 2]]), cfg, {"seed": 0})
    assert r.max_new_tokens == 3 and r.sampling.top_k == 2 and r.eos_token_id == [4, 5]


@pytest.mark.parametrize("kw, needle", [
    ({"num_beams": 3}, "generate(num_beams=3)"),
    ({"min_new_tokens": 4}, "generate(min_new_tokens=4)"),
    ({"do_sample": True, "min_p": 0.1}, "generate(min_p=0.1)"),
    ({"bad_words_ids": [[3]]}, "generate(bad_words_ids=[[3]])"),
    ({"stopping_criteria": [object()]}, "generate(stopping_criteria=...)"),
    ({"assistant_model": object()}, "generate(assistant_model=...)"),
    ({"inputs_embeds": torch.zeros(1, 2, 4)}, "generate(inputs_embeds=...) is not a setting"),
    ({"attention_mask": torch.tensor([[1, 0, 1]])}, "row 0 is not left padding"),
    ({"attention_mask": torch.tensor([[0, 0, 0]])}, "row 0 is not left padding"),
    ({"attention_mask": torch.tensor([[1, 1]])}, "does not match input_ids (1, 3)"),
    ({"max_length": 3, "max_new_tokens": None}, "generate(max_length=3) leaves no room after an input of 3 tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"num_return_sequences": 2}, "generate: Greedy methods"),
    ({"eos_token_id": -1}, "end-of-text ids are token ids >= 0"),
    ({"seed": 1}, "generate(seed=...) applies to do_sample=True"),
    ({"do_sample": True, "temperature": 0.0}, "--temperature 0.0 must be"),
    ({"streamer": object(), "input_ids": None}, "streams one sequence"),
])
def test_refusals_name_the_setting_in_one_line(model, kw, needle):
    ids = torch.tensor([[1, 2, 3]] if "streamer" not in kw else [[1, 2, 3], [4, 5, 6]])
    kw = {k: v for k, v in {"max_new_tokens": 2, **kw}.items() if v is not None}
    with pytest.raises(InputError) as e:
        read_request(model, ids, None, kw)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_ids_are_given_once_as_an_integer_matrix(model):
    with pytest.raises(InputError, match="exactly once"):
        read_request(model, torch.tensor([[1]]), None, {"input_ids": torch.tensor([[1]])})
    with pytest.raises(InputError, match=r"input_ids \(3,\): give an integer tensor \[batch, length\]"):
        read_request(model, torch.tensor([1, 2, 3]), None, {})
    assert read_request(model, None, None, {"inputs": torch.tensor([[1, 2]])}).prompts[0].tolist() == [1, 2]
