"""tiny_model: a real transformers model + word-level tokenizer built offline."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from milegpo.policies import tiny_model
from milegpo.policies.tiny import TAG_TOKENS, UNK

TEXTS = [
    "You are in the kitchen. You see a fridge 1, a table 2 and a red box.",
    "go to kitchen", "open fridge 1", "take apple from table 2", "put apple in fridge 1",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(TEXTS, tmp_path_factory.mktemp("tiny") / "m")


def test_loads_like_a_hub_model(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ids = tok("go to kitchen", return_tensors="pt")
    logits = model(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], len(tok))
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None


def test_token_ids_stable_across_save_load(tiny_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = "You are in the kitchen.\nYou see a fridge 12. <action>open fridge 1</action><|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.decode(ids) == text  # exact round trip, spaces and newlines included


def test_tags_are_single_tokens_and_unknown_words_map_to_unk(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for tag in TAG_TOKENS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
    ids = tok("open the zeppelin", add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids(UNK)) == 1 and len(ids) == 3


def test_same_seed_same_weights(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path / "c", seed=4))
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_other_architectures(arch, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path, arch=arch))
    assert model.config.model_type == arch


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="arch"):
        tiny_model(TEXTS, tmp_path, arch="mamba")
    with pytest.raises(ValueError, match="divisible"):
        tiny_model(TEXTS, tmp_path, hidden_size=30, num_heads=4)


def test_house_env_text_has_no_unknown_words(tmp_path):
    house = pytest.importorskip("milegpo.envs.house")
    tok = AutoTokenizer.from_pretrained(tiny_model(house.HouseEnv.vocabulary(), tmp_path))
    unk = tok.convert_tokens_to_ids(UNK)
    for split in ("train", "eval_ood"):
        env = house.HouseEnv(split=split)
        for seed in range(3):
            obs, info = env.reset(seed=seed)
            texts = [obs, info["task"], *info["admissible_commands"]]
            for command in info["admissible_commands"][:4]:
                obs, *_, info = env.step(command)
                texts += [obs, *info["admissible_commands"]]
            for text in texts:
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert unk not in ids, text
                assert tok.decode(ids) == text
