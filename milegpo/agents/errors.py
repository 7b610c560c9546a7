"""How an agent program's episode can fail: one exception class per kind of fault.

An :class:`~milegpo.agents.AgentEnv` raises these from ``reset`` or ``step``; the grouped vec env
turns an env's exception into the end of that episode (truncated, its earlier steps kept, counted
in ``rollout/env_errors``) and logs each kind once as one line (then at its 10th, 100th, ...
occurrence), with the traceback in ``RUN_DIR/env_errors.log``. A kind is the exception's class
and the line that raised it, so the three faults below are three kinds whatever the program's
own error says.
"""

from __future__ import annotations


class AgentError(RuntimeError):
    """An agent program's episode ended in a fault (the base of the three kinds)."""


class AgentRaised(AgentError):
    """The agent program raised an exception (the program's own traceback is chained to it)."""


class AgentTimedOut(AgentError):
    """The agent program neither called the model again nor returned within the env's ``timeout``."""


class AgentNeverCalledModel(AgentError):
    """The agent program returned without calling the model: its episode has no step to learn from."""
