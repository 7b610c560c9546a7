"""Evaluation on held-out tasks: run the (greedy) policy on an eval split, task by task.

Use a :class:`~milegpo.envs.vec_env.GroupedTextVecEnv` built on the eval split,
e.g. ``make_vec_env("milegpo/House-v0", n_tasks=8, group_size=1,
env_kwargs={"split": "eval_id"})``. Tasks are given by their seeds (by the
TextEnv convention seed ``s`` is task ``s % num_tasks`` of the split, so
``n_episodes=n`` evaluates seeds ``0..n-1``: the first ``n`` tasks of the split). An env without
task splits is evaluated on its held-out seeds (``2**30`` up), which training never draws.
Tasks are run ``env.n_tasks`` at a time.

``group_size`` 1 is the usual choice: a greedy policy on a deterministic env plays
the same episode in every copy. With ``group_size`` > 1 all copies of each task are
played and counted as episodes (useful with ``deterministic=False`` or stochastic
envs); a task's ``success`` is then the mean over its copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from milegpo.algos.rollout import RolloutStep, play_episodes
from milegpo.contracts import ActingPolicy
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.options import HELD_OUT_SEEDS_START


@runtime_checkable
class HasPolicy(Protocol):
    """An algorithm, as evaluation sees it: something with an acting ``policy``."""

    @property
    def policy(self) -> ActingPolicy: ...


def _policy_of(model: HasPolicy | ActingPolicy) -> ActingPolicy:
    """The policy of an algorithm, or the policy itself."""
    return model.policy if isinstance(model, HasPolicy) else model


def run_episodes(policy: ActingPolicy, env: GroupedTextVecEnv, task_seeds: Sequence[int], deterministic: bool = True,
                 temperature: float | None = None, seed: int | None = None,
                 progress: bool = False) -> list[dict[str, Any]]:
    """Play every copy of each task in ``task_seeds`` once; one result dict per episode
    (``task_seed``, ``won``, ``return``, ``length``, ``score``, ``invalid_actions``, ``env_error``).

    ``temperature`` (sampled actions only) replaces the policy's sampling temperature
    for these episodes (the paper evaluates at 0.4, trains at 1.0). ``seed`` seeds the
    sampled actions of these episodes (the policy's own generators continue untouched
    afterwards), so the same weights, tasks and seed give the same result.
    ``progress`` shows a progress bar over the tasks.
    """
    sampling = policy.seeded_sampling(seed) if seed is not None else contextlib.nullcontext()
    with sampling:
        return _run_episodes(policy, env, task_seeds, deterministic, temperature, progress)


def _run_episodes(policy: ActingPolicy, env: GroupedTextVecEnv, task_seeds: Sequence[int], deterministic: bool,
                  temperature: float | None, progress: bool) -> list[dict[str, Any]]:
    if not isinstance(env, GroupedTextVecEnv):
        raise TypeError("evaluation needs a GroupedTextVecEnv: make one with milegpo.make_vec_env(env_id, n_tasks, "
                        "group_size=1, env_kwargs={'split': 'eval_id'})")
    if temperature is not None and (deterministic or temperature <= 0):
        raise ValueError("temperature applies to sampled actions (deterministic=False) and must be > 0")
    was_training = bool(getattr(policy, "training", False))  # a torch module's flag, where there is one
    policy.set_training_mode(False)
    train_temperature = policy.temperature
    if temperature is not None:
        policy.temperature = float(temperature)
    results: list[dict[str, Any]] = []
    seeds = [int(s) for s in task_seeds]
    # disable=None: no bar when stderr is no terminal (a log file would hold the bar's redraws on the result's line)
    bar = tqdm(total=len(seeds), desc="eval", unit="task", disable=None if progress else True, leave=False)
    try:
        for start in range(0, len(seeds), env.n_tasks):
            chunk = seeds[start : start + env.n_tasks]
            obs = env.reset_groups(chunk)
            infos = [dict(info) for info in env.reset_infos]
            n = len(chunk) * env.group_size
            episodes = [{"task_seed": chunk[int(env.group_ids[i])], "won": False, "return": 0.0, "length": 0,
                         "score": 0.0, "invalid_actions": 0, "env_error": infos[i].get("env_error")} for i in range(n)]
            def record(step: RolloutStep, episodes: list[dict[str, Any]] = episodes) -> None:
                for i in step.active:
                    ep, info = episodes[i], step.new_infos[i]
                    if info.get("env_error") is not None:
                        ep["env_error"] = info["env_error"]
                        continue
                    ep["return"] += float(step.rewards[i])
                    ep["length"] += 1
                    ep["invalid_actions"] += not info.get("valid_action", True)
                    if step.dones[i]:
                        ep["won"], ep["score"] = bool(info.get("won", False)), float(info.get("score", 0.0))

            play_episodes(policy, env, obs, infos, deterministic=deterministic, on_step=record)
            results.extend(episodes)
            bar.update(len(chunk))
    finally:
        bar.close()
        policy.temperature = train_temperature
        policy.set_training_mode(was_training)
    return results


def default_task_seeds(env: GroupedTextVecEnv, n: int) -> list[int]:
    """The ``n`` task seeds an evaluation of ``env`` plays when none are given: ``0..n-1`` (the first tasks of
    its split) when the env has task splits, else the held-out seeds ``HELD_OUT_SEEDS_START + i`` that
    training never draws (what ``milegpo train`` / ``milegpo eval`` evaluate as the split ``held_out``)."""
    start = 0 if getattr(env, "has_task_splits", True) else HELD_OUT_SEEDS_START
    return list(range(start, start + n))


def evaluate(model: HasPolicy | ActingPolicy, env: GroupedTextVecEnv, n_episodes: int | None = None,
             task_seeds: Sequence[int] | None = None, deterministic: bool = True,
             temperature: float | None = None, seed: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Success rate, mean return and length of ``model`` on the tasks of ``env``'s split.

    :param model: an algorithm (its ``.policy`` is used) or a policy with ``act``.
    :param env: a GroupedTextVecEnv on the eval split (see the module docstring).
    :param n_episodes: evaluate ``n_episodes`` tasks: seeds ``0..n_episodes-1`` (the first tasks of the split)
        of an env with task splits, the held-out seeds of one without (:func:`default_task_seeds`).
    :param task_seeds: explicit task seeds instead of ``n_episodes``.
    :param deterministic: greedy actions (True) or sampled ones.
    :param temperature: sampled actions only: the sampling temperature of the evaluation
        (default: the policy's own).
    :param seed: seed of the sampled actions (None: the policy's running generators, so
        the result depends on what was sampled before).
    :param progress: show a progress bar over the tasks.
    :return: an :class:`EvaluationResult` (a dict): ``success_rate``, ``mean_return``,
        ``mean_length``, ``mean_score``, ``invalid_action_rate``, ``env_errors``, ``n_episodes``
        (episodes played), ``sampling`` (``"greedy"`` or ``"sampled at T=..."``) and ``per_task``:
        one dict per task seed (``task_seed``, ``success``, ``return``, ``length``, ``score``,
        means over the task's copies).

    Greedy by default, as SB3's ``evaluate_policy``; ``milegpo train`` and ``milegpo eval``
    sample at the run's ``eval_temperature`` instead (the paper's protocol, 0.4 there), with a
    fixed seed per split: pass ``deterministic=False, temperature=..., seed=...`` for their numbers.
    """
    if (n_episodes is None) == (task_seeds is None):
        raise ValueError("give exactly one of n_episodes (the first n tasks, or n held-out seeds) or task_seeds")
    seeds = default_task_seeds(env, int(n_episodes or 0)) if task_seeds is None else [int(s) for s in task_seeds]
    if not seeds:
        raise ValueError("nothing to evaluate: no task seeds")
    episodes = run_episodes(_policy_of(model), env, seeds, deterministic, temperature, seed, progress)
    per_task = []
    for seed in dict.fromkeys(seeds):
        eps = [e for e in episodes if e["task_seed"] == seed]
        per_task.append({"task_seed": seed, "success": float(np.mean([e["won"] for e in eps])),
                         "return": float(np.mean([e["return"] for e in eps])),
                         "length": float(np.mean([e["length"] for e in eps])),
                         "score": float(np.mean([e["score"] for e in eps]))})
    steps = sum(e["length"] for e in episodes)
    policy_temperature = getattr(_policy_of(model), "temperature", None)
    sampled_at = temperature if temperature is not None else policy_temperature
    return EvaluationResult({
        "success_rate": float(np.mean([e["won"] for e in episodes])),
        "mean_return": float(np.mean([e["return"] for e in episodes])),
        "mean_length": float(np.mean([e["length"] for e in episodes])),
        "mean_score": float(np.mean([e["score"] for e in episodes])),
        "invalid_action_rate": sum(e["invalid_actions"] for e in episodes) / max(steps, 1),
        "env_errors": sum(e["env_error"] is not None for e in episodes),
        "n_episodes": len(episodes),
        "sampling": "greedy" if deterministic else (
            "sampled" if sampled_at is None else f"sampled at T={sampled_at:g}"),
        "per_task": per_task,
    })


class EvaluationResult(dict):
    """What :func:`evaluate` returns: a plain dict, printed as one line (``per_task`` summarised)."""

    def __repr__(self) -> str:
        return (f"EvaluationResult(success_rate={self['success_rate']:.3f}, mean_return={self['mean_return']:.3f}, "
                f"mean_length={self['mean_length']:.1f}, n_episodes={self['n_episodes']}, {self['sampling']}, "
                f"per_task=[{len(self['per_task'])} tasks])")

    __str__ = __repr__


def evaluate_policy(model: HasPolicy | ActingPolicy, env: GroupedTextVecEnv, n_eval_episodes: int = 10,
                    deterministic: bool = True, return_episode_rewards: bool = False,
                    ) -> tuple[float, float] | tuple[list[float], list[int]]:
    """SB3's ``evaluate_policy`` for text agents: ``(mean_reward, std_reward)`` over the
    episodes of ``n_eval_episodes`` tasks (:func:`default_task_seeds`; all copies), or the per-episode
    rewards and lengths with ``return_episode_rewards=True``."""
    episodes = run_episodes(_policy_of(model), env, default_task_seeds(env, n_eval_episodes), deterministic)
    rewards = [e["return"] for e in episodes]
    if return_episode_rewards:
        return rewards, [e["length"] for e in episodes]
    return float(np.mean(rewards)), float(np.std(rewards))
