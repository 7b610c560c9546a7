"""The cycle collector during a run: the objects alive when training starts are left out of its full collections.

By the time a run trains, the process holds about 420,000 objects the cycle collector tracks (torch's,
transformers' and peft's modules, functions and classes, the model, the envs), and nearly all of them
live until the process ends. Every full collection walks all of them: about 0.25 s of CPU each on the
CPU demo's machine. Python starts one whenever the objects that survived the younger collections since
the last one reach a quarter of the objects that survived it, and the rollouts and evaluations keep
many objects alive for a while (each step's sample, history turn, info and prompt ids, kept scores):
the demo ran five of them during its evaluations alone, 1.2-1.3 s of their 8 s of CPU.

:func:`frozen_heap` moves the objects alive when it is entered into the collector's permanent
generation (``gc.freeze``) and moves them back when it is left (``gc.unfreeze``). Nothing about
what is freed changes but when: an object is still freed as soon as its last reference goes (reference
counting), and objects created inside are collected as before; only a reference cycle among the
objects that were frozen is collected after the block instead of during it (its memory is held until
then). Before freezing it runs one full collection, so no garbage already unreachable is frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[bool]:
    """Inside the block, the objects alive when it was entered skip the cycle collector's collections
    (see the module docstring); yields whether it froze them. Where objects are frozen already (the
    process froze them itself, or an enclosing block did), it leaves them as they are: it neither
    freezes nor unfreezes."""
    if gc.get_freeze_count():
        yield False
        return
    gc.collect()
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
