"""A training run's own groups, with their ground truth, for the credit-quality benchmarks.

``credit_quality.py`` and ``memory_quality.py`` play their groups with a fixed policy. A policy that
learns plays other groups: its successes grow, its failures gather where it still errs, and a task
seen again is played by a better policy. To score credit on those groups, a run keeps every
iteration's StepBatch (``run.keep_batch_every=1``) with the task seed each group played (the batch's
``task_seeds`` meta), and :func:`replay_run` plays every kept trajectory again, action by action, from
its task seed in the benchmark's env, with :mod:`ground_truth`'s tracker following it.

Nothing is assumed: the replay must pass the run's own states (under the run's state key) with the
run's own rewards, end where the run's trajectory ended and win where it won; the first difference
stops it with one error naming the iteration, trajectory and step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.credit import credit_quality as cq
from benchmarks.credit import ground_truth
from milegpo.config.run import TrainConfig
from milegpo.credit.batch import StepBatch, load_step_batch
from milegpo.inspect.runfiles import kept_iterations
from milegpo.run_folder import CONFIG_FILE

#: env kwargs that change what the env reports but not what it does (the state key's form; which
#: scripted expert fills ``info["expert_plan"]``): a run and the benchmark's env may differ in them
NOT_DYNAMICS = frozenset({"state_key", "expert_type"})


class ReplayError(ValueError):
    """A run folder cannot be replayed, or its replay left the run's path."""


def run_config(run_dir: Path) -> TrainConfig:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ReplayError(f"{str(run_dir)!r} has no {CONFIG_FILE}: pass a folder `milegpo train` wrote")
    return TrainConfig.from_file(path)


def check_same_env(env_name: str, config: TrainConfig) -> None:
    """Stop unless the run played benchmark env ``env_name`` with the same dynamics (:data:`NOT_DYNAMICS` aside)."""
    env_id, kwargs = ground_truth.ENVS[env_name]
    ran = {k: v for k, v in config.env.kwargs.items() if k not in NOT_DYNAMICS}
    expected = {k: v for k, v in kwargs.items() if k not in NOT_DYNAMICS}
    if config.env.id != env_id or ran != expected:
        raise ReplayError(f"the run played {config.env.id} with {ran}, not the benchmark's {env_name!r} "
                          f"({env_id} with {expected})")


def kept_sequence(run_dir: Path) -> list[tuple[int, StepBatch, list[int]]]:
    """Every iteration's kept batch and task seeds, in order; stops unless every iteration was kept."""
    kept = kept_iterations(run_dir)
    if not kept or list(kept) != list(range(1, len(kept) + 1)):
        raise ReplayError(f"{str(run_dir)!r} kept iterations {list(kept)[:8]}...: a replay needs every one "
                          "(train it with run.keep_batch_every=1)")
    out = []
    for iteration, path in kept.items():
        batch, meta = load_step_batch(path)
        seeds = meta.get("task_seeds")
        if seeds is None:
            raise ReplayError(f"{path} has no task_seeds in its meta (a run from before they were kept, or a "
                              "multi-process run): its episodes cannot be replayed")
        out.append((iteration, batch, [int(s) for s in seeds]))
    return out


def replay_run(env_name: str, run_dir: str | Path) -> list[cq.Groups]:
    """The run's groups, one :class:`credit_quality.Groups` per iteration, each step with its true
    distances; a group's task id is the task its seed plays (seed modulo the task count, the memory's key)."""
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    check_same_env(env_name, config)
    state_key = config.env.kwargs.get("state_key", "env")
    env, tracker_factory = ground_truth.make(env_name, split=config.env.train_split or "train")
    trackers: dict[int, ground_truth.Tracker] = {}
    sequence = []
    try:
        for iteration, batch, task_seeds in kept_sequence(run_dir):
            played = []
            for traj in np.unique(batch.traj_ids):
                rows = np.flatnonzero(batch.traj_ids == traj)
                seed = task_seeds[int(batch.task_ids[rows[0]])]
                tracker = trackers.setdefault(seed, tracker_factory(env, seed))
                rollout = cq.Rollout.start(env, tracker, seed)
                for row in rows:
                    where = f"{run_dir.name} iteration {iteration}, trajectory {traj}, step {batch.step_idx[row]}"
                    key = rollout.states[-1] if state_key == "env" else rollout.texts[-1]
                    if rollout.done or key != batch.state_keys[row]:
                        raise ReplayError(f"{where}: the replay is in state {key!r} (done: {rollout.done}), the "
                                          f"run was in {batch.state_keys[row]!r}")
                    rollout.step(str(batch.actions[row]))
                    if rollout.rewards[-1] != batch.rewards[row]:
                        raise ReplayError(f"{where}: reward {rollout.rewards[-1]} on replay, {batch.rewards[row]} "
                                          "in the run")
                if not rollout.done or bool(rollout.info.get("won")) != bool(batch.success[traj]):
                    raise ReplayError(f"{run_dir.name} iteration {iteration}, trajectory {traj}: the replay ended "
                                      f"{rollout.done} and won {rollout.info.get('won')}, the run ended and won "
                                      f"{bool(batch.success[traj])}")
                played.append((seed % env.num_tasks, rollout))
            sequence.append(cq.as_groups(played, env.max_episode_steps))
    finally:
        env.close()
    return sequence
