"""LLMPolicy in choose mode: candidate scoring, sampling, evaluate_actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, completion_logprobs, tiny_model
from milegpo.policies.tiny import TAG_TOKENS

TEXTS = ["You are in the kitchen. You see a fridge 1 and a table 2.", "go to hall", "open fridge 1",
         "take apple from table 2", "put apple in fridge 1", "look"]  # fmt: skip
COMMANDS = ["go to hall", "open fridge 1", "take apple from table 2", "look"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(TEXTS, tmp_path_factory.mktemp("tiny") / "m", seed=1)


def make_policy(path, **kwargs):
    torch.manual_seed(0)
    kwargs = {"mode": "choose", **kwargs}
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, **kwargs)


def infos(n, commands=COMMANDS):
    return [{"task": "put apple in fridge 1", "admissible_commands": commands[: 2 + i % 3]} for i in range(n)]


def test_sample_fields_and_probabilities(tiny_dir):
    policy = make_policy(tiny_dir, mode="choose", temperature=2.0)
    obs = ["You are in the kitchen."] * 5
    samples = policy.act(obs, infos(5), [[("You see a table 2.", "look")]] * 5)
    for sample, info in zip(samples, infos(5)):
        assert sample.text == info["admissible_commands"][sample.chosen]
        assert len(sample.candidate_ids) == len(info["admissible_commands"])
        assert sample.action_ids == sample.candidate_ids[sample.chosen]
        assert sample.action_ids[-1] == policy.tokenizer.eos_token_id
        assert sample.old_logprobs.shape == (1,) and sample.old_logprobs.dtype == np.float32
        assert sample.parsed
    logp, mask, entropy = policy.evaluate_actions(samples, with_entropy=True)
    assert logp.shape == mask.shape == entropy.shape == (5, 1) and mask.all()
    np.testing.assert_allclose(logp.detach().numpy()[:, 0], [s.old_logprobs[0] for s in samples], atol=1e-5)
    # probabilities of all candidates sum to one; the entropy is that of the candidate softmax
    for i, s in enumerate(samples):
        all_logp = []
        for j in range(len(s.candidate_ids)):
            other = type(s)(**{**s.__dict__, "chosen": j})
            all_logp.append(policy.evaluate_actions([other])[0].item())
        p = np.exp(all_logp)
        assert p.sum() == pytest.approx(1.0, abs=1e-5)
        assert entropy[i, 0].item() == pytest.approx(-(p * np.log(p)).sum(), abs=1e-4)


def test_sampling_frequencies_match_softmax(tiny_dir):
    policy = make_policy(tiny_dir, mode="choose", candidate_score="mean", seed=5)
    info = {"task": "put apple in fridge 1", "admissible_commands": COMMANDS}
    n = 200
    samples = policy.act(["You are in the kitchen."] * n, [info] * n, [[]] * n)
    probs = np.exp([policy.evaluate_actions([type(samples[0])(**{**samples[0].__dict__, "chosen": j})])[0].item()
                    for j in range(len(COMMANDS))])  # fmt: skip
    counts = np.bincount([s.chosen for s in samples], minlength=len(COMMANDS))
    # meaningful only if every command is likely and uniform sampling would be far off
    assert probs.min() > 0.03 and np.abs(probs - 1 / len(COMMANDS)).max() > 0.2
    np.testing.assert_allclose(counts / n, probs, atol=0.08)
    greedy = policy.act(["You are in the kitchen."] * 3, [info] * 3, [[]] * 3, deterministic=True)
    assert {s.chosen for s in greedy} == {int(np.argmax(probs))}


def test_same_seed_same_choices(tiny_dir):
    info = {"task": "t", "admissible_commands": COMMANDS}
    runs = [[s.chosen for s in make_policy(tiny_dir, temperature=8.0, seed=2).act(["x"] * 30, [info] * 30, [[]] * 30)]
            for _ in range(2)]  # fmt: skip
    assert runs[0] == runs[1]


def test_needs_admissible_commands(tiny_dir):
    policy = make_policy(tiny_dir)
    with pytest.raises(ValueError, match="admissible"):
        policy.act(["x"], [{"task": "t", "admissible_commands": None}], [[]])


def test_predict_returns_strings(tiny_dir):
    policy = make_policy(tiny_dir)
    info = {"task": "t", "admissible_commands": COMMANDS}
    action, state = policy.predict("You are in the kitchen.", infos=[info], deterministic=True)
    assert action in COMMANDS and state is None
    actions, _ = policy.predict(np.array(["a", "b"], dtype=object), infos=[info, info])
    assert actions.shape == (2,) and set(actions) <= set(COMMANDS)


def test_prompt_shows_history_commands_and_instructions(tiny_dir):
    policy = make_policy(tiny_dir, history_length=1)
    history = [("You see a table 2.", "look"), ("You see a fridge 1.", "open fridge 1")]
    text = policy.tokenizer.decode(policy.build_prompt("You are in the kitchen.", infos(1)[0], history))
    assert "You see a fridge 1." in text and "You see a table 2." not in text  # only the last K=1 step
    assert "Step 3 observation: You are in the kitchen." in text
    assert "'go to hall', 'open fridge 1'" in text and "Answer with one of the admissible actions." in text
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert not any(tag in text for tag in TAG_TOKENS)


@pytest.mark.parametrize("candidate_score", ["sum", "mean"])
def test_choice_probability_from_candidate_likelihoods(tiny_dir, candidate_score):
    """log pi(chosen) = log_softmax(score / T) with score = sum (or mean) of the candidate's token log-probs."""
    policy = make_policy(tiny_dir, temperature=1.5, candidate_score=candidate_score)
    (sample,) = policy.act(["You are in the kitchen."], [infos(3)[2]], [[]])
    with torch.no_grad():
        logp, mask, _ = completion_logprobs(policy.model, [sample.prompt_ids] * len(sample.candidate_ids),
                                            sample.candidate_ids, policy.pad_id)  # fmt: skip
    scores = logp.sum(-1) if candidate_score == "sum" else logp.sum(-1) / mask.sum(-1)
    expected = torch.log_softmax(scores / 1.5, -1)[sample.chosen].item()
    assert sample.old_logprobs[0] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="candidate_score"):
        make_policy(tiny_dir, candidate_score="max")


def test_chunked_scoring_equals_one_batch(tiny_dir):
    big = make_policy(tiny_dir, temperature=3.0)
    samples = big.act([f"You are in the kitchen {'.' * k}" for k in range(6)], infos(6), [[]] * 6)
    small = make_policy(tiny_dir, temperature=3.0, max_batch_tokens=100)  # about one env per forward pass
    torch.testing.assert_close(small.evaluate_actions(samples)[0], big.evaluate_actions(samples)[0], atol=1e-5, rtol=0)


def test_identical_prompts_are_scored_once_and_count_once_each(tiny_dir, monkeypatch):
    """The copies of a group at the same state share one scoring pass; each still counts in the loss."""
    import milegpo.policies.candidate_scoring as scoring

    policy = make_policy(tiny_dir, temperature=2.0)
    observations = ["You are in the kitchen", "You are in the kitchen .", "You are in the kitchen"]
    samples = policy.act(observations, infos(1) * 3, [[]] * 3, deterministic=True)  # copies 0 and 2 choose alike
    scored = []
    packed = scoring.packed_candidate_logprobs
    monkeypatch.setattr(scoring, "packed_candidate_logprobs",
                        lambda model, prompts, *args: scored.append(len(prompts)) or packed(model, prompts, *args))
    logp, _, _ = policy.evaluate_actions(samples)
    assert scored == [2]  # three envs, two distinct prompts
    alone = [policy.evaluate_actions([s])[0] for s in samples]
    torch.testing.assert_close(logp, torch.cat(alone), atol=1e-6, rtol=0)
    policy.model.zero_grad()
    policy.evaluate_actions([samples[0], samples[2]])[0].sum().backward()
    shared = [p.grad.clone() for p in policy.trainable_parameters()]
    policy.model.zero_grad()
    (2 * policy.evaluate_actions([samples[0]])[0].sum()).backward()
    for a, b in zip(shared, (p.grad for p in policy.trainable_parameters())):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
