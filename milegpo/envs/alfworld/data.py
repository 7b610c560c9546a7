"""Where the ALFWorld games come from: the alfworld config dict and the game lists of each split.

Two sources, one code path (alfworld's own ``AlfredTWEnv.collect_game_files``):

* the **full ALFWorld data set** when ``$ALFWORLD_DATA/json_2.1.1`` exists (the
  layout ``alfworld-download`` produces): ``train`` -> ``json_2.1.1/train``,
  ``eval_id`` -> ``json_2.1.1/valid_seen``, ``eval_ood`` -> ``json_2.1.1/valid_unseen``;
* otherwise the **generated task set** (:mod:`milegpo.envs.alfworld.generate`),
  written on first use to ``$MILEGPO_CACHE/alfworld/generated-v<N>`` (default
  ``~/.cache/milegpo``): ``train`` / ``eval_id`` / ``eval_ood`` folders.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from milegpo.envs.alfworld.generate import TASK_TYPES, ensure_task_set

#: Our split names -> (alfworld's ``train_eval`` argument, folder of the full data set).
SPLITS = {
    "train": ("train", "train"),
    "eval_id": ("eval_in_distribution", "valid_seen"),
    "eval_ood": ("eval_out_of_distribution", "valid_unseen"),
}
#: Other accepted spellings of the splits (alfworld's and ALFRED's names).
SPLIT_ALIASES = {"eval_in_distribution": "eval_id", "valid_seen": "eval_id",
                 "eval_out_of_distribution": "eval_ood", "valid_unseen": "eval_ood"}

_ALFWORLD_DEFAULT_DATA = Path("~/.cache/alfworld").expanduser()
#: Fixed seed of the task order: seed s -> game s % num_tasks walks this order.
_ORDER_SEED = 0


def canonical_split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; use one of {sorted(SPLITS)} "
                         f"(aliases: {sorted(SPLIT_ALIASES)})")
    return split


def canonical_task_types(task_types: Iterable[str | int] | None) -> tuple[str, ...]:
    """Task types by name or by alfworld's ids 1..6; None means all six."""
    if task_types is None:
        return TASK_TYPES
    names = []
    for t in task_types:
        name = TASK_TYPES[t - 1] if isinstance(t, int) and 1 <= t <= len(TASK_TYPES) else t
        if name not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task type {t!r}; use one of {list(TASK_TYPES)} or ids 1..6")
        names.append(name)
    if not names:
        raise ValueError("task_types is empty")
    return tuple(sorted(set(names), key=TASK_TYPES.index))


def resolve_data_root(data_root: str | os.PathLike | None = None, size: str | None = None) -> tuple[Path, bool]:
    """Return (root, is_full_dataset).

    ``data_root`` may point at an ALFWorld download (a folder holding
    ``json_2.1.1``, or ``json_2.1.1`` itself) or at a generated task set. When
    None: ``$ALFWORLD_DATA`` if it holds ``json_2.1.1``, else the generated set.
    ``size`` (``"standard"`` / ``"small"``) asks for a generated set of that size.
    """
    if size is not None:
        if data_root is not None:
            raise ValueError("give either data_root or size (a generated task set), not both")
        return ensure_task_set(size=size), False
    if data_root is None:
        env_value = os.environ.get("ALFWORLD_DATA")
        candidate = Path(env_value).expanduser() if env_value else _ALFWORLD_DEFAULT_DATA
        if (candidate / "json_2.1.1").is_dir():
            return candidate / "json_2.1.1", True
        if env_value and Path(env_value).expanduser() != _ALFWORLD_DEFAULT_DATA:
            raise FileNotFoundError(
                f"ALFWORLD_DATA={env_value!r} has no json_2.1.1 folder. Point it at an ALFWorld download "
                "(run `alfworld-download`), or unset it to use milegpo's generated task set.")
        return ensure_task_set(), False
    root = Path(data_root).expanduser()
    if (root / "json_2.1.1").is_dir():
        return root / "json_2.1.1", True
    if root.name == "json_2.1.1" or (root / "valid_seen").is_dir():
        return root, True
    if (root / "train").is_dir():
        return root, False
    raise FileNotFoundError(f"{str(root)!r} is neither an ALFWorld download (json_2.1.1/...) nor a generated "
                            "task set (train/, eval_id/, eval_ood/)")


def alfworld_config(root: str | os.PathLike, full_dataset: bool, task_types: Iterable[str] = TASK_TYPES,
                    max_episode_steps: int = 50, expert_type: str = "handcoded") -> dict[str, Any]:
    """The config dict alfworld's ``AlfredTWEnv`` reads (alfworld 0.4.2 ships no ``base_config.yaml``)."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    root = Path(root)
    folder = {s: root / (full if full_dataset else s) for s, (_, full) in SPLITS.items()}
    return {
        "dataset": {
            "data_path": str(folder["train"]),
            "eval_id_data_path": str(folder["eval_id"]),
            "eval_ood_data_path": str(folder["eval_ood"]),
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "logic": {"domain": ALFRED_PDDL_PATH, "grammar": ALFRED_TWL2_PATH},
        "env": {
            "type": "AlfredTWEnv",
            "goal_desc_human_anns_prob": 0.0,
            "task_types": [TASK_TYPES.index(t) + 1 for t in task_types],
            "domain_randomization": False,
            "expert_type": expert_type,
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": max_episode_steps}},
        "rl": {"training": {"max_nb_steps_per_episode": max_episode_steps}},
    }


@functools.lru_cache(maxsize=32)
def game_files(root: str, full_dataset: bool, split: str, task_types: tuple[str, ...]) -> tuple[str, ...]:
    """The solvable games of a split, collected by alfworld's ``AlfredTWEnv``, in a fixed shuffled order.

    alfworld walks the folders in file-system order; we sort the paths and
    shuffle them with a fixed seed, so the order is the same on every machine
    and the first ``n`` games mix all task types.
    """
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = alfworld_config(root, full_dataset, task_types)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        files = sorted(AlfredTWEnv(config, train_eval=SPLITS[split][0]).game_files)
    if not files:
        raise FileNotFoundError(f"no ALFWorld games of types {list(task_types)} in split {split!r} under {root}")
    random.Random(_ORDER_SEED).shuffle(files)
    return tuple(files)
