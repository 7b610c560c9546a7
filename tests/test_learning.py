"""Learning test: MileGPO trains a tiny LM on House (choose mode) above the untrained policy
on held-out tasks (the ``eval_id`` split), on a CPU in a few minutes.

Choose mode scores a candidate command by the *mean* of its token log-probs here
(``candidate_score="mean"``). With the sum (the default) a randomly initialised LM
gives every extra token about -6 nats, so it picks the shortest command ("look",
"go x") almost surely and never explores "unlock ... with ...": measured, 0 wins
in 640 training episodes at temperature 5 and 0/50 held-out tasks after training.
The mean keeps the untrained policy close to uniform over the candidates, and it
is still the exact sampling distribution (training re-scores the same way).

Held-out success is measured with sampled actions at the training temperature on
all 50 ``eval_id`` tasks x 4 copies (200 episodes). Greedy success is printed too but
not asserted: without history in the prompt a greedy policy repeats itself in loops
of rooms (measured 0.02 before, 0.00-0.10 after, depending on the run length).
Measured here (2 shared cores): 0.065 -> 0.180 after 61 iterations / 54k env
steps in 80 s (about 680 env steps/s); the whole test takes about 1.5 minutes.
"""

from __future__ import annotations

import time

import torch as th

from milegpo.algos import MileGPO, evaluate
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env
from milegpo.policies import tiny_model

HORIZON = 30
EVAL_TASKS = 50
EVAL_COPIES = 4
EVAL_TEMPERATURE = 1.0  # the training temperature
TRAIN_STEPS = 54_000  # about 60 iterations of 8 tasks x 4 copies


def held_out(model, greedy_env, sampled_env) -> tuple[float, float]:
    greedy = evaluate(model, greedy_env, n_episodes=EVAL_TASKS)
    sampled = evaluate(model, sampled_env, n_episodes=EVAL_TASKS, deterministic=False, temperature=EVAL_TEMPERATURE)
    return greedy["success_rate"], sampled["success_rate"]


def test_milegpo_learns_house_and_generalises_to_held_out_tasks(tmp_path) -> None:
    threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        path = tiny_model(HouseEnv.vocabulary(), tmp_path / "lm", hidden_size=32, num_layers=1, num_heads=2, seed=0)
        env = make_vec_env(HouseEnv, n_tasks=8, group_size=4, seed=0, env_kwargs={"max_episode_steps": HORIZON})
        eval_kwargs = {"split": "eval_id", "max_episode_steps": HORIZON}
        greedy_env = make_vec_env(HouseEnv, n_tasks=EVAL_TASKS, group_size=1, env_kwargs=eval_kwargs)
        sampled_env = make_vec_env(HouseEnv, n_tasks=EVAL_TASKS, group_size=EVAL_COPIES, env_kwargs=eval_kwargs)
        model = MileGPO(
            "LLMPolicy", env, learning_rate=3e-3, ent_coef=0.0, kl_coef=0.0, batch_size=64, seed=0,
            policy_kwargs={"model": path, "mode": "choose", "history_length": 0, "prompt_template": "{observation}",
                           "candidate_score": "mean", "lora": {"r": 16, "alpha": 32}},
        )  # fmt: skip
        greedy_before, sampled_before = held_out(model, greedy_env, sampled_env)
        start = time.perf_counter()
        model.learn(total_timesteps=TRAIN_STEPS)
        train_time = time.perf_counter() - start
        greedy_after, sampled_after = held_out(model, greedy_env, sampled_env)
        print(f"\nheld-out (eval_id) success, sampled at T={EVAL_TEMPERATURE} x{EVAL_COPIES}: "
              f"{sampled_before:.3f} -> {sampled_after:.3f}; greedy: {greedy_before:.2f} -> {greedy_after:.2f}; "
              f"{model.num_timesteps} env steps, {model._iterations} iterations in {train_time:.0f} s "
              f"({model.num_timesteps / train_time:.0f} env steps/s)")
        assert sampled_after >= max(sampled_before + 0.08, 2 * sampled_before)
    finally:
        th.set_num_threads(threads)
