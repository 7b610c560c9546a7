"""Envs written to break things, for tests/test_hostile_envs.py (importable by env worker processes)."""

from __future__ import annotations

import os
import time

from milegpo.envs import TextEnv, register_env


class CountingEnv(TextEnv):
    """A 5-step corridor: "forward" advances, the 5th step wins."""

    def _reset(self, seed, options):
        self.position = 0
        return "room 0", {"task": "walk forward"}

    def _step(self, action):
        self.position += 1
        won = self.position == 5
        return f"room {self.position}", 10.0 if won else 0.0, won, {"won": won}

    def admissible_commands(self):
        return ["forward", "wait"]


class IntObservationEnv(CountingEnv):
    def _reset(self, seed, options):
        super()._reset(seed, options)
        return 5, {"task": "walk forward"}


class NaNRewardEnv(CountingEnv):
    def _step(self, action):
        observation, _, won, info = super()._step(action)
        return observation, float("nan"), won, info


class BrokenResetEnv(CountingEnv):
    def _reset(self, seed, options):
        return {}["missing"]  # a plain bug: KeyError


class BrokenStepEnv(CountingEnv):
    """Plays one step, then crashes."""

    def _step(self, action):
        if self.position == 1:
            raise RuntimeError("the engine crashed")
        return super()._step(action)


class NoCommandsEnv(CountingEnv):
    def admissible_commands(self):
        return []


class HangOnceEnv(CountingEnv):
    """Hangs in its 2nd step once over all processes: the one that creates the file ``marker`` first."""

    def __init__(self, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def _step(self, action):
        if self.position == 1:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                time.sleep(600)
        return super()._step(action)


class WizardRoleEnv(CountingEnv):
    """Opens its chat with a role no chat template knows."""

    def _reset(self, seed, options):
        observation, info = super()._reset(seed, options)
        return observation, {**info, "messages": [{"role": "wizard", "content": "you shall not pass"}]}


class SlowFirstResetEnv(CountingEnv):
    """Its first reset in a process takes a second (an engine loading its data)."""

    loaded = False

    def _reset(self, seed, options):
        if not SlowFirstResetEnv.loaded:
            SlowFirstResetEnv.loaded = True
            time.sleep(1.0)
        return super()._reset(seed, options)


class SlowStepEnv(CountingEnv):
    """Each step waits ``latency`` seconds (an env behind a server or a tool call)."""

    def __init__(self, latency: float = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.latency = latency

    def _step(self, action):
        time.sleep(self.latency)
        return super()._step(action)


for _name in ("Counting", "IntObservation", "NaNReward", "BrokenReset", "BrokenStep", "NoCommands", "HangOnce",
              "WizardRole", "SlowFirstReset", "SlowStep"):
    register_env(f"hostile/{_name}-v0", globals()[f"{_name}Env"], max_episode_steps=8)


class CrashThenUnbuildableEnv(CountingEnv):
    """Kills its worker process at its 2nd step; once it has, it can no longer be built (a broken install)."""

    def __init__(self, marker: str, **kwargs):
        if os.path.exists(marker):
            raise RuntimeError("the engine's files are gone")
        super().__init__(**kwargs)
        self.marker = marker

    def _step(self, action):
        if self.position == 1:
            open(self.marker, "w").close()
            os._exit(1)
        return super()._step(action)


register_env("hostile/CrashThenUnbuildable-v0", CrashThenUnbuildableEnv, max_episode_steps=8)
