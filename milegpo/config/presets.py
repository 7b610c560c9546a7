"""Named presets: YAML files (``milegpo/config/presets/<name>.yaml``) of the settings that differ
from the defaults (the paper's), in the sections of a run's config (env, algo, policy, eval, run).

``cpu-demo`` is what ``milegpo train`` runs with no arguments, and what an algorithm built
without a model trains (:mod:`milegpo.algos.offline_setting`); ``paper-alfworld`` and
``paper-webshop`` are the paper's GPU settings.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

PRESETS = ("cpu-demo", "paper-alfworld", "paper-webshop")
#: what ``milegpo train`` uses when given neither a preset nor a config file
DEMO_PRESET = "cpu-demo"


def preset_text(name: str) -> str:
    """The YAML of a named preset."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {list(PRESETS)}")
    return resources.files("milegpo.config").joinpath(f"presets/{name}.yaml").read_text()


def preset_section(name: str, section: str) -> dict[str, Any]:
    """One section of a preset (``"algo"``, ``"policy"``...) as plain values; empty when it has none."""
    values = yaml.safe_load(preset_text(name)) or {}
    return dict(values.get(section) or {})
