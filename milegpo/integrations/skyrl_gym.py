"""SkyRL-Gym environments as milegpo :class:`~milegpo.envs.TextEnv` s.

`skyrl-gym <https://pypi.org/project/skyrl-gym/>`_ environments are text-in /
text-out: ``env.init(prompt)`` takes the task's chat messages, ``env.step(reply)``
returns ``{"observations": [messages], "reward", "done", "metadata"}``. Every env is
built for one task: its constructor gets the task's dataset row (``extras``) with the
``reward_spec`` (e.g. the ground truth) and ``extra_info``. :class:`SkyRLGymEnv` turns
a skyrl-gym env class plus a list of such rows (the rows of a SkyRL dataset; see
:func:`load_skyrl_tasks`) into one :class:`TextEnv`, so the grouped vector env, every
credit function and both rollout modes work on it::

    from milegpo.integrations.skyrl_gym import SkyRLGymEnv, load_skyrl_tasks
    tasks = load_skyrl_tasks("gsm8k/train.parquet")            # SkyRL's dataset format
    env = make_vec_env(SkyRLGymEnv, n_tasks=4, group_size=8,
                       env_kwargs={"env_class": "gsm8k_multi_turn", "tasks": tasks})

How SkyRL's conventions map to milegpo's:

* **Task.** ``reset(seed=s)`` builds a fresh skyrl-gym env for row ``s % len(tasks)``
  (the same seed gives the same task: that is how a group shares one task). The
  episode's ``task`` is the last user message of the row's prompt; the first
  observation is the whole prompt (system messages marked ``system:``), and the prompt's
  messages themselves are the episode's opening ``messages``: with the policy's chat
  prompt format (``prompt_format="chat"``) the conversation starts from them unchanged.
* **Observation.** The messages a step returns, joined; an empty list reads
  ``"(no new observation)"``. Their role (``user`` or ``tool``) is the step's
  ``observation_role`` in a chat prompt.
* **Success.** skyrl-gym has no success flag: an episode is won when it ends with a
  step reward of at least ``success_reward`` (gsm8k: 1.0 for the right answer).
* **Actions.** Free text (``admissible_commands()`` is None: generate mode), or a
  fixed list of ``commands`` for choose mode. The skyrl env parses the reply itself
  (``action_format = "message"``: the whole reply reaches it, ``####`` answers and
  ``<sql>`` blocks included), so only an empty reply counts as invalid here.
* **State key.** ``"<turn>|<normalised observation>"``: skyrl-gym envs often send the
  same message every turn ("provide your reasoning ..."), and without the turn number
  all turns of an episode would be one state. Pass ``state_key_fn`` to use the env's
  own notion of state.
* **Horizon.** The skyrl env ends its episodes itself (``max_turns``);
  ``max_episode_steps`` is a cap on top.

Importing this module does not import skyrl-gym; constructing an env does, with an
error naming the install command when it is missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from milegpo.envs.core import TextEnv, normalize_text
from milegpo.envs.registry import register_env

INSTALL_HINT = 'pip install "milegpo[skyrl]"  (or: pip install skyrl-gym)'
NO_OBSERVATION = "(no new observation)"


def register_skyrl_env(env_id: str, env_class: str, tasks: Sequence[Mapping[str, Any]], **kwargs: Any) -> None:
    """Register a skyrl-gym env over ``tasks`` under a milegpo env id, for ``make_vec_env(env_id)`` and
    ``TrainConfig(env=env_id)`` in this process."""
    register_env(env_id, SkyRLGymEnv, env_class=env_class, tasks=[dict(row) for row in tasks], **kwargs)


def _import_skyrl_gym() -> Any:
    try:
        import skyrl_gym
    except ImportError as error:
        raise ImportError(f"SkyRLGymEnv needs skyrl-gym, which is not installed: {INSTALL_HINT}") from error
    return skyrl_gym


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as one observation string: user and tool contents as they are, other roles prefixed."""
    parts = []
    for message in messages:
        content = str(message.get("content", "")).strip()
        role = message.get("role", "user")
        parts.append(content if role in ("user", "tool") else f"{role}: {content}")
    return "\n".join(part for part in parts if part)


def load_skyrl_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a SkyRL dataset file (``.parquet`` as SkyRL's dataset scripts write, or ``.jsonl``/``.json``).

    Each row needs a ``prompt`` (chat messages); ``env_class``, ``reward_spec`` and
    ``extra_info`` are passed on to the skyrl-gym env like SkyRL's generator does.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(path).to_dict(orient="records")
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif path.suffix == ".json":
        rows = json.loads(path.read_text())
    else:
        raise ValueError(f"{path}: a SkyRL dataset is a .parquet, .jsonl or .json file")
    return [_plain(row) for row in rows]


def _plain(value: Any) -> Any:
    """numpy arrays and scalars that parquet gives back -> lists and Python scalars (picklable, JSON-able)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class SkyRLGymEnv(TextEnv):
    """A skyrl-gym env class over a list of task rows, as a :class:`TextEnv` (see the module docstring).

    The env parses its replies itself: :attr:`action_format` is ``"message"``.

    :param env_class: a skyrl-gym env id (``"gsm8k_multi_turn"``, ``"text2sql"``, ...);
        a row's own ``env_class`` takes precedence.
    :param tasks: the dataset rows (``prompt``, ``reward_spec``, ``extra_info``, ...).
    :param env_config: the skyrl-gym ``env_config`` (SkyRL's ``environment.skyrl_gym.<env>`` block).
    :param success_reward: the final step reward from which an episode counts as won.
    :param commands: a fixed list of admissible replies (choose mode); None = free text.
    :param state_key_fn: ``(skyrl_env, observation) -> str``; default: turn and observation.
    """

    action_format = "message"

    def __init__(
        self,
        env_class: str,
        tasks: Sequence[Mapping[str, Any]],
        env_config: Mapping[str, Any] | None = None,
        success_reward: float = 1.0,
        commands: Sequence[str] | None = None,
        state_key_fn: Callable[[Any, str], str] | None = None,
        invalid_action_penalty: float = 0.0,
        max_episode_steps: int = 50,
        render_mode: str | None = None,
    ):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode)
        if not tasks:
            raise ValueError("SkyRLGymEnv needs at least one task row")
        missing = [i for i, row in enumerate(tasks) if "prompt" not in row]
        if missing:
            raise ValueError(f"task rows {missing[:5]} have no 'prompt' (chat messages): not SkyRL dataset rows")
        self._skyrl_gym = _import_skyrl_gym()
        known = set(self._skyrl_gym.envs.registration.registry)
        for name in {row.get("env_class", env_class) for row in tasks}:
            if name not in known:
                raise KeyError(f"skyrl-gym has no env {name!r}; registered: {sorted(known)}")
        self.env_class = env_class
        self.tasks = [dict(row) for row in tasks]
        self.env_config = dict(env_config or {})
        self.success_reward = float(success_reward)
        self.commands = list(commands) if commands is not None else None
        self.state_key_fn = state_key_fn
        self.skyrl_env: Any = None
        self.task_index = 0

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self.close()
        index = int(self.np_random.integers(len(self.tasks))) if seed is None else seed % len(self.tasks)
        row = self.tasks[index]
        extras = {"reward_spec": {}, "extra_info": {}, **row}
        self.skyrl_env = self._skyrl_gym.make(row.get("env_class", self.env_class), env_config=self.env_config,
                                              extras=extras)
        prompt, _ = self.skyrl_env.init(list(row["prompt"]))
        user_messages = [m for m in prompt if m.get("role") == "user"]
        task = str(user_messages[-1]["content"]).strip() if user_messages else render_messages(prompt)
        self.task_index = index
        messages = [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in prompt]
        return render_messages(prompt), {"task": task, "task_index": index, "messages": messages}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        output = self.skyrl_env.step(action)
        reward, done = float(output["reward"]), bool(output["done"])
        messages = output.get("observations") or []
        observation = render_messages(messages) or NO_OBSERVATION
        info: dict[str, Any] = {"won": done and reward >= self.success_reward, "score": reward,
                                "skyrl_metadata": output.get("metadata") or {},
                                "observation_role": str(messages[-1].get("role", "user")) if messages else "user"}
        if done:
            info["skyrl_metrics"] = dict(self.skyrl_env.get_metrics())
        return observation, reward, done, info

    def admissible_commands(self) -> list[str] | None:
        return list(self.commands) if self.commands is not None else None

    def state_key(self) -> str:
        if self.state_key_fn is not None:
            return str(self.state_key_fn(self.skyrl_env, self._observation))
        return f"{self._elapsed_steps}|{normalize_text(self._observation)}"

    def close(self) -> None:
        if self.skyrl_env is not None:
            self.skyrl_env.close()
            self.skyrl_env = None
