"""Token in, token out in the chat format: each turn's prompt is the previous turn's prompt, the ids the
policy sampled and the template's ids after them, never the re-tokenised text of a reply."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from milegpo.algos.buffer import continues
from milegpo.algos.rollout import RolloutStep, play_episodes
from milegpo.envs import make_vec_env
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy
from milegpo.policies.conversation import prefix_groups
from milegpo.policies.prompts import ChatPromptBuilder
from milegpo.policies.sample import ActionSample, Turn

TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move to a room.",
                                           "parameters": {"type": "object", "properties": {"room": {"type": "string"}},
                                                          "required": ["room"]}}}]


def chat_policy(model: str, **settings: Any) -> LLMPolicy:
    settings = {"mode": "generate", "prompt_format": "chat", "think": False, "history_length": 10,
                "max_new_tokens": 12, "max_prompt_tokens": 1 << 20, "device": "cpu", **settings}
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model, **settings)


def rollout(policy: LLMPolicy, turns: int) -> dict[int, list[ActionSample]]:
    """A real generate-mode rollout of 8 House envs (2 tasks x 4), ``turns`` steps each: each env's samples."""
    venv = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=4, seed=0,
                        env_kwargs={"max_episode_steps": turns})
    per_env: dict[int, list[ActionSample]] = {i: [] for i in range(venv.num_envs)}

    def record(step: RolloutStep) -> None:
        for k, i in enumerate(step.active):
            per_env[int(i)].append(step.samples[k])

    play_episodes(policy, venv, venv.reset(), venv.reset_infos, deterministic=False, on_step=record)
    venv.close()
    return per_env


@pytest.fixture(scope="module")
def smollm() -> str:
    from milegpo.policies import smollm2_path

    return smollm2_path()


def builder_with_template(smollm: str, template: str) -> ChatPromptBuilder:
    """A chat prompt builder on SmolLM2's tokenizer with ``template`` as its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm)
    tokenizer.chat_template = template
    return ChatPromptBuilder(tokenizer, "Answer.", history_length=4, max_prompt_tokens=4096,
                             stop_ids=[tokenizer.eos_token_id])


def test_a_real_chat_rollout_grows_every_prompt_from_the_sampled_ids(model_path: str, one_torch_thread) -> None:
    """The offline tiny model's word-level tokenizer does not round-trip its own replies (re-rendered as text,
    only 1 of 72 turns continued the one before); appended from ids, every turn does, and the one-pass
    scoring of the update reads each 10-turn trajectory in one pass."""
    policy = chat_policy(model_path)
    per_env = rollout(policy, turns=10)
    samples = [s for episode in per_env.values() for s in episode]
    assert [len(episode) for episode in per_env.values()] == [10] * 8
    pairs = [(a, b) for episode in per_env.values() for a, b in zip(episode, episode[1:])]
    assert all(continues(a, b) for a, b in pairs)
    # the tokenizer does not round-trip these replies: re-encoding the decoded reply gives other ids
    assert any(policy.tokenizer.encode(s.raw_text, add_special_tokens=False) != s.action_ids[:-1] for s in samples)
    # the same histories as plain text pairs are rendered as text: those prompts no longer continue
    episode = per_env[0]
    history = [(f"obs {t}", s.raw_text) for t, s in enumerate(episode[:-1])]
    texts = [t for t, _ in history[1:]] + ["last"]
    info = {"task": "find it", "action_format": "tags"}
    rebuilt = [policy.chat.build("find it", texts[t - 1] if t else "first", history[:t], info)
               for t in range(len(history))]
    assert not any(rebuilt[t + 1][: len(rebuilt[t]) + len(episode[t].action_ids)] == rebuilt[t] + episode[t].action_ids
                   for t in range(len(rebuilt) - 1))
    # one pass per trajectory: each carrier is an episode's last turn and holds all its turns
    groups = prefix_groups([list(s.prompt_ids) + list(s.action_ids) for s in samples])
    assert sorted(len(members) for members in groups.values()) == [10] * 8


def test_the_update_scores_the_sampled_ids_with_the_samplers_log_probs(model_path: str, one_torch_thread) -> None:
    """Before any update, the trainer's log-probs of the ids of a recorded multi-turn episode (scored in one
    pass over each conversation) equal the HF sampler's within 1e-5."""
    policy = chat_policy(model_path, max_new_tokens=8)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.trainable_parameters():  # a non-trivial adapter
            p.add_(torch.randn_like(p) * 0.1)
    samples = [s for episode in rollout(policy, turns=4).values() for s in episode]
    logp, mask, _ = policy.evaluate_actions(samples)
    for row, sample in enumerate(samples):
        assert int(mask[row].sum()) == len(sample.action_ids)
        np.testing.assert_allclose(logp[row, mask[row]].detach().numpy(), sample.old_logprobs, atol=1e-5)


def test_appended_prompts_equal_the_templates_render_when_replies_round_trip(smollm: str) -> None:
    """With SmolLM2's BPE tokenizer and replies that are their own text's tokens, the appended prompt is the
    chat template's render of the conversation: for replies ended by the stop token and replies cut short
    (the template's end of turn is added), with a history window, and with tool schemas and tool messages."""
    policy = chat_policy(smollm, history_length=3)
    tokenizer, chat = policy.tokenizer, policy.chat
    assert chat is not None
    replies = ["<action>go north</action>", "I will open it. <action>open the door</action>", "<action>look",
               "<action>take the key</action>", "Done.  "]
    for info in ({"task": "find the key", "action_format": "tags"},
                 {"task": "", "action_format": "tools", "tools": TOOLS, "observation_role": "tool"}):
        history: list[Turn] = []
        for t, reply in enumerate(replies):
            observation = f"You are in room {t}.\nYou see a door and  a key ."
            prompt = policy.build_prompt(observation, info, history)
            expected = chat.encode(chat.messages(info["task"], observation, history, info),
                                   info.get("tools"))  # type: ignore[arg-type]
            assert prompt == expected, (t, info["action_format"])
            ids = tokenizer.encode(reply, add_special_tokens=False)
            if t % 2 == 0:  # stopped by the end-of-turn token; else cut at max_new_tokens
                ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
            sample = ActionSample(text=reply, prompt_ids=prompt, action_ids=ids, candidate_ids=None, chosen=None,
                                  old_logprobs=np.zeros(len(ids), np.float32), parsed=True, raw_text=reply)
            history.append(Turn(observation, reply, sample))


def test_a_template_that_rewrites_earlier_turns_is_rendered_as_text(smollm: str) -> None:
    """A template whose render of a turn depends on the conversation around it (here: the turn count in every
    message, and the system prompt moved to the end) cannot be grown by appending: the prompt is the
    template's own render, as without sampled ids."""
    counted = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' of ' + messages|length|string + '\n' + "
               "m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|im_start|>assistant\n' }}{% endif %}")
    builder = builder_with_template(smollm, counted)
    tokenizer = builder.tokenizer
    info = {"task": "t"}
    history: list[Turn] = []
    for t in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prompt = builder.build("t", f"obs {t}", history, info)
        assert [str(w.message) for w in caught if "turn by turn" in str(w.message)] == (
            ["the chat template does not render a conversation turn by turn (what follows a reply depends on the "
             "earlier turns, or an earlier turn changes when one is added): its prompts are rendered from the "
             "conversation's text, so earlier replies reach the model re-tokenised and each turn is scored on its "
             "own"] if t == 1 else [])  # said once, when the first reply is to be shown
        assert prompt == builder.encode(builder.messages("t", f"obs {t}", history, info))
        ids = [*tokenizer.encode("an odd reply", add_special_tokens=False), 7]  # not the text's own ids
        sample = ActionSample(text="x", prompt_ids=prompt, action_ids=ids, candidate_ids=None, chosen=None,
                              old_logprobs=np.zeros(len(ids), np.float32), parsed=True, raw_text="an odd reply")
        history.append(Turn(f"obs {t}", "an odd reply", sample))
    assert builder.turn_ids is not None and not builder.turn_ids.turn_by_turn(None, ["user"])


def test_a_turn_is_its_pair_and_keeps_its_sample_through_pickle() -> None:
    sample = ActionSample(text="a", prompt_ids=[1, 2], action_ids=[3], candidate_ids=None, chosen=None,
                          old_logprobs=np.zeros(1, np.float32), parsed=True)
    turn = Turn("obs", "act", sample)
    observation, action = turn
    assert (observation, action) == ("obs", "act") and tuple(turn) == ("obs", "act") and turn == ("obs", "act")
    copy = pickle.loads(pickle.dumps(turn))
    assert type(copy) is Turn and copy == turn and copy.sample is not None and copy.sample.prompt_ids == [1, 2]
    assert Turn("o", "a").sample is None


def test_a_template_that_drops_earlier_reasoning_is_rendered_as_text(smollm: str) -> None:
    """A template that keeps only the answer of replies before the last user message (Qwen3's does) would not
    show the model its appended reasoning: it is detected and the prompt is the template's own render."""
    builder = builder_with_template(smollm, (
        "{% for m in messages %}{% set content = m['content'] %}"
        "{% if m['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}"
        "{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"))
    tokenizer = builder.tokenizer
    reply = "<think>the door is north</think><action>go north</action>"
    ids = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
    first = builder.build("t", "obs 0", [], {})
    sample = ActionSample(text="go north", prompt_ids=first, action_ids=ids, candidate_ids=None, chosen=None,
                          old_logprobs=np.zeros(len(ids), np.float32), parsed=True, raw_text=reply)
    history = [Turn("obs 0", reply, sample)]
    with pytest.warns(UserWarning, match="turn by turn"):
        prompt = builder.build("t", "obs 1", history, {})
    assert prompt == builder.encode(builder.messages("t", "obs 1", history, {}))
    assert "the door is north" not in tokenizer.decode(prompt)


def test_a_template_that_keeps_state_across_tool_outputs_is_rendered_as_text(smollm: str) -> None:
    """A template that renders a tool output differently after an earlier one (DeepSeek-V3's opens a block of
    outputs once, until an assistant message with tool calls) changes what follows a reply with the turns before
    it: the probe of an earlier turn ending in a tool output finds it, and the prompt is rendered as text."""
    builder = builder_with_template(smollm, (
        "{% set ns = namespace(first=true) %}{% for m in messages %}"
        "{% if m['role'] == 'tool' %}{% if ns.first %}{{ '<outputs>' }}{% set ns.first = false %}{% else %}"
        "{{ '\n' }}{% endif %}{{ '<output>' + m['content'] + '</output>' }}"
        "{% else %}{% if m.get('tool_calls') %}{% set ns.first = true %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"))
    assert builder.turn_ids is not None
    with pytest.warns(UserWarning, match="turn by turn"):
        assert not builder.turn_ids.turn_by_turn(None, ["tool"])
    assert builder.turn_ids.turn_by_turn(None, ["user"])  # its user turns do render turn by turn


def test_the_current_observation_is_shown_when_no_past_turn_is(model_path: str) -> None:
    """With no past turn shown (``history_length=0``, or a budget that leaves none) the prompt shows the task and
    the current observation, not the episode's first one; a budget that drops every past turn says so once."""
    policy = chat_policy(model_path, history_length=0)
    info = {"task": "find the key", "action_format": "tags"}
    first = policy.build_prompt("you are in the hall", info, [])
    sample = ActionSample(text="go north", prompt_ids=first, action_ids=[5, 6], candidate_ids=None, chosen=None,
                          old_logprobs=np.zeros(2, np.float32), parsed=True, raw_text="<action>go north</action>")
    history = [Turn("you are in the hall", sample.raw_text, sample)]
    later = policy.tokenizer.decode(policy.build_prompt("you are in the kitchen", info, history))
    assert "kitchen" in later and "hall" not in later
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "you are in the hall"}]
    messages = policy.chat.messages("", "you are in the kitchen", history, {"messages": opening}, k=0)
    assert messages == [*opening, {"role": "user", "content": "you are in the kitchen"}]
    tight = chat_policy(model_path, history_length=4)
    tight.chat.max_prompt_tokens = len(tight.build_prompt("you are in the kitchen", info, [])) + 2
    with pytest.warns(UserWarning, match="shows the opening and the current observation only"):
        cut = tight.tokenizer.decode(tight.build_prompt("you are in the kitchen", info, history))
    assert "kitchen" in cut and "hall" not in cut
