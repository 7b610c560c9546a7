"""``TrainConfig``: everything that defines a training run, as one tree of settings.

A run's config composes the configs of the objects it builds: ``env`` (what is played),
``algo`` (:class:`~milegpo.config.AlgoConfig`), ``policy`` (:class:`~milegpo.config.PolicyConfig`),
``eval`` (held-out evaluation) and ``run`` (budget, seed, device, checkpoints, trackers).
Every leaf has one default, the paper's where the paper gives one. Named presets
(:data:`~milegpo.config.presets.PRESETS`, :mod:`milegpo.config.presets`) change some of them: ``cpu-demo`` is what
``milegpo train`` runs with no arguments.

Sources are layered with OmegaConf (:func:`resolve_config`): a preset or a run's saved
config, then YAML/JSON files, then ``section.field=value`` overrides. OmegaConf checks each
value against the field's type on the way in; each config's ``__post_init__`` then checks
its range. The result is saved as the run's ``config.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from milegpo.config.algo import AlgoConfig
from milegpo.config.fields import check_int, check_number, check_type, from_dict, settings_class, to_dict
from milegpo.config.policy import PolicyConfig
from milegpo.config.presets import DEMO_PRESET, PRESETS, preset_text
from milegpo.config.tiny_model import TinyModelConfig
from milegpo.config.warm_start import WarmStartConfig
from milegpo.options import HELD_OUT_SEEDS_START, HELD_OUT_SPLIT, parse_report_to


@dataclass(frozen=True)
class EnvConfig:
    """What the agent plays.

    :param id: a registered env id, or ``module:ClassName`` of a TextEnv subclass.
    :param kwargs: the env's constructor arguments (e.g. ``{max_episode_steps: 30}``).
    :param train_split: the env's ``split`` argument for training; null: the env has no splits.
    :param n_tasks: tasks per iteration (a multiple of the number of processes).
    :param group_size: rollouts per task: the group the credit compares (the paper: 8).
    :param subprocess: run the envs in worker processes (slow engines: ALFWorld, WebShop); the only
        mode with hang and crash protection (a worker silent for ``worker_timeout_s``, or dead, is restarted).
    :param n_workers: env worker processes with ``subprocess`` (null: one per CPU core, at most one per
        env); more than cores suits envs that wait (a server, a sleep): ``algo.rollout=async`` overlaps
        per worker.
    :param worker_timeout_s: seconds an env worker may take to answer one reset or step (of all the envs
        it hosts) before it is declared hung, killed and restarted (with ``subprocess``).
    :param module_dir: the folder a user's env module (``env.id=module:...``) was imported from when it is no
        installed package; recorded by ``milegpo train`` so that eval, resume, export and serve of the run
        import it from any directory (null: an installed or built-in env).
    """

    id: str = "milegpo/House-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str | None = "train"
    n_tasks: int = 16
    group_size: int = 8
    subprocess: bool = False
    n_workers: int | None = None
    worker_timeout_s: float = 120.0
    module_dir: str | None = None

    def __post_init__(self) -> None:
        check_type("env.id", self.id, str, "an env id")
        check_type("env.module_dir", self.module_dir, str, "a folder", optional=True)
        check_type("env.kwargs", self.kwargs, dict, "a mapping")
        check_type("env.train_split", self.train_split, str, "a split name", optional=True)
        check_int("env.n_tasks", self.n_tasks, 1)
        check_int("env.group_size", self.group_size, 1)
        check_type("env.subprocess", self.subprocess, bool, "true or false")
        check_int("env.n_workers", self.n_workers, 1, optional=True)
        check_number("env.worker_timeout_s", self.worker_timeout_s)

    def kwargs_for(self, split: str | None) -> dict[str, Any]:
        """The env's constructor arguments for a task split (``split`` added to ``kwargs``; None and
        ``held_out``, the eval split of an env without splits: none)."""
        return {**self.kwargs, **({"split": split} if split not in (None, HELD_OUT_SPLIT) else {})}


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation, during and after training.

    :param splits: held-out splits (may be empty); the first one's curve is ``eval.jsonl``.
    :param n_tasks: held-out tasks per evaluation (task seeds ``0..n_tasks-1``).
    :param copies: episodes per held-out task (sampled evaluation is noisy).
    :param freq: evaluate every this many iterations (and before the first, and at the end).
    :param temperature: sampling temperature (the paper: 0.4); null: greedy.
    """

    splits: list[str] = field(default_factory=lambda: ["eval_id", "eval_ood"])
    n_tasks: int = 50
    copies: int = 1
    freq: int = 10
    temperature: float | None = 0.4

    def __post_init__(self) -> None:
        if not (isinstance(self.splits, list) and all(isinstance(s, str) for s in self.splits)):
            raise ValueError(f"eval.splits must be a list of split names (may be empty), got {self.splits!r}")
        for name in ("n_tasks", "copies", "freq"):
            check_int(f"eval.{name}", getattr(self, name), 1)
        check_number("eval.temperature", self.temperature, optional=True)


@dataclass(frozen=True)
class RunConfig:
    """The run around the training.

    :param total_timesteps: training budget in env steps (of active envs).
    :param seed: seeds the adapter, the task draws and the sampling.
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
    :param checkpoint_freq: save a checkpoint every this many iterations (a killed run resumes from it).
    :param checkpoint_every_s: also save one when this many seconds passed since the last (null: only
        every ``checkpoint_freq`` iterations); SIGTERM / SIGINT always save the last completed iteration.
    :param report_to: trackers beside ``progress.csv``: ``tensorboard``, ``wandb``, ``mlflow``.
    :param warm_start: behaviour cloning of the env's noisy scripted expert before RL
        (:class:`~milegpo.config.WarmStartConfig`); null: RL from the model as it is.
    :param tiny_model: the offline model built when ``policy.model`` is null.
    :param keep_batch_every: keep the StepBatch of every this many iterations, and of the last one, in
        ``batches/`` for ``milegpo inspect`` (compressed, with the observations behind the state keys:
        about 11 kB per 1,000 steps on House); 0: keep only the last (``last_batch.npz``).
    :param torch_threads: CPU threads of torch's operations in the training process; null: 1 for the
        offline tiny model (its small matmuls gain nothing from more, and on a loaded machine each extra
        thread waits for a core: measured ~12x slower per iteration with one per core), torch's default
        (one per core) for a named model.
    """

    total_timesteps: int = 1_000_000
    seed: int = 0
    device: str = "auto"
    checkpoint_freq: int = 10
    checkpoint_every_s: float | None = 1800.0
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    warm_start: WarmStartConfig | None = None
    tiny_model: TinyModelConfig = field(default_factory=TinyModelConfig)
    torch_threads: int | None = None
    keep_batch_every: int = 10

    def __post_init__(self) -> None:
        check_int("run.total_timesteps", self.total_timesteps, 1)
        check_int("run.keep_batch_every", self.keep_batch_every, 0)
        check_int("run.torch_threads", self.torch_threads, 1, optional=True)
        check_int("run.seed", self.seed, 0)
        check_int("run.checkpoint_freq", self.checkpoint_freq, 1)
        check_number("run.checkpoint_every_s", self.checkpoint_every_s, optional=True)
        if not isinstance(self.device, str) or (self.device != "auto" and not self.device.startswith(
                ("cpu", "cuda", "mps", "xpu"))):
            raise ValueError(f"run.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if not (isinstance(self.report_to, list) and all(isinstance(s, str) for s in self.report_to)):
            raise ValueError(f"run.report_to must be a list of tracker names, got {self.report_to!r}")
        parse_report_to(self.report_to)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run: the configs of what it builds.

    :param env: what is played (:class:`EnvConfig`).
    :param algo: the credit method and the update (:class:`~milegpo.config.AlgoConfig`).
    :param policy: the model, the prompt and the sampling (:class:`~milegpo.config.PolicyConfig`).
    :param eval: held-out evaluation (:class:`EvalConfig`).
    :param run: budget, seed, device, checkpoints, trackers (:class:`RunConfig`).
    """

    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        if self.algo.learning_rate == 0:  # the algorithm accepts 0 (a loss without a step); a run would not train
            raise ValueError("algo.learning_rate must be > 0 for a training run, got 0 (the weights would never "
                             "change)")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from nested plain values; a setting of the flat layout earlier versions wrote
        is refused with its new dotted name."""
        _refuse_flat_keys(values, "config")
        return from_dict(cls, values)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """A config from a YAML or JSON file of (some of) its settings over the defaults."""
        return resolve_config(files=[path])

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain values (what ``config.json`` holds)."""
        return to_dict(self)

    def replace(self, **dotted: Any) -> TrainConfig:
        """A copy with some leaves changed, by dotted name: ``config.replace(**{"eval.temperature": None})``."""
        values = self.to_dict()
        for name, value in dotted.items():
            *path, leaf = name.split(".")
            node = values
            for part in path:
                node = node[part]
            if leaf not in node:
                raise ValueError(f"unknown setting {name!r}")
            node[leaf] = value
        return TrainConfig.from_dict(values)


SECTIONS = tuple(f.name for f in fields(TrainConfig))

#: the flat setting names of earlier versions (config files and ``milegpo train`` flags) -> their dotted names
RENAMED = {
    "algo": "algo.method", "env": "env.id", "env_kwargs": "env.kwargs", "train_split": "env.train_split",
    "eval_splits": "eval.splits", "eval_split": "eval.splits", "n_tasks": "env.n_tasks", "group_size": "env.group_size",
    "total_timesteps": "run.total_timesteps", "steps": "run.total_timesteps", "credit_preset": "algo.credit_preset",
    "credit_kwargs": "algo.credit_kwargs", "model": "policy.model", "tiny_hidden_size": "run.tiny_model.hidden_size",
    "tiny_layers": "run.tiny_model.layers", "tiny_heads": "run.tiny_model.heads", "lora_r": "policy.lora.r",
    "lora_alpha": "policy.lora.alpha", "dtype": "policy.dtype",
    "gradient_checkpointing": "policy.gradient_checkpointing",
    "device": "run.device", "warm_start": "run.warm_start", "mode": "policy.mode",
    "prompt_template": "policy.prompt_template", "history_length": "policy.history_length",
    "max_prompt_tokens": "policy.max_prompt_tokens", "candidate_score": "policy.candidate_score",
    "temperature": "policy.temperature", "max_new_tokens": "policy.max_new_tokens", "think": "policy.think",
    "rollout_backend": "policy.sampler.backend", "vllm_kwargs": "policy.sampler.vllm_kwargs",
    "subprocess": "env.subprocess", "learning_rate": "algo.learning_rate", "lr": "algo.learning_rate",
    "n_epochs": "algo.n_epochs", "batch_size": "algo.batch_size", "micro_batch_tokens": "algo.micro_batch_tokens",
    "clip_range": "algo.clip_range", "kl_coef": "algo.kl_coef", "ent_coef": "algo.ent_coef",
    "n_eval_tasks": "eval.n_tasks", "eval_copies": "eval.copies", "eval_freq": "eval.freq",
    "eval_temperature": "eval.temperature", "checkpoint_freq": "run.checkpoint_freq", "seed": "run.seed",
    "report_to": "run.report_to",
}  # fmt: skip



def eval_task_seeds(split: str | None, n_tasks: int) -> list[int]:
    """The task seeds an evaluation on ``split`` plays: ``0..n_tasks-1`` (the split's first tasks), or
    for ``held_out`` (an env without splits) the first ``n_tasks`` seeds training never draws."""
    start = HELD_OUT_SEEDS_START if split == HELD_OUT_SPLIT else 0
    return list(range(start, start + n_tasks))


def resolve_config(preset: str | None = None, files: Sequence[str | Path] = (), overrides: Sequence[str] = (),
                   base: TrainConfig | None = None) -> TrainConfig:
    """The config from layered sources: ``base`` (or the defaults), a named preset, config files
    (YAML or JSON) in order, then ``section.field=value`` overrides (OmegaConf's dotlist syntax:
    ``eval.splits=[eval_id]``, ``policy.model=null``).

    Raises ``ValueError`` naming the setting for an unknown key, a value of the wrong type or out
    of range, and a setting of the old flat layout (with its new name).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged = _schema(base or TrainConfig())
    layers: list[tuple[str, Any]] = []
    try:
        if preset is not None:
            layers.append((f"preset {preset}", OmegaConf.create(preset_text(preset))))
        for path in files:
            layers.append((f"config file {str(path)!r}", _load_file(Path(path))))
        if overrides:
            layers.append(("the overrides", OmegaConf.from_dotlist(list(overrides))))
    except OmegaConfBaseException as exc:
        raise ValueError(_omegaconf_message(exc)) from None
    for where, layer in layers:
        _refuse_flat_keys(OmegaConf.to_container(layer), where)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise ValueError(f"{where}: {_omegaconf_message(exc)}") from None
    values = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(values, dict)
    return TrainConfig.from_dict({str(k): v for k, v in values.items()})


def _schema(config: TrainConfig) -> Any:
    """``config`` as a typed, writable OmegaConf tree (frozen dataclasses make read-only nodes)."""
    from omegaconf import DictConfig, OmegaConf

    tree = OmegaConf.structured(config)

    def unlock(node: DictConfig) -> None:
        OmegaConf.set_readonly(node, False)
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                unlock(child)

    unlock(tree)
    return tree


def _load_file(path: Path) -> Any:
    from omegaconf import OmegaConf

    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    import yaml

    try:
        return OmegaConf.create(json.loads(path.read_text())) if path.suffix == ".json" else OmegaConf.load(path)
    except (json.JSONDecodeError, OSError) as exc:
        raise ValueError(f"cannot read config file {str(path)!r}: {exc}") from None
    except yaml.YAMLError as exc:  # one line: the file, where, and what the parser expected
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"config file {str(path)!r} is not valid YAML ({where.strip() or 'parse error'}: "
                         f"{problem})") from None


def _refuse_flat_keys(values: Any, where: str) -> None:
    """``ValueError`` naming the new dotted name of each flat setting of earlier versions in ``values``."""
    if isinstance(values, dict):
        moved = [f"{key} is now {RENAMED[key]}" for key in values if key in RENAMED and key not in SECTIONS]
        if moved:
            raise ValueError(f"{where}: settings moved into sections: " + "; ".join(moved))


def _omegaconf_message(exc: Exception) -> str:
    """OmegaConf's message in one line, with the setting's dotted name."""
    lines = str(exc).strip().splitlines()
    key = next((line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("full_key:")), "")
    first = lines[0] if lines else type(exc).__name__
    first = re.sub(r"Key '(\w+)' not in '\w+'", r"unknown setting '\1'", first)
    return f"{key}: {first}" if key and key not in first else first


def leaves(cls: type = TrainConfig, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """Every leaf setting as (dotted name, type annotation, description), in declaration order."""
    import typing

    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        sub = settings_class(hints[f.name])
        if sub is not None and f.name != "warm_start":  # the warm start is one setting: null or its dict
            yield from leaves(sub, f"{name}.")
        else:
            yield name, hints[f.name], docs.get(f.name, "")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's description from a settings class's ``:param`` docstring lines, as plain text."""
    found = {}
    for name, text in re.findall(r":param (\w+): (.*?)(?=\n\s*:param |\n\s*\"\"\"|\Z)", cls.__doc__ or "", re.S):
        text = re.sub(r":\w+:`~?([^`]*)`", r"\1", text).replace("``", "")
        found[name] = " ".join(text.split())
    return found


def lookup(config: TrainConfig, dotted: str) -> Any:
    """The value of a leaf by dotted name."""
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def describe_value(value: Any) -> str:
    """A value as it is written in YAML and in overrides (null, true, [a, b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


__all__ = ["DEMO_PRESET", "PRESETS", "AlgoConfig", "EnvConfig", "EvalConfig", "PolicyConfig", "RunConfig",
           "TinyModelConfig", "TrainConfig", "WarmStartConfig", "resolve_config"]
