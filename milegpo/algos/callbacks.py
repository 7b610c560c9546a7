"""SB3 callbacks for group RL: periodic checkpoints (resumable runs) and held-out evaluation.

Both act at the end of an iteration, right after its update (the trainer calls
``on_iteration_end``; SB3 has no hook after ``train()``): the evaluation adds its
``eval/*`` values to that iteration's log row, then the row is written, then the
checkpoint is saved. So a checkpoint holds the weights and counters of a completed,
logged iteration, and a row's ``eval/*`` values are those of the weights after the
row's own update. Both also act at the last iteration of ``learn``.

Resuming a killed run::

    from milegpo.algos import CheckpointCallback, MileGPO, latest_checkpoint
    last = latest_checkpoint("runs/house/checkpoints")
    model = MileGPO.load(last, env) if last else MileGPO("LLMPolicy", env, ...)
    model.learn(total - model.num_timesteps, reset_num_timesteps=last is None,
                callback=CheckpointCallback(1, "runs/house/checkpoints"))

(``milegpo train --resume`` also rolls the run folder's logs back to the checkpoint:
:mod:`milegpo.run.logs`.)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    ConvertCallback,
    ProgressBarCallback,
)

from milegpo.algos.checkpoint import replaceable, to_builtin
from milegpo.algos.evaluation import evaluate
from milegpo.contracts import ActingPolicy
from milegpo.envs.vec_env import GroupedTextVecEnv


class TrainedAlgorithm(Protocol):
    """The algorithm as the iteration callbacks see it (:class:`~milegpo.algos.base.GroupRLAlgorithm`)."""

    @property
    def policy(self) -> ActingPolicy: ...

    @property
    def num_timesteps(self) -> int: ...

    @property
    def iterations(self) -> int: ...

    @property
    def timestep_budget(self) -> int: ...

    def log_row_pending(self) -> None: ...


class IterationCallback(BaseCallback):
    """A callback that acts at the end of iterations: :meth:`_on_iteration` after every
    ``freq``-th iteration and after the last one of ``learn``.

    The trainer calls :meth:`on_iteration_end` of every callback of this class after each
    update (SB3 has no hook after ``train()``); subclass it for your own per-iteration work
    and set :attr:`logs_to_row` when it records values into the iteration's log row.
    """

    #: True: runs before the iteration's log row is written (adds values to it); False: after.
    logs_to_row = False

    def __init__(self, freq: int, verbose: int = 0):
        super().__init__(verbose)
        if freq < 1:
            raise ValueError(f"the frequency (iterations) must be >= 1, got {freq}")
        self.freq = int(freq)
        self._last_done = -1

    @property
    def algorithm(self) -> TrainedAlgorithm:
        """The group-RL algorithm being trained (SB3's ``self.model``, as these callbacks use it)."""
        return cast(TrainedAlgorithm, self.model)

    def _on_step(self) -> bool:
        return True

    def _iterations(self) -> int:
        return self.algorithm.iterations

    def on_iteration_end(self) -> None:
        """Called by the trainer after each update."""
        done = self._iterations()
        last = self.algorithm.num_timesteps >= self.algorithm.timestep_budget
        if (done % self.freq == 0 or last) and done != self._last_done:
            self._last_done = done
            self._on_iteration()

    def _on_iteration(self) -> None:
        """The per-iteration work (subclasses)."""
        raise NotImplementedError


class CheckpointCallback(IterationCallback):
    """Save the model every ``save_freq`` iterations to ``save_path/<prefix>_<steps>_steps``, and after the
    run's first iteration (so a run killed early can resume).

    :param save_freq: iterations (rollout + update) between checkpoints.
    :param save_path: folder of the checkpoints.
    :param name_prefix: checkpoint name prefix.
    :param keep_last: how many checkpoints to keep (older ones are deleted; None keeps all).
    :param save_every_s: also save at the end of the first iteration that ends this many seconds
        after the last save (or the start): long iterations are not lost to a kill (None: only every
        ``save_freq`` iterations).
    """

    def __init__(self, save_freq: int, save_path: str | os.PathLike, name_prefix: str = "checkpoint",
                 keep_last: int | None = 2, verbose: int = 0, save_every_s: float | None = None):
        super().__init__(save_freq, verbose)
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        if save_every_s is not None and not save_every_s > 0:
            raise ValueError(f"save_every_s must be > 0 seconds or None, got {save_every_s}")
        self.save_path = Path(save_path)
        self.name_prefix = name_prefix
        self.keep_last = keep_last
        self.save_every_s = save_every_s
        #: the newest checkpoint this callback wrote (None: none yet)
        self.last_path: Path | None = None
        self._last_save_time = time.monotonic()

    def _on_training_start(self) -> None:
        self._last_save_time = time.monotonic()

    def on_iteration_end(self) -> None:
        overdue = self.save_every_s is not None and time.monotonic() - self._last_save_time >= self.save_every_s
        first = self._iterations() == 1  # a run killed early resumes after its first iteration, not its freq-th
        if (overdue or first) and self._iterations() != self._last_done:
            self._last_done = self._iterations()
            self._on_iteration()
            return
        super().on_iteration_end()

    def _on_training_end(self) -> None:  # a learn() stopped early by a callback: keep its last iteration
        if 0 < self._iterations() != self._last_done:
            self._last_done = self._iterations()
            self._on_iteration()

    def _on_iteration(self) -> None:
        path = self.save_path / f"{self.name_prefix}_{self.model.num_timesteps}_steps"
        self.model.save(path)
        self.last_path, self._last_save_time = path, time.monotonic()
        if self.verbose >= 1:
            print(f"Saving model checkpoint to {path}")
        if self.keep_last is not None:
            found = sorted(
                (int(p.name[len(self.name_prefix) + 1 : -len("_steps")]), p)
                for p in self.save_path.glob(f"{self.name_prefix}_*_steps")
                if p.is_dir() and p.name[len(self.name_prefix) + 1 : -len("_steps")].isdigit()
            )
            for _, old in found[: -self.keep_last]:
                if replaceable(old):  # only this callback's own saves: never a user's folder of that name
                    shutil.rmtree(old, ignore_errors=True)


class EvalCallback(IterationCallback):
    """Evaluate on held-out tasks before training (a fresh model) and every ``eval_freq``
    iterations; logs ``eval/*`` in the iteration's row and appends a row to ``eval.jsonl``
    in the logger folder (the learning curve). The untrained policy's evaluation is its
    own row, iteration 0.

    :param eval_env: a GroupedTextVecEnv on an eval split (group size 1 is usual).
    :param n_eval_tasks: task seeds ``0..n_eval_tasks-1`` of the split.
    :param task_seeds: explicit task seeds instead (e.g. an env's held-out seeds); overrides ``n_eval_tasks``.
    :param deterministic: greedy actions.
    :param temperature: with ``deterministic=False``, the sampling temperature (paper: 0.4).
    :param seed: seed of the sampled actions of every evaluation (the same episodes' randomness
        at every point of the curve; None: the policy's running generators).
    :param log_name: prefix of the logged keys (``eval`` -> ``eval/success_rate``; ``milegpo train``
        logs each split under its name, ``eval/eval_id/success_rate``).
    :param curve_file: the jsonl file of the learning curve in the logger folder (default
        ``<log_name>.jsonl``); None: none (``milegpo train`` writes the first split's to ``eval.jsonl``).
    """

    logs_to_row = True

    def __init__(self, eval_env: GroupedTextVecEnv, eval_freq: int = 1, n_eval_tasks: int = 16,
                 deterministic: bool = True, temperature: float | None = None, seed: int | None = None,
                 log_name: str = "eval", curve_file: str | None = "", verbose: int = 0,
                 task_seeds: Sequence[int] | None = None):
        super().__init__(eval_freq, verbose)
        self.eval_env = eval_env
        self.task_seeds = [int(s) for s in task_seeds] if task_seeds is not None else list(range(int(n_eval_tasks)))
        self.deterministic = deterministic
        self.temperature = temperature
        self.seed = seed
        self.log_name = log_name
        self.curve_file = f"{log_name}.jsonl" if curve_file == "" else curve_file
        self.results: list[dict[str, Any]] = []

    def _on_training_start(self) -> None:
        if self._iterations() == 0:  # the untrained policy: the first point of the learning curve
            self._last_done = 0
            self._on_iteration()
            self.logger.record("time/iterations", 0, exclude="tensorboard")
            self.logger.record("time/total_timesteps", self.model.num_timesteps, exclude="tensorboard")
            self.algorithm.log_row_pending()  # one row 0 for every evaluation callback, written before the rollout

    def _on_iteration(self) -> None:
        started = time.perf_counter()
        result = evaluate(self.algorithm, self.eval_env, task_seeds=self.task_seeds, deterministic=self.deterministic,
                          temperature=self.temperature, seed=self.seed)
        self.logger.record(f"time/{self.log_name}_s", time.perf_counter() - started)  # the console line shows it
        row = {"iteration": self._iterations(), "num_timesteps": self.model.num_timesteps,
               **{k: v for k, v in result.items() if k != "per_task"}}
        self.results.append(row)
        for key in ("success_rate", "mean_return", "mean_length", "mean_score"):
            self.logger.record(f"{self.log_name}/{key}", result[key])
        folder = self.logger.get_dir()
        if self.curve_file and folder and any(getattr(f, "own_file", True) for f in self.logger.output_formats):
            with open(os.path.join(folder, self.curve_file), "a") as f:
                f.write(json.dumps({**row, "per_task": result["per_task"]}, default=to_builtin) + "\n")
        if self.verbose >= 1:
            print(f"[{self.log_name}] {self.model.num_timesteps} steps: success {result['success_rate']:.3f}")


class TextProgressBarCallback(ProgressBarCallback):
    """SB3's progress bar, advanced by env steps of active envs (SB3 adds ``num_envs`` per call);
    it stops at its total (the last rollout runs past the budget to finish its episodes).

    Its time estimate uses the average speed since the start (rich's default is the last 30 s),
    so the pauses for updates and held-out evaluations between rollouts are counted in it."""

    #: seconds of progress rich averages the speed over: the whole run
    SPEED_PERIOD_S = 10**9

    def _on_step(self) -> bool:
        done = min(self.model.num_timesteps - self._start, self.pbar.total)
        self.pbar.update(done - self.pbar.n)
        return True

    def _on_training_start(self) -> None:
        import warnings

        from tqdm import TqdmExperimentalWarning
        from tqdm.rich import tqdm

        with warnings.catch_warnings():  # SB3's own bar silences it the same way
            warnings.simplefilter("ignore", TqdmExperimentalWarning)
            self.pbar = tqdm(total=self.locals["total_timesteps"] - self.model.num_timesteps,
                             options={"speed_estimate_period": self.SPEED_PERIOD_S})
        self._start = self.model.num_timesteps

    def _on_training_end(self) -> None:
        # the last rollout finishes its episodes past the budget: end the bar on the steps really played
        played = self.model.num_timesteps - self._start
        if played > self.pbar.total:
            self.pbar.total = played
            progress = getattr(self.pbar, "_prog", None)  # tqdm.rich's rich Progress keeps its own copy of the total
            if progress is not None:
                progress.update(self.pbar._task_id, total=played)
        self.pbar.update(played - self.pbar.n)
        super()._on_training_end()


def flatten_callbacks(callback: BaseCallback | None) -> list[BaseCallback]:
    """The leaf callbacks of a (nested) CallbackList, in order."""
    if callback is None:
        return []
    if isinstance(callback, CallbackList):
        return [leaf for child in callback.callbacks for leaf in flatten_callbacks(child)]
    return [callback]


def refuse_sb3_callbacks(callbacks: Sequence[BaseCallback]) -> None:
    """stable-baselines3's EvalCallback and CheckpointCallback cannot serve a group-RL run (SB3's evaluation counts
    the finished envs of a group as new episodes; its checkpoints are zip files saved per env step): refuse them
    before training starts, naming the drop-in replacement."""
    from stable_baselines3.common import callbacks as sb3

    for callback in callbacks:
        if isinstance(callback, sb3.EvalCallback):
            raise ValueError("stable_baselines3's EvalCallback plays a grouped text env through SB3's evaluate_policy, "
                             "which counts finished envs as new episodes: use milegpo.algos.EvalCallback(eval_env, "
                             "eval_freq=ITERATIONS, n_eval_tasks=N) (its frequency counts iterations)")
        if isinstance(callback, sb3.CheckpointCallback):
            raise ValueError("stable_baselines3's CheckpointCallback saves zip files every N env steps: use "
                             "milegpo.algos.CheckpointCallback(save_freq=ITERATIONS, save_path=DIR) (checkpoint "
                             "folders after whole iterations, resumable)")


def as_callback(callback: Any, progress_bar: bool = False) -> BaseCallback:
    """SB3's ``MaybeCallback`` (None, a function, a callback or a list of them) as one callback,
    with the text progress bar added when asked."""
    if isinstance(callback, list):
        callback = CallbackList(callback)
    if not isinstance(callback, BaseCallback):
        callback = ConvertCallback(callback)
    if progress_bar:
        callback = CallbackList([callback, TextProgressBarCallback()])
    return callback
