"""The choice lists of milegpo's settings, in one place (torch-free: the config, the CLI and the
policy all check against these) and the one check that spans two settings."""

from __future__ import annotations

#: LLMPolicy action modes: the model writes a reply ("generate") or picks a listed command ("choose")
MODES = ("choose", "generate")
#: choose mode: score a command by the sum or the mean of its token log-probs
CANDIDATE_SCORES = ("sum", "mean")
#: generate mode: who samples the replies, the trainer's model ("hf") or a colocated vLLM engine
ROLLOUT_BACKENDS = ("hf", "vllm")
#: how a step's prompt is laid out: one templated user message, or the episode as one conversation
PROMPT_FORMATS = ("template", "chat")
#: how a generated reply becomes the env's action (besides a "module:function" of one's own)
ACTION_PARSERS = ("auto", "tags", "message", "tools")
#: how the update averages the loss over a minibatch's units (generated tokens or choices)
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
#: where the PPO importance ratio is taken: per token, or once per action (the geometric mean of its tokens' ratios)
RATIO_LEVELS = ("token", "action")
#: how a rollout plays: policy and envs in turns ("lockstep"), or envs stepping while the policy acts
#: for others ("async", envs in worker processes)
ROLLOUT_MODES = ("lockstep", "async")
#: per-env MileGPO hyperparameter presets (the paper's values; milegpo.credit.milegpo holds them)
CREDIT_PRESETS = ("alfworld", "webshop")
#: the trackers ``run.report_to`` accepts beside progress.csv and stdout, which are always on
TRACKERS = ("tensorboard", "wandb", "mlflow")
#: the eval split of an env without splits: the training distribution on seeds training never draws
HELD_OUT_SPLIT = "held_out"
#: training draws task seeds below this (when the env has no finite task list); the seeds from here on
#: are the held-out tasks of an env without splits (the eval split :data:`HELD_OUT_SPLIT`)
HELD_OUT_SEEDS_START = 2**30


def check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    """``ValueError`` naming the setting and its choices unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def parse_report_to(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"tensorboard,wandb"`` or a list -> checked tracker names; ``"none"`` -> []."""
    names = [n.strip().lower() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    if names == ["none"]:
        return []
    unknown = sorted(set(names) - set(TRACKERS))
    if unknown:
        raise ValueError(f"run.report_to: unknown tracker(s) {unknown}; choose from {list(TRACKERS)} or 'none'")
    return list(dict.fromkeys(names))


def check_backend_for_mode(rollout_backend: str, mode: str) -> None:
    """vLLM samples generate-mode replies only: choose mode scores candidates with the trainer's model."""
    if rollout_backend != "hf" and mode != "generate":
        raise ValueError(f"policy.sampler.backend {rollout_backend!r} samples generate-mode replies; choose mode "
                         "scores the candidates with the trainer's model: use policy.mode=generate or "
                         "policy.sampler.backend=hf")
