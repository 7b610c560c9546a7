"""Training runs: one config in, one run folder out (what ``milegpo train`` does).

A run folder holds everything needed to read, plot, evaluate or resume the run::

    RUN_DIR/
      config.json              the full TrainConfig (resume and eval read it)
      base_model/              the offline tiny model, when no --model was given
      progress.csv             SB3's per-iteration log (rollout/*, train/*, credit/*, eval/*)
      events.out.tfevents.*    the same numbers for TensorBoard
      credit_diagnostics.jsonl milestones/traps of every update (the trainer writes it)
      eval.jsonl               held-out success during training (EvalCallback)
      checkpoints/             periodic checkpoints (a killed run resumes from the last)
      final/                   the final checkpoint (LoRA adapter + optimizer + counters)
      eval_final.json          held-out success per eval split at the end
      learning_curve.png, credit_diagnostics.png

The defaults of :class:`TrainConfig` are the CPU demo: MileGPO in ``choose`` mode,
a tiny offline model (hidden size 32, one layer), the built-in House env, a
memoryless prompt (task + observation). They are the settings of the
learning-efficiency benchmark (``benchmarks/learning_efficiency.json``). For a real
LM use a config file: ``configs/paper_alfworld_gpu.json`` is the paper's setting.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milegpo.envs import make_env, make_vec_env

CONFIG_FILE = "config.json"


@dataclass
class TrainConfig:
    """Everything that defines a training run (plain values only: it is saved as JSON)."""

    algo: str = "milegpo"
    env: str = "milegpo/House-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: train/eval split names passed as the env's ``split`` kwarg (None: env has no splits)
    train_split: str | None = "train"
    eval_splits: list[str] = field(default_factory=lambda: ["eval_id", "eval_ood"])
    #: a hub name or local path of a causal LM; None builds the offline tiny model
    model: str | None = None
    mode: str = "choose"
    n_tasks: int = 4
    group_size: int = 8
    total_timesteps: int = 24_000
    learning_rate: float = 3e-3
    n_epochs: int = 1
    batch_size: int | None = 256
    kl_coef: float = 0.0
    ent_coef: float = 0.0
    #: tokens per forward/backward pass (gradient accumulation: a memory knob, not a hyperparameter)
    micro_batch_tokens: int = 8192
    gradient_checkpointing: bool = False
    clip_range: float = 0.2
    lora_r: int = 16
    lora_alpha: int = 32
    #: prompt template: a family name of milegpo.policies.PROMPT_TEMPLATES or a format string
    prompt_template: str | None = "{task} {observation}"
    history_length: int = 0
    max_prompt_tokens: int = 2048
    #: choose mode: score a command by the "sum" or the "mean" of its token log-probs
    #: ("mean" keeps a randomly initialised tiny LM from always picking the shortest command)
    candidate_score: str = "mean"
    temperature: float = 1.0
    #: held-out evaluation: sample at this temperature (the paper: 0.4; the demo's
    #: memoryless policy needs its training temperature 1.0 to escape loops); None = greedy
    eval_temperature: float | None = 1.0
    max_new_tokens: int = 512
    think: bool = False
    dtype: str | None = None
    credit_preset: str | None = None
    credit_kwargs: dict[str, Any] = field(default_factory=dict)
    n_eval_tasks: int = 50
    #: episodes per held-out task (sampled evaluation is noisy: several copies per task)
    eval_copies: int = 2
    eval_freq: int = 5
    checkpoint_freq: int = 5
    subprocess: bool = False
    device: str = "auto"
    seed: int = 0
    #: tiny model size (used only when ``model`` is None)
    tiny_hidden_size: int = 32
    tiny_layers: int = 1
    tiny_heads: int = 2

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build a config, refusing unknown keys with the list of valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read config file {str(path)!r}: {error}") from error
        return cls.from_dict(values)

    def env_kwargs_for(self, split: str | None) -> dict[str, Any]:
        kwargs = dict(self.env_kwargs)
        if split is not None:
            kwargs["split"] = split
        return kwargs

    def policy_kwargs(self, model_path: str) -> dict[str, Any]:
        return {
            "model": model_path,
            "mode": self.mode,
            "lora": {"r": self.lora_r, "alpha": self.lora_alpha},
            "dtype": self.dtype,
            "prompt_template": self.prompt_template,
            "history_length": self.history_length,
            "max_prompt_tokens": self.max_prompt_tokens,
            "candidate_score": self.candidate_score,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "think": self.think,
            "gradient_checkpointing": self.gradient_checkpointing,
            "seed": self.seed,
        }


def env_vocabulary(env_id: str, env_kwargs: dict[str, Any], episodes: int = 20, seed: int = 0) -> list[str]:
    """Texts covering what ``env_id`` can print, for building a tiny model's tokenizer.

    Uses the env's own ``vocabulary()`` when it has one; otherwise plays random
    admissible commands for a few episodes and collects observations, tasks and
    commands (words never seen map to the tokenizer's unknown token).
    """
    env = make_env(env_id, **env_kwargs)
    if hasattr(env, "vocabulary"):
        return list(env.vocabulary())
    import random

    rng = random.Random(seed)
    texts: list[str] = []
    for episode in range(episodes):
        observation, info = env.reset(seed=seed + episode)
        texts += [observation, info["task"], *(info["admissible_commands"] or [])]
        done = False
        while not done:
            commands = info["admissible_commands"] or ["look"]
            observation, _, terminated, truncated, info = env.step(rng.choice(commands))
            texts += [observation, *(info["admissible_commands"] or [])]
            done = terminated or truncated
    env.close()
    return texts


def prepare_model(config: TrainConfig, run_dir: Path) -> str:
    """The model path of the run: ``config.model``, or a tiny model built offline in the run folder."""
    if config.model is not None:
        return config.model
    target = run_dir / "base_model"
    if (target / "config.json").exists():
        return str(target)
    from milegpo.policies import PROMPT_TEMPLATES, tiny_model
    from milegpo.policies.prompts import HISTORY_HEADER, HISTORY_STEP, INSTRUCTIONS

    texts = env_vocabulary(config.env, config.env_kwargs_for(config.train_split), seed=config.seed)
    texts += [*PROMPT_TEMPLATES.values(), HISTORY_HEADER, HISTORY_STEP, *map(str, INSTRUCTIONS.values())]
    return tiny_model(texts, target, hidden_size=config.tiny_hidden_size, num_layers=config.tiny_layers,
                      num_heads=config.tiny_heads, seed=config.seed)


def _eval_env(config: TrainConfig, split: str | None):
    return make_vec_env(config.env, n_tasks=config.n_eval_tasks, group_size=config.eval_copies, seed=config.seed,
                        env_kwargs=config.env_kwargs_for(split), subprocess=config.subprocess)


def default_run_dir(config: TrainConfig) -> Path:
    name = config.env.split("/")[-1].lower()
    return Path("runs") / f"{config.algo}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(config: TrainConfig, run_dir: str | Path | None = None, resume: bool = False, progress_bar: bool = True,
          verbose: int = 1) -> Path:
    """Train (or resume) a run and write its folder; returns the folder's path."""
    from stable_baselines3.common.logger import configure

    from milegpo.algos import ALGORITHMS, CheckpointCallback, EvalCallback, latest_checkpoint

    if config.algo not in ALGORITHMS:
        raise ValueError(f"unknown algo {config.algo!r}; choose one of {sorted(ALGORITHMS)}")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")

    model_path = prepare_model(config, run_dir)
    env = make_vec_env(config.env, n_tasks=config.n_tasks, group_size=config.group_size, seed=config.seed,
                       env_kwargs=config.env_kwargs_for(config.train_split), subprocess=config.subprocess)
    algo_class = ALGORITHMS[config.algo]
    last = latest_checkpoint(run_dir / "checkpoints") if resume else None
    if last is not None:
        model = algo_class.load(last, env=env, device=config.device)
        if verbose:
            print(f"Resuming {run_dir} from {last} at {model.num_timesteps} env steps")
    else:
        model = algo_class(
            "LLMPolicy", env, learning_rate=config.learning_rate, n_epochs=config.n_epochs,
            batch_size=config.batch_size, micro_batch_tokens=config.micro_batch_tokens,
            kl_coef=config.kl_coef, ent_coef=config.ent_coef,
            clip_range=config.clip_range, credit_preset=config.credit_preset,
            credit_kwargs=dict(config.credit_kwargs), policy_kwargs=config.policy_kwargs(model_path),
            verbose=verbose, seed=config.seed, device=config.device,
        )
    model.set_logger(configure(str(run_dir), ["stdout", "csv", "tensorboard"] if verbose else ["csv", "tensorboard"]))

    callbacks = [CheckpointCallback(config.checkpoint_freq, run_dir / "checkpoints")]
    curve_env = _eval_env(config, config.eval_splits[0]) if config.eval_splits else None
    if curve_env is not None:
        callbacks.append(EvalCallback(curve_env, eval_freq=config.eval_freq, n_eval_tasks=config.n_eval_tasks,
                                      **_eval_sampling(config)))
    remaining = config.total_timesteps - model.num_timesteps
    try:
        if remaining > 0:
            model.learn(remaining, callback=callbacks, reset_num_timesteps=last is None, progress_bar=progress_bar)
    finally:
        env.close()
        if curve_env is not None:
            curve_env.close()
    model.save(run_dir / "final")

    results = evaluate_model(model, config)
    (run_dir / "eval_final.json").write_text(json.dumps(results, indent=2) + "\n")
    write_plots(run_dir)
    if verbose:
        for split, result in results.items():
            print(f"held-out {split}: success {result['success_rate']:.3f} over {result['n_tasks']} tasks x {config.eval_copies}")
        print(f"Run folder: {run_dir}")
    return run_dir


def _eval_sampling(config: TrainConfig) -> dict[str, Any]:
    """Greedy when ``eval_temperature`` is None, else sampled at that temperature."""
    if config.eval_temperature is None:
        return {"deterministic": True}
    return {"deterministic": False, "temperature": config.eval_temperature}


def evaluate_model(model: Any, config: TrainConfig, splits: list[str] | None = None,
                   n_tasks: int | None = None) -> dict[str, dict[str, Any]]:
    """Success on the first ``n_tasks`` tasks of each eval split (sampling as ``config.eval_temperature``)."""
    results = {}
    for split in splits or config.eval_splits or [None]:
        env = _eval_env(config, split)
        result = model.evaluate(env, n_episodes=n_tasks or config.n_eval_tasks, **_eval_sampling(config))
        env.close()
        results[str(split)] = {k: v for k, v in result.items() if k != "per_task"} | {"n_tasks": n_tasks or config.n_eval_tasks}
    return results


def load_run(run_dir: str | Path) -> tuple[TrainConfig, Any]:
    """The config and the final (or latest) model of a run folder."""
    from milegpo.algos import ALGORITHMS, latest_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo train` wrote")
    config = TrainConfig.from_file(run_dir / CONFIG_FILE)
    checkpoint = run_dir / "final" if (run_dir / "final").exists() else latest_checkpoint(run_dir / "checkpoints")
    if checkpoint is None:
        raise FileNotFoundError(f"run folder {str(run_dir)!r} has no checkpoint yet (final/ or checkpoints/)")
    return config, ALGORITHMS[config.algo].load(checkpoint, device=config.device)


def write_plots(run_dir: Path) -> None:
    from milegpo.plots import plot_credit_diagnostics, plot_learning_curve, plot_run_trajectory_credit

    progress = run_dir / "progress.csv"
    if progress.exists() and progress.stat().st_size:
        plot_learning_curve(progress, run_dir / "learning_curve.png", title=run_dir.name)
        plot_credit_diagnostics(progress, run_dir / "credit_diagnostics.png", title=run_dir.name)
    plot_run_trajectory_credit(run_dir)  # trajectory_credit.png from last_batch.npz (nothing without one)
