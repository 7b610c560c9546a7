"""What an algorithm trains when no model is given: the CPU demo's setting, on any machine.

``MileGPO("LLMPolicy", env).learn()`` names no model. Rather than stop (or wait on a model hub
that may not be reachable), the algorithm trains what ``milegpo train`` trains with no
arguments: the ``cpu-demo`` preset's algorithm and policy settings with an offline tiny LM
whose vocabulary is the env's own texts, built once into the cache folder
(:func:`milegpo.policies.tiny.cached_env_tiny_model`). Every setting the caller gave keeps the
caller's value; one line says what was chosen and how to train a real LM instead.

``choose`` mode needs the env to list its admissible commands: a free-text env without a model
gets one error naming the settings to pass.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from milegpo.config import AlgoConfig, PolicyConfig, TinyModelConfig
from milegpo.config.fields import from_dict, to_dict
from milegpo.config.presets import DEMO_PRESET, preset_section
from milegpo.envs.vec_env import GroupedTextVecEnv

#: environment variable: the env steps ``learn()`` trains when called without ``total_timesteps``
BUDGET_VARIABLE = "MILEGPO_TOTAL_TIMESTEPS"
#: what to pass for a real LM (the paper's model)
REAL_MODEL_HINT = "policy_kwargs={'model': 'Qwen/Qwen2.5-1.5B-Instruct'} (a hub name or a local folder)"


def explicit_fields(given: object, defaults: object) -> set[str]:
    """The fields a caller set: a mapping's keys, or a config's fields that differ from ``defaults``."""
    if isinstance(given, dict):
        return set(given)
    if not dataclasses.is_dataclass(given):  # None: the caller set nothing
        return set()
    return {f.name for f in dataclasses.fields(given) if getattr(given, f.name) != getattr(defaults, f.name)}


def demo_budget() -> int:
    """The env steps of the demo (``run.total_timesteps`` of the ``cpu-demo`` preset)."""
    return int(preset_section(DEMO_PRESET, "run")["total_timesteps"])


def default_budget(offline: bool) -> int:
    """What ``learn()`` trains without ``total_timesteps``: ``$MILEGPO_TOTAL_TIMESTEPS`` when set,
    else the demo's budget for the offline setting; ``TypeError`` otherwise (SB3's ``learn`` needs one)."""
    value = os.environ.get(BUDGET_VARIABLE)
    if value is not None:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{BUDGET_VARIABLE} must be a positive integer (env steps), got {value!r}")
        return int(value)
    if offline:
        return demo_budget()
    raise TypeError("learn() needs total_timesteps (env steps to train), e.g. model.learn(100_000), or set "
                    f"{BUDGET_VARIABLE}")


def offline_setting(env: GroupedTextVecEnv, algo: AlgoConfig, algo_given: set[str], policy: PolicyConfig,
                    policy_given: set[str], seed: int | None) -> tuple[AlgoConfig, PolicyConfig]:
    """The demo's algorithm and policy settings under the caller's (``*_given``: the fields the
    caller set), with the offline tiny model of ``env``; prints the one line saying so."""
    from milegpo.envs.vocabulary import env_texts
    from milegpo.policies.tiny import cached_env_tiny_model

    name = env.env_name
    demo_policy = {k: v for k, v in preset_section(DEMO_PRESET, "policy").items() if k not in policy_given}
    policy = from_dict(PolicyConfig, {**to_dict(policy), **demo_policy}, "policy")
    sample = env.env_fn()
    try:
        if policy.mode == "choose":
            _check_lists_commands(sample, name)
        texts = env_texts(sample, name, seed=seed or 0)
    finally:
        sample.close()
    model = cached_env_tiny_model(texts, TinyModelConfig(), seed=seed or 0)
    demo_algo = {k: v for k, v in preset_section(DEMO_PRESET, "algo").items() if k not in algo_given}
    algo = from_dict(AlgoConfig, {**to_dict(algo), **demo_algo}, "algo")
    changed = ", ".join(f"{k}={v}" for k, v in {**demo_algo, **demo_policy}.items())
    import torch

    torch.set_num_threads(1)  # the tiny model's small matmuls gain nothing from more; on a loaded machine they cost
    print(f"No model given: training the {DEMO_PRESET} setting on {name}, an offline tiny LM built from the env's "
          f"texts ({model}) with {changed}, on 1 torch thread (torch.set_num_threads to change). For a real LM "
          f"pass {REAL_MODEL_HINT}.", file=sys.stderr)
    return algo, dataclasses.replace(policy, model=model)


def _check_lists_commands(env: Any, name: str) -> None:
    """The offline setting scores admissible commands: refuse, with what to pass, an env listing none."""
    _, info = env.reset(seed=0)
    if not info.get("admissible_commands"):
        raise ValueError(f"no model given and {name} lists no admissible commands, so the offline demo setting "
                         f"(a tiny LM choosing among commands) cannot play it: pass {REAL_MODEL_HINT} with "
                         "policy_kwargs mode='generate' (the paper's setting)")
