"""Supervised warm start: behaviour cloning of a noisy scripted expert before RL.

Group RL learns from the differences inside a group of rollouts; a policy that starts
from scratch plays random rollouts, in which the states MileGPO looks for (milestones
that recur across the group) are rare. A pretrained LLM agent starts elsewhere: its
rollouts are structured and some succeed. This module gives a small policy such a
start. It plays ``episodes`` training tasks with the env's scripted expert
(:meth:`~milegpo.envs.TextEnv.expert_action`), taking a uniformly random admissible
command instead with probability ``epsilon`` at each step, and fine-tunes the policy
(its LoRA adapter, the same one RL then trains) to maximise the log-likelihood of the
commands that were taken. The policy so learns a mixture of expert and noise, and
``epsilon`` sets how good it starts: with ``epsilon = 1`` it imitates a random policy.

The demonstration tasks are the training split's seeds ``0 .. episodes-1``, the same
distribution RL trains on; held-out evaluation splits are never seen.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from milegpo.config.warm_start import WarmStartConfig
from milegpo.contracts import TrainablePolicy
from milegpo.envs.core import TextEnv
from milegpo.policies.sample import ActionSample, Turn


def collect_demonstrations(policy: TrainablePolicy, env: TextEnv, episodes: int, epsilon: float,
                           seed: int = 0) -> tuple[list[ActionSample], dict[str, float]]:
    """Play ``episodes`` tasks of ``env`` (a :class:`~milegpo.envs.TextEnv`) with the noisy expert.

    Every step taken becomes one sample (:meth:`LLMPolicy.demonstration`), with the
    history the policy would have seen. Returns the samples and the demonstrator's
    statistics: ``success_rate``, ``mean_length``, ``random_fraction`` (steps taken at random).
    """
    rng = np.random.default_rng(seed)
    samples: list[ActionSample] = []
    wins, random_steps = 0, 0
    for task in range(episodes):
        observation, info = env.reset(seed=task)
        history: list[Turn] = []
        done = False
        while not done:
            commands = list(info.get("admissible_commands") or [])
            if commands and rng.random() < epsilon:
                action, random_steps = commands[int(rng.integers(len(commands)))], random_steps + 1
            else:
                action = env.expert_action()
                if action is None:  # the expert has no move left: a random command keeps the episode going
                    if not commands:
                        break
                    action, random_steps = commands[int(rng.integers(len(commands)))], random_steps + 1
            samples.append(policy.demonstration(observation, info, history, action))
            history.append(Turn(observation, policy.history_text(samples[-1]), samples[-1]))
            observation, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        wins += bool(info.get("won"))
    return samples, {"success_rate": wins / episodes, "mean_length": len(samples) / episodes,
                     "random_fraction": random_steps / max(len(samples), 1)}


def behaviour_clone(policy: TrainablePolicy, samples: list[ActionSample], epochs: int, learning_rate: float,
                    batch_size: int, seed: int = 0, micro_batch_tokens: int | None = None) -> list[dict[str, float]]:
    """Fine-tune ``policy``'s trainable weights to maximise the log-likelihood of ``samples``.

    A fresh AdamW over :meth:`LLMPolicy.trainable_parameters`, shuffled minibatches of
    ``batch_size`` samples, the mean negative log-likelihood per unit (per candidate
    choice in choose mode, per reply token in generate mode), backpropagated by
    :func:`nll_backward` in micro-batches of ``micro_batch_tokens``. Returns one row per
    epoch: ``nll`` (the epoch's mean loss) and ``likelihood`` (its mean per-unit probability).
    """
    import torch as th  # the config and the collection above stay torch-free

    if not samples:
        raise ValueError("behaviour_clone needs at least one demonstration sample")
    optimizer = th.optim.AdamW(policy.trainable_parameters(), lr=learning_rate, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    policy.set_training_mode(True)
    history = []
    for _ in range(epochs):
        order = rng.permutation(len(samples))
        total, probability, units = 0.0, 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = [samples[i] for i in order[start:start + batch_size]]
            optimizer.zero_grad(set_to_none=True)
            nll, likely, n_units = nll_backward(policy, batch, micro_batch_tokens)
            optimizer.step()
            total, probability, units = total + nll * n_units, probability + likely, units + n_units
        history.append({"nll": total / units, "likelihood": probability / units})
    policy.set_training_mode(False)
    return history


def nll_backward(policy: TrainablePolicy, batch: list[ActionSample],
                 micro_batch_tokens: int | None = None) -> tuple[float, float, int]:
    """Backpropagate the mean negative log-likelihood per unit of the minibatch ``batch``.

    As in the RL update, it is scored in micro-batches of at most ``micro_batch_tokens``
    tokens whose gradients add up to the minibatch's, so a large model fits in memory
    (None: one pass). Returns the loss, the summed per-unit probability and the units.
    """
    import torch as th

    from milegpo.algos.buffer import split_by_tokens, step_tokens

    n_units = sum(len(sample.old_logprobs) for sample in batch)  # the minibatch's, over its micro-batches
    rows = np.arange(len(batch))
    tokens = np.array([step_tokens(sample) for sample in batch])
    loss_sum, probability = 0.0, 0.0
    for micro in split_by_tokens(rows, tokens, micro_batch_tokens) if micro_batch_tokens else [rows]:
        logp, mask, _ = policy.evaluate_actions([batch[i] for i in micro])
        loss = -(logp * mask).sum() / n_units
        if not th.isfinite(loss):
            raise FloatingPointError("the warm start's loss is not finite; lower warm_start.learning_rate")
        loss.backward()
        loss_sum += loss.item()
        probability += float((logp.detach().exp() * mask).sum())
    return loss_sum, probability, n_units


def warm_start(policy: TrainablePolicy, env: TextEnv, config: WarmStartConfig,
               micro_batch_tokens: int | None = None) -> dict[str, Any]:
    """Collect the noisy expert's demonstrations on ``env`` and clone them into ``policy``
    (in micro-batches of ``micro_batch_tokens``, see :func:`behaviour_clone`).

    Returns a report (saved by ``milegpo train`` as the run folder's ``warm_start.json``):
    the config, the demonstrator's statistics, the per-epoch fit and the seconds taken.
    """
    seed = config.seed or 0
    started = time.perf_counter()
    samples, demonstrator = collect_demonstrations(policy, env, config.episodes, config.epsilon, seed)
    collected = time.perf_counter()
    epochs = behaviour_clone(policy, samples, config.epochs, config.learning_rate, config.batch_size, seed,
                             micro_batch_tokens)
    return {"config": dataclasses.asdict(config), "demonstrator": demonstrator, "steps": len(samples),
            "epochs": epochs, "collect_seconds": collected - started,
            "fit_seconds": time.perf_counter() - collected}
