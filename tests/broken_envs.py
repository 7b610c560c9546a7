"""Envs with one fault each that training would not notice (wrong keys, non-deterministic resets, bad command
lists, text that is not valid Unicode), for tests/test_env_check.py: ``milegpo check-env`` must find each."""

from __future__ import annotations

import itertools
import random
import uuid

from milegpo.envs import TextEnv

_draws = itertools.count()


class LineEnv(TextEnv):
    """A correct env: walk a line of 5 cells to the right end; the seed picks the start cell."""

    def _reset(self, seed, options):
        self.position = (seed or 0) % 4
        return self._text(), {"task": "reach cell 4"}

    def _text(self) -> str:
        return f"you are on cell {self.position}."

    def _step(self, action):
        self.position += 1 if action == "right" else -1
        won = self.position == 4
        return self._text(), float(won), won, {"won": won}

    def admissible_commands(self):
        return [c for c, ok in (("left", self.position > 0), ("right", self.position < 4)) if ok]

    def state_key(self):
        return str(self.position)


class UnseededResetEnv(LineEnv):
    """Draws its start cell from an unseeded generator: two copies of a task start apart."""

    def _reset(self, seed, options):
        self.position = next(_draws) % 4
        return self._text(), {"task": "reach cell 4"}


class LeakyResetEnv(LineEnv):
    """Counts its episodes in the observation: reset(seed) after an episode is not the same state."""

    episodes = 0

    def _reset(self, seed, options):
        self.episodes += 1
        observation, info = super()._reset(seed, options)
        return f"episode {self.episodes}: {observation}", info


class EpisodeIdKeyEnv(LineEnv):
    """Keys its states with a fresh episode id: no two copies of a task ever share a key."""

    def _reset(self, seed, options):
        self.episode_id = uuid.uuid4().hex
        return super()._reset(seed, options)

    def state_key(self):
        return f"{self.episode_id}:{self.position}"


class StepCountKeyEnv(LineEnv):
    """Keys its states with the step count: a cell reached again is a new key."""

    def state_key(self):
        return f"{self._elapsed_steps}:{self.position}"


class ConstantKeyEnv(LineEnv):
    """One key for every state: cells that offer different moves look like one state to credit."""

    def state_key(self):
        return "the line"


class DuplicateCommandsEnv(LineEnv):
    def admissible_commands(self):
        return [*super().admissible_commands(), "left"]


class PaddedCommandsEnv(LineEnv):
    def admissible_commands(self):
        return [f" {c}" for c in super().admissible_commands()]


class EmptyCommandListEnv(LineEnv):
    def admissible_commands(self):
        return []


class LoneSurrogateEnv(LineEnv):
    """Decodes its engine's bytes with surrogateescape: a lone surrogate reaches the observation."""

    def _text(self) -> str:
        return b"you are on cell \xff".decode("utf-8", errors="surrogateescape") + str(self.position)


class UnseededTaskEnv(LineEnv):
    """Its task text is drawn without the seed."""

    def _reset(self, seed, options):
        observation, _ = super()._reset(seed, options)
        return observation, {"task": f"reach cell 4 ({random.random():.6f})"}
