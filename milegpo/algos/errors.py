"""The errors that stop training with one message (``milegpo train`` prints it as ``error: ...``)."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """Training cannot go on, or did not train: every env fails, or no update could be applied.

    The message names the cause and where to look; the run folder keeps what was written.
    """
