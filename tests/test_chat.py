"""Chat-native agents: the episode as one conversation through the model's chat template, the env's
own action format, and every turn of a trajectory scored in one forward pass."""

from __future__ import annotations

import os

import pytest
import torch

from milegpo.envs import make_vec_env
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy
from milegpo.policies.conversation import prefix_groups, single_pass_logprobs
from milegpo.policies.parsing import action_parser
from milegpo.policies.sample import ActionSample
from milegpo.policies.scoring import score_rows

if not os.environ.get("MILEGPO_CI"):
    pytest.importorskip("skyrl_gym")
import skyrl_gym  # noqa: E402

from milegpo.integrations.skyrl_gym import SkyRLGymEnv  # noqa: E402

SYSTEM = "You are a careful math tutor."
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
ROWS = [{"data_source": "openai/gsm8k", "env_class": "gsm8k_multi_turn",
         "prompt": [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"what is {a} plus {b}? {INSTRUCTION}"}],
         "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
         "extra_info": {"split": "train", "index": i, "max_turns": 3}} for i, (a, b) in enumerate([(2, 3), (4, 4)])]


def chat_policy(model: str, **settings) -> LLMPolicy:
    settings = {"mode": "generate", "prompt_format": "chat", "history_length": 10, "max_new_tokens": 8,
                "device": "cpu", **settings}
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model, **settings)


@pytest.fixture(scope="module")
def smollm() -> str:
    from milegpo.policies import smollm2_path

    return smollm2_path()


def test_a_skyrl_conversation_is_the_token_sequence_of_the_models_own_chat_template(smollm: str) -> None:
    """The dataset's system and user messages unchanged (no duplicated question, no <action> instruction),
    then each whole reply and the env's own observation messages, through the model's template."""
    policy = chat_policy(smollm)
    env = SkyRLGymEnv("gsm8k_multi_turn", ROWS)
    twin = skyrl_gym.make("gsm8k_multi_turn", env_config={}, extras={"reward_spec": {}, "extra_info": {}, **ROWS[0]})
    messages, _ = twin.init(list(ROWS[0]["prompt"]))
    observation, info = env.reset(seed=0)
    history: list[tuple[str, str]] = []
    for reply in ("I think it is 6. #### 6", "Let me redo it: 2 + 3 = 5. #### 5"):
        expected = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
        assert policy.build_prompt(observation, info, history) == list(expected)
        text = policy.tokenizer.decode(policy.build_prompt(observation, info, history))
        assert text.count("what is 2 plus 3") == 1 and SYSTEM in text and "<action>" not in text
        history.append((observation, reply))
        observation, reward, terminated, _, info = env.step(reply)
        output = twin.step(reply)
        messages = [*messages, {"role": "assistant", "content": reply}, *output["observations"]]
        assert reward == output["reward"]
    assert terminated and reward == 1.0 and info["won"]  # the '#### 5' answer outside any tag reached the env
    env.close()


def test_the_whole_message_reaches_an_env_that_parses_its_own_format() -> None:
    reply = "<action>add them</action> so the answer is #### 5"
    parse = action_parser("auto")
    assert parse(reply, "message") == (reply, True)  # gsm8k's format: the env reads '#### 5' itself
    assert parse(reply, "tags") == ("add them", True)  # the paper's envs: the tagged command
    assert action_parser("tags")(reply, "message") == ("add them", True)
    rewards = {}
    for name in ("message", "tags"):
        env = SkyRLGymEnv("gsm8k_multi_turn", ROWS)
        env.reset(seed=0)
        rewards[name] = env.step(action_parser(name)(reply, SkyRLGymEnv.action_format)[0])[1]
        env.close()
    assert rewards == {"message": 1.0, "tags": 0.0}
    custom = action_parser("test_chat:last_number")
    assert custom("the answer is 12 apples", "tags") == ("12", True) and custom("none", "tags") == ("none", False)
    with pytest.raises(ValueError, match="names no function"):
        action_parser("test_chat:nope")


def last_number(reply: str) -> str | None:
    """A user parser for the test above: the last number of the reply."""
    numbers = [word for word in reply.split() if word.isdigit()]
    return numbers[-1] if numbers else None


def conversation_samples(policy: LLMPolicy, turns: int, history_length: int | None = None,
                         task: str = "find the key") -> list[ActionSample]:
    """The samples of one ``turns``-turn episode in a chat prompt (replies written here, ending in EOS)."""
    words = ["go north", "open the door", "take key", "look", "go south", "unlock door with key"]
    info = {"task": task, "messages": None, "action_format": "tags"}
    history: list[tuple[str, str]] = []
    samples = []
    if history_length is not None:
        policy.chat.history_length = history_length
    for t in range(turns):
        observation = f"you are in room {t} . you see a door"
        prompt = policy.build_prompt(observation, info, history)
        reply = f"<action>{words[t % len(words)]}</action>"
        action = policy.tokenizer.encode(reply, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
        samples.append(ActionSample(text=words[t % len(words)], prompt_ids=prompt, action_ids=action,
                                    candidate_ids=None, chosen=None, old_logprobs=torch.zeros(len(action)).numpy(),
                                    parsed=True, raw_text=reply))
        history.append((observation, reply))
    return samples


def test_one_pass_per_trajectory_equals_per_turn_scoring(model_path: str) -> None:
    policy = chat_policy(model_path)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.trainable_parameters():  # a non-trivial adapter
            p.add_(torch.randn_like(p) * 0.3)
    samples = conversation_samples(policy, 5) + conversation_samples(policy, 3, task="open the box")  # two episodes
    prompts, replies = [s.prompt_ids for s in samples], [s.action_ids for s in samples]
    groups = prefix_groups([p + r for p, r in zip(prompts, replies)])
    assert sorted(len(members) for members in groups.values()) == [3, 5]  # one pass per episode
    per_turn, per_turn_ent = score_rows(policy.model, prompts, replies, policy.pad_id, 0.7, 4096, with_entropy=True)
    one_pass, one_pass_ent = single_pass_logprobs(policy.model, prompts, replies, policy.pad_id, 0.7, 4096,
                                                  with_entropy=True)
    for a, b, ea, eb in zip(per_turn, one_pass, per_turn_ent, one_pass_ent):
        assert a.shape == b.shape and float((a - b).detach().abs().max()) <= 1e-5
        assert float((ea - eb).abs().max()) <= 1e-5
    # the policy's own update path takes the one-pass route in a chat prompt, with gradients
    logp, mask, _ = policy.evaluate_actions(samples)
    at_policy_temperature, _ = score_rows(policy.model, prompts, replies, policy.pad_id, policy.temperature, 4096)
    flat = torch.cat(at_policy_temperature)
    assert float((logp[mask] - flat).abs().max()) <= 1e-5
    logp[mask].sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_a_history_window_cuts_the_conversation_and_falls_back_to_per_turn_scoring(model_path: str) -> None:
    policy = chat_policy(model_path)
    samples = conversation_samples(policy, 4, history_length=1)
    prompts, replies = [s.prompt_ids for s in samples], [s.action_ids for s in samples]
    groups = prefix_groups([p + r for p, r in zip(prompts, replies)])
    # the first turn is still the start of the second; from then on the window drops the oldest turn
    assert sorted(map(sorted, groups.values())) == [[0, 1], [2], [3]]
    one_pass, _ = single_pass_logprobs(policy.model, prompts, replies, policy.pad_id, 1.0, 4096)
    per_turn, _ = score_rows(policy.model, prompts, replies, policy.pad_id, 1.0, 4096)
    assert all(float((a - b).abs().max()) <= 1e-5 for a, b in zip(one_pass, per_turn))


def test_chat_prompts_train_on_a_multi_turn_env_and_resume(model_path: str, tmp_path) -> None:
    from milegpo import MileGPO

    venv = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=2, seed=0, env_kwargs={"max_episode_steps": 4})
    model = MileGPO("LLMPolicy", venv, learning_rate=1e-2, kl_coef=0.0, seed=0, batch_size=8, policy_kwargs={
        "model": model_path, "mode": "generate", "prompt_format": "chat", "think": False, "history_length": 8,
        "max_new_tokens": 4})
    model.learn(total_timesteps=1)
    assert model.iterations == 1 and model.rollout_buffer.batch.num_steps > 4
    model.save(tmp_path / "ckpt")
    loaded = MileGPO.load(tmp_path / "ckpt", env=venv)
    assert loaded.policy.chat is not None and loaded.policy_config.prompt_format == "chat"
    venv.close()


def test_the_template_format_is_unchanged(model_path: str) -> None:
    """The default stays the paper's layout: one user message per step."""
    policy = chat_policy(model_path, prompt_format="template")
    text = policy.tokenizer.decode(policy.build_prompt("you see a door", {"task": "open it"}, [("hall", "go")]))
    assert text.count("<|im_start|>user") == 1 and "Your previous steps" in text and policy.chat is None
