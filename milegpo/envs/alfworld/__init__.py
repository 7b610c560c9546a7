"""ALFWorld on the real alfworld engine: :class:`ALFWorldEnv` (id ``milegpo/ALFWorld-v0``).

Games come from the full ALFWorld data set when ``$ALFWORLD_DATA`` holds it,
else from a task set generated offline in ALFWorld's own file format
(:mod:`milegpo.envs.alfworld.generate`), written on first use to
``$MILEGPO_CACHE/alfworld`` (default ``~/.cache/milegpo``).
"""

from milegpo.envs.alfworld.data import alfworld_config, game_files, resolve_data_root
from milegpo.envs.alfworld.env import ALFWorldEnv
from milegpo.envs.alfworld.generate import TASK_TYPES, ensure_task_set, generate_task_set

__all__ = ["ALFWorldEnv", "TASK_TYPES", "alfworld_config", "ensure_task_set", "game_files", "generate_task_set",
           "resolve_data_root"]
