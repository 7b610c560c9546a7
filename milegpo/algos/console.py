"""The console view of a training run: one line per iteration with the numbers a user reads.

SB3's ``HumanOutputFormat`` prints every logged key as a table (~75 lines an iteration
here). :class:`IterationLineFormat` prints the headline instead: iteration, env steps,
the train rollouts' success, each held-out split's success, the update's loss and the
iteration's seconds. ``verbose=1`` uses it; ``verbose=2`` the full table.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from stable_baselines3.common.logger import HumanOutputFormat, KVWriter, Logger


class IterationLineFormat(KVWriter):
    """One line per log row (iteration): the headline numbers, absent ones left out."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        def number(key: str) -> float | None:
            value = key_values.get(key)
            return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

        steps = int(number("time/total_timesteps") or step)
        parts = [f"iter {int(number('time/iterations') or 0):>4d}", f"steps {steps:>9,d}"]
        train = number("rollout/success_rate")
        parts.append("untrained policy" if train is None else f"train success {train:.3f}")
        splits = sorted({key.split("/")[1] for key in key_values if key.startswith("eval/") and key.count("/") == 2})
        held_out = [(split, number(f"eval/{split}/success_rate")) for split in splits]
        held_out.append(("", number("eval/success_rate")))  # an EvalCallback with the default log_name "eval"
        shown = [f"{split} {value:.3f}".strip() for split, value in held_out if value is not None]
        if shown:
            parts.append("held-out " + ", ".join(shown))
        loss = number("train/loss")
        if loss is not None:
            parts.append(f"loss {loss_text(loss)}")
        if number("train/skipped_steps"):
            parts.append(f"{int(number('train/skipped_steps') or 0)} update steps skipped (non-finite)")
        seconds = sum(number(k) or 0.0 for k in ("time/rollout_s", "time/credit_s", "time/update_s"))
        if seconds:
            parts.append(f"{seconds:.1f} s")
        evaluation = sum(number(k) or 0.0 for k in key_values if k.startswith("time/eval") and k.endswith("_s"))
        if evaluation:  # the held-out evaluations of this iteration (EvalCallback's time/<log_name>_s)
            parts.append(f"eval {evaluation:.1f} s")
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


def console_format(verbose: int) -> KVWriter | None:
    """The console writer for a verbosity: None (0), one line per iteration (1), the full table (2+)."""
    if verbose <= 0:
        return None
    return IterationLineFormat() if verbose == 1 else HumanOutputFormat(sys.stdout)


def use_console_format(logger: Logger, verbose: int) -> None:
    """Replace the stdout table SB3's default logger has by the writer of ``verbose``."""
    formats = [f for f in logger.output_formats
               if not (isinstance(f, HumanOutputFormat) and getattr(f, "file", None) is sys.stdout)]
    console = console_format(verbose)
    logger.output_formats = ([console] if console is not None else []) + formats


def loss_text(loss: float) -> str:
    """A loss for the console: four decimals, or three significant digits when it is smaller than that
    (a small run's losses are ~1e-6, which four decimals show as a meaningless ``+0.0000``)."""
    return f"{loss:+.4f}" if loss == 0 or abs(loss) >= 1e-3 else f"{loss:+.3e}"
