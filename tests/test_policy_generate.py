"""LLMPolicy in generate mode: sampling log-probs, stopping, parsing of <action> replies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from milegpo.envs.core import TextSpace
from milegpo.policies import ActionSample, LLMPolicy, parse_action, tiny_model

TEXTS = ["you are in the hall . you see a red box and a door to the kitchen", "go to kitchen", "open red box"]
INFO = {"task": "open the red box", "admissible_commands": ["go to kitchen", "open red box"]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(TEXTS, tmp_path_factory.mktemp("tiny") / "m", seed=2)


def make_policy(path, **kwargs):
    kwargs = {"mode": "generate", "max_new_tokens": 10, **kwargs}
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-2, model=path, **kwargs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logprobs_match_recomputation(tiny_dir, temperature):
    policy = make_policy(tiny_dir, temperature=temperature, seed=3)
    samples = policy.act(["you are in the hall ."] * 4, [INFO] * 4, [[("you see a red box", "go to kitchen")]] * 4)
    logp, mask, entropy = policy.evaluate_actions(samples, with_entropy=True)
    assert logp.shape == mask.shape == entropy.shape == (4, max(len(s.action_ids) for s in samples))
    for i, s in enumerate(samples):
        assert 1 <= len(s.action_ids) <= 10 and s.old_logprobs.shape == (len(s.action_ids),)
        assert mask[i].sum() == len(s.action_ids)
        np.testing.assert_allclose(logp[i, mask[i]].detach().numpy(), s.old_logprobs, atol=1e-5)
        assert s.raw_text == policy.tokenizer.decode(s.action_ids, skip_special_tokens=True)
    assert (entropy[mask] > 0).all()


def test_sampling_is_seeded_and_greedy_is_deterministic(tiny_dir):
    runs = [[s.action_ids for s in make_policy(tiny_dir, seed=9).act(["x"] * 3, [INFO] * 3, [[]] * 3)]
            for _ in range(2)]
    assert runs[0] == runs[1]
    greedy = make_policy(tiny_dir).act(["x"] * 3, [INFO] * 3, [[]] * 3, deterministic=True)
    assert greedy[0].action_ids == greedy[1].action_ids == greedy[2].action_ids


def test_an_env_seeded_reply_does_not_depend_on_the_other_rows_of_the_call(tiny_dir):
    """With one seed per env (``sample_seeds``), the HF sampler draws each row from its own stream: a
    reply is the same alone, in a batch of other prompts or in another position; another seed changes it."""
    policy = make_policy(tiny_dir, seed=1)
    observations = ["you are in the hall .", "you see a red box", "go to kitchen", "x"]
    seeds = [101, 202, 303, 404]
    batched = policy.act(observations, [INFO] * 4, [[]] * 4, sample_seeds=seeds)
    for i in range(4):
        alone = policy.act([observations[i]], [INFO], [[]], sample_seeds=[seeds[i]])[0]
        assert alone.action_ids == batched[i].action_ids
        np.testing.assert_allclose(alone.old_logprobs, batched[i].old_logprobs, atol=1e-5)
    reordered = policy.act(observations[::-1], [INFO] * 4, [[]] * 4, sample_seeds=seeds[::-1])
    assert [s.action_ids for s in reordered[::-1]] == [s.action_ids for s in batched]
    others = policy.act(observations, [INFO] * 4, [[]] * 4, sample_seeds=[s + 1 for s in seeds])
    assert [s.action_ids for s in others] != [s.action_ids for s in batched]


def test_inverse_cdf_sampling_draws_from_the_distribution():
    from milegpo.policies.sampling import inverse_cdf_sample

    log_probs = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), -1)
    uniforms = torch.as_tensor(np.random.default_rng(0).random((20000, 2)))
    counts = np.zeros((2, 4))
    for u in uniforms:
        counts[[0, 1], inverse_cdf_sample(log_probs, u).numpy()] += 1
    np.testing.assert_allclose(counts / 20000, log_probs.exp().numpy(), atol=0.015)  # ~4 standard errors
    impossible = torch.log(torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]))  # zero-probability tokens are never drawn
    draws = {int(inverse_cdf_sample(impossible, torch.tensor([u]))) for u in (0.0, 0.25, 0.5, 0.75, 1 - 1e-12, 1.0)}
    assert draws == {1, 3}  # 1.0: a float32 uniform rounded up, still below the total


def test_learns_tagged_answer_and_stops_at_close_tag(tiny_dir):
    """A few LoRA steps on one reply: greedy decoding then reproduces it and stops at </action>."""
    torch.manual_seed(0)
    policy = make_policy(tiny_dir, max_new_tokens=12)
    prompt = policy.build_prompt("you are in the hall .", INFO, [])
    reply = policy.tokenizer("<think>open red box</think><action>open red box</action>",
                             add_special_tokens=False)["input_ids"]
    target = ActionSample("open red box", prompt, reply, None, None, np.zeros(len(reply), np.float32), True)
    policy.set_training_mode(True)
    for _ in range(30):
        logp, mask, _ = policy.evaluate_actions([target])
        loss = -logp[mask].mean()
        policy.optimizer.zero_grad()
        loss.backward()
        policy.optimizer.step()
    assert loss.item() < 0.1
    (sample,) = policy.act(["you are in the hall ."], [INFO], [[]], deterministic=True)
    assert sample.action_ids == reply  # stopped right after </action>, not at max_new_tokens
    assert sample.text == "open red box" and sample.parsed
    assert sample.raw_text == "<think>open red box</think><action>open red box</action>"


def test_think_instructions(tiny_dir):
    thinking = make_policy(tiny_dir)  # the default, as in the paper
    text = thinking.tokenizer.decode(thinking.build_prompt("x", INFO, []))
    assert "<think> </think>" in text and "<action> </action>" in text
    no_think = make_policy(tiny_dir, think=False)
    plain = no_think.tokenizer.decode(no_think.build_prompt("x", INFO, []))
    assert "<think>" not in plain and "<action> </action>" in plain


@pytest.mark.parametrize(
    ("reply", "action", "parsed"),
    [
        ("<action>go to kitchen</action>", "go to kitchen", True),
        ("<think>the box is here</think> <action> open   red box </action>", "open red box", True),
        ("<ACTION>Go To Kitchen</Action>", "Go To Kitchen", True),  # tags in any case, content kept
        ("< action >go\nnorth</ action >", "go north", True),
        ("<action>look</action> then <action>open red box</action>", "open red box", True),  # last tag wins
        ("<action>look</action><action>open box", "look", True),  # an unclosed trailing tag is ignored
        ("go to kitchen", "go to kitchen", False),  # no tag: raw text, invalid
        ("<action></action>", "<action></action>", False),  # empty action
        ("<think>go to kitchen</think>", "<think>go to kitchen</think>", False),
        ("<action>open red box", "<action>open red box", False),  # never closed
        ("", "", False),
    ],
)
def test_parse_action(reply, action, parsed):
    assert parse_action(reply) == (action, parsed)


def test_unparsable_reply_goes_to_env_raw(tiny_dir):
    policy = make_policy(tiny_dir, max_new_tokens=3, seed=1)
    for s in policy.act(["x"] * 4, [INFO] * 4, [[]] * 4):
        assert s.parsed == ("</action>" in s.raw_text)
        if not s.parsed:
            assert s.text == s.raw_text


def test_chunked_scoring_equals_one_batch(tiny_dir):
    big = make_policy(tiny_dir, seed=4)
    samples = big.act([f"you are in the hall {'.' * k}" for k in range(6)], [INFO] * 6, [[]] * 6)
    small = make_policy(tiny_dir, seed=4, max_batch_tokens=64)  # one or two rows per forward pass
    expected, mask, ent = big.evaluate_actions(samples, with_entropy=True)
    got, got_mask, got_ent = small.evaluate_actions(samples, with_entropy=True)
    assert torch.equal(mask, got_mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ent, ent, atol=1e-5, rtol=0)
