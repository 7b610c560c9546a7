"""One-step off-policy rollouts (``algo.max_staleness=1``): the next rollout is played during the update.

With ``max_staleness=0`` (the default) an iteration is *rollout, credit, update*, and every
rollout is sampled by the weights it is trained on. With ``max_staleness=1`` the trainer,
at the start of update ``k``, copies the weights it is about to change into a *behaviour
policy* and plays rollout ``k + 1`` with it in a background thread while the update runs:
the envs step and the behaviour policy acts while the optimizer works. Rollout ``k + 1`` is
then trained by update ``k + 1``, one update after the weights that sampled it (policy lag 1,
logged as ``rollout/policy_lag``); its importance ratio divides by the log-probs recorded at
sampling time (``ActionSample.old_logprobs``, the behaviour policy's), so the PPO clip
corrects for the lag as it does for the several minibatches of an epoch.

The behaviour policy (:func:`behaviour_copy`) is the policy deep-copied with its frozen
weights (the base model's parameters and buffers) and its optimizer *shared*: what is copied
is the trainable (LoRA) parameters, the tokenizer and the small Python objects around them.
Before each overlapped rollout :func:`copy_weights` refreshes the copy's trainable
parameters from the policy. The update only changes the policy's own trainable parameters,
so the two threads never write a tensor the other reads.

The thread only plays: it adds the steps to its own buffer and keeps them
(:class:`OverlappedRollout`). The run's counters, SB3's episode buffers and the callbacks
see the steps when the next iteration takes the rollout (:meth:`OverlappedRollout.join`),
in the order they were played; credit, the rollout log and every collective operation run
there too, in the trainer's thread. So a checkpoint saved while a rollout is in flight
holds the counters of the completed iterations only, plus the behaviour adapter (the
weights the rollout in flight samples with): a resumed run plays that rollout again with
those weights and the same seeds, and goes on as the uninterrupted run did.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import torch as th

from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.algos.iteration import Collected, RolloutPlan, SamplingPolicy, StepHooks, collect
from milegpo.algos.rollout import RolloutStep
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies import LLMPolicy


def behaviour_copy(policy: LLMPolicy) -> LLMPolicy:
    """A copy of ``policy`` that shares its frozen parameters and buffers and its optimizer, and owns a
    copy of its trainable parameters (see the module docstring)."""
    memo: dict[int, object] = {id(t): t for t in policy.parameters() if not t.requires_grad}
    memo.update({id(t): t for t in policy.buffers()})
    memo[id(policy.optimizer)] = policy.optimizer
    return copy.deepcopy(policy, memo)


def copy_weights(source: LLMPolicy, target: LLMPolicy) -> None:
    """Set ``target``'s trainable parameters to ``source``'s (two policies of one architecture)."""
    sources, targets = source.trainable_parameters(), target.trainable_parameters()
    if [t.shape for t in sources] != [t.shape for t in targets]:
        raise ValueError("the behaviour policy's trainable parameters do not match the policy's")
    with th.no_grad():
        for src, dst in zip(sources, targets):
            dst.copy_(src)


@dataclass
class OverlappedRollout:
    """A rollout played in a background thread into its own buffer, taken by the next iteration.

    :param plan: the rollout's plan (its iteration, seeds and the behaviour weights' version).
    :param buffer: the buffer it fills (not the one the update reads).
    :param steps: the played steps, in order, replayed to the run's hooks by :meth:`join`.
    """

    plan: RolloutPlan
    buffer: TextRolloutBuffer
    steps: list[RolloutStep] = field(default_factory=list)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _collected: Collected | None = None
    _error: BaseException | None = None

    @classmethod
    def start(cls, policy: SamplingPolicy, env: GroupedTextVecEnv, buffer: TextRolloutBuffer,
              plan: RolloutPlan) -> OverlappedRollout:
        """Start playing a rollout of ``env`` (from a fresh reset with ``plan``'s seeds) with ``policy``."""
        flight = cls(plan, buffer)

        def keep(step: RolloutStep, _: TextRolloutBuffer) -> bool:
            flight.steps.append(step)
            return not flight._cancelled.is_set()

        def play() -> None:
            try:
                flight._collected = collect(policy, env, buffer, plan, StepHooks(lambda: None, keep))
            except BaseException as exc:  # handed to the trainer's thread by join()
                flight._error = exc

        flight._thread = threading.Thread(target=play, name=f"milegpo-rollout-{plan.iteration}", daemon=True)
        flight._thread.start()
        return flight

    def join(self, hooks: StepHooks) -> Collected | None:
        """Wait for the rollout, then give its steps to ``hooks`` in order (the run counts them, its
        callbacks see them); raises what the thread raised; None when a hook stopped the rollout."""
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        hooks.rollout_started()
        for step in self.steps:
            if not hooks.step_played(step, self.buffer):
                return None
        return self._collected

    def cancel(self) -> None:
        """Stop the rollout at its next step and wait for the thread (training ended or failed meanwhile);
        its steps and any error are dropped."""
        self._cancelled.set()
        if self._thread is not None:
            self._thread.join()
