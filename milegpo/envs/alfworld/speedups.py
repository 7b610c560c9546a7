"""Memoise two pure, expensive computations that textworld's PDDL engine repeats.

Profiling a step of ``PddlEnv`` shows most of its time in re-parsing the same
few text-grammar templates with tatsu (every admissible command and feedback
is derived from its template on every step), and a reset mostly in
re-translating the game's PDDL problem to SAS with fast-downward. Both are pure
functions of their text input, so we cache them in-process:

* ``textworld.envs.pddl.textgen._parse_and_convert`` (grammar template ->
  symbols) and ``textworld.logic._parse_and_convert`` (condition text -> rule):
  cached per input string; every call gets a fresh deep copy of the cached
  result, because the derivation writes contexts into what it gets;
* ``fast_downward.pddl2sas`` as seen by ``textworld.envs.pddl.logic``
  (domain + problem -> translated task): cached per input; the result is only
  read afterwards (the planner state is rebuilt from it on every reset).

The translation wrapper also restores ``sys.argv``, which fast-downward's
``pddl2sas`` overwrites. Observations, admissible commands and plans are
unchanged (tested). Set
``MILEGPO_ALFWORLD_NO_ENGINE_CACHE=1`` to run the engine unmodified.
"""

from __future__ import annotations

import copy
import functools
import os
import sys

_TRANSLATION_CACHE_SIZE = 64
_TEMPLATE_CACHE_SIZE = 4096
_MAX_CACHED_TEXT = 1000


class _CachedTranslation:
    """Stands in for the ``fast_downward`` module inside textworld's PDDL logic, caching ``pddl2sas``."""

    def __init__(self, module):
        self._module = module
        self.pddl2sas = functools.lru_cache(maxsize=_TRANSLATION_CACHE_SIZE)(self._translate)

    def _translate(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        argv = sys.argv  # fast-downward's pddl2sas rebinds sys.argv; give the caller's back
        try:
            return self._module.pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv = argv

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _cached_parser(parse):
    """Wrap a ``_parse_and_convert(text, **options)`` function with a cache keyed by its arguments."""
    cached = functools.lru_cache(maxsize=_TEMPLATE_CACHE_SIZE)(lambda text, options: parse(text, **dict(options)))

    @functools.wraps(parse)
    def parse_and_convert(text, **options):
        if not isinstance(text, str) or len(text) > _MAX_CACHED_TEXT:  # whole game files: parsed once anyway
            return parse(text, **options)
        try:
            result = cached(text, tuple(sorted(options.items())))
        except TypeError:  # unhashable arguments: parse without the cache
            return parse(text, **options)
        return copy.deepcopy(result)

    vars(parse_and_convert)["__wrapped_parser__"] = parse
    return parse_and_convert


@functools.lru_cache(maxsize=1)
def install() -> bool:
    """Install both caches once per process; returns False when disabled by the env variable."""
    if os.environ.get("MILEGPO_ALFWORLD_NO_ENGINE_CACHE", "") not in ("", "0"):
        return False
    import fast_downward
    import textworld.logic
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen

    if not isinstance(pddl_logic.fast_downward, _CachedTranslation):
        pddl_logic.fast_downward = _CachedTranslation(fast_downward)
    for module in (textgen, textworld.logic):
        if not hasattr(module._parse_and_convert, "__wrapped_parser__"):
            module._parse_and_convert = _cached_parser(module._parse_and_convert)
    return True
