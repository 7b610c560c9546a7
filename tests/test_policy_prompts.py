"""Prompt building: templates, history window, truncation to the token budget."""

from __future__ import annotations

import warnings

import pytest
from transformers import AutoTokenizer

from milegpo.policies import PROMPT_TEMPLATES, PromptBuilder, tiny_model
from milegpo.policies.prompts import INSTRUCTIONS, resolve_template

WORDS = ["you are in room number one two three four five six seven eight nine ten . look go north south Goal Now"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(tiny_model(WORDS, tmp_path_factory.mktemp("tiny") / "m"))


def builder(tokenizer, template=None, history_length=2, max_prompt_tokens=2048):
    return PromptBuilder(tokenizer, template, INSTRUCTIONS["generate"], history_length, max_prompt_tokens)


HISTORY = [(f"you are in room {w} .", "go north") for w in ("one", "two", "three", "four")]


def decode(tokenizer, ids):
    return tokenizer.decode(ids)


def test_history_window_and_step_numbers(tokenizer):
    text = decode(tokenizer, builder(tokenizer).build("look", "you are in room five .", HISTORY, ["go north", "look"]))
    assert "room one" not in text and "room two" not in text
    assert "Step 3 observation: you are in room three .\nStep 3 action: go north" in text
    assert "Step 5 observation: you are in room five ." in text
    assert "Admissible actions: 'go north', 'look'" in text and INSTRUCTIONS["generate"] in text
    no_history = decode(tokenizer, builder(tokenizer, history_length=0).build("look", "x", HISTORY, None))
    assert "previous steps" not in no_history and "any text command" in no_history


@pytest.mark.parametrize("family", sorted(PROMPT_TEMPLATES))
def test_registered_families(tokenizer, family):
    text = decode(tokenizer, builder(tokenizer, family).build("look", "you are in room one .", [], ["look"]))
    assert "you are in room one ." in text and "look" in text


def test_custom_template(tokenizer):
    b = builder(tokenizer, "Goal: {task}\n{history}Now: {observation}\n{instructions}")
    text = decode(tokenizer, b.build("go north", "you are in room one .", HISTORY[:1], None))
    assert "Goal: go north\n" in text and "Now: you are in room one ." in text
    with pytest.raises(ValueError, match="unknown fields"):
        resolve_template("{observation} {inventory}")
    with pytest.raises(ValueError, match="observation"):
        resolve_template("{task} only")
    with pytest.raises(ValueError, match="format string"):
        resolve_template("{observation")


def test_without_chat_template(tokenizer):
    plain = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = None
    text = decode(plain, builder(plain).build("look", "you are in room one .", [], None))
    assert text.startswith("You are an agent") and "<|im_start|>" not in text


def test_truncation_drops_oldest_history_first(tokenizer):
    full = builder(tokenizer).build("look", "you are in room five .", HISTORY, None)
    one_step = builder(tokenizer, history_length=1).build("look", "you are in room five .", HISTORY, None)
    b = builder(tokenizer, max_prompt_tokens=len(one_step))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dropping history is silent
        assert b.build("look", "you are in room five .", HISTORY, None) == one_step
    assert len(full) > len(one_step)


def test_long_observation_is_cut_in_the_middle_with_one_warning(tokenizer):
    observation = "you are in room one . " + "look " * 400 + "go south ."
    b = builder(tokenizer, max_prompt_tokens=200)
    with pytest.warns(UserWarning, match="max_prompt_tokens"):
        ids = b.build("look", observation, HISTORY, None)
    text = decode(tokenizer, ids)
    assert len(ids) <= 200 and "you are in room one" in text and "go south ." in text and " ... " in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per builder
        b.build("look", observation, HISTORY, None)
    with pytest.warns(UserWarning, match="max_prompt_tokens"), pytest.raises(ValueError, match="does not fit"):
        builder(tokenizer, max_prompt_tokens=5).build("look", observation, [], None)


def test_token_cache_gives_the_tokenizers_ids_and_stays_bounded(tokenizer) -> None:
    from milegpo.policies.prompts import TokenCache

    cache = TokenCache(tokenizer, max_entries=4)
    texts = [f"go to room {w}" for w in ("a", "b", "c", "d", "e", "a")]
    for text in texts:
        assert cache(text) == list(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(cache._ids) <= 4
    ids = cache("go to room a")
    ids.append(-1)  # a caller's list is its own
    assert cache("go to room a")[-1] != -1
