"""What ``milegpo serve`` serves: a run folder, an export, or a model, loaded as an :class:`LLMPolicy`.

* a run folder written by ``milegpo train``: its final (else latest) checkpoint, with the run's own
  policy settings (model, adapter, temperature, ``max_new_tokens``, sampler), on the run's device;
* a folder written by ``milegpo export``: the LoRA adapter on its base model (the copy in
  ``OUT/base_model`` when the export carries one), or a ``--merged`` model;
* any other causal LM folder or hub name, as is.

An export or a model gets the policy's default settings in generate mode. Whatever the run trained
in, the server generates: a choose-mode policy scores an env's admissible commands, and a chat
request lists none (:attr:`ServedPolicy.trained_mode` says which it was).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milegpo.run_folder import BASE_MODEL_DIR, CONFIG_FILE

ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class ServedPolicy:
    """A loaded policy and how to name it.

    :param policy: the :class:`~milegpo.policies.LLMPolicy`.
    :param name: the model name clients address (the folder's name, or the hub id).
    :param kind: ``"run"``, ``"adapter"`` (a LoRA export) or ``"model"``.
    :param trained_mode: the mode the policy trained in (``"generate"`` or ``"choose"``).
    """

    policy: Any
    name: str
    kind: str
    trained_mode: str


def load_served_policy(source: str, device: str = "auto") -> ServedPolicy:
    """The policy ``source`` names (see the module docstring).

    :param device: where an export or a model is loaded (a run folder loads on its ``run.device``).
    Raises ``FileNotFoundError`` / ``ValueError`` with one line naming what ``source`` lacks.
    """
    path = Path(source).expanduser()
    if path.is_dir() and _is_run_folder(path):
        from milegpo.run.finish import load_run

        config, model = load_run(path)
        return ServedPolicy(model.policy, path.resolve().name, "run", config.policy.mode)
    if path.is_dir() and (path / ADAPTER_CONFIG).is_file():
        return ServedPolicy(_adapter_policy(path, device), path.resolve().name, "adapter", "generate")
    name = path.resolve().name if path.exists() else source
    return ServedPolicy(_new_policy(str(path) if path.exists() else source, device), name, "model", "generate")


def _is_run_folder(path: Path) -> bool:
    """A run folder's ``config.json`` is a TrainConfig (a model folder's is a transformers config)."""
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "algo" in config and "model_type" not in config


def _new_policy(model: str, device: str, **settings: Any) -> Any:
    from milegpo.policies import LLMPolicy
    from milegpo.spaces import TextSpace

    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 0.0, model=model, mode="generate", device=device, **settings)


def _adapter_policy(path: Path, device: str) -> Any:
    """The exported LoRA adapter in ``path`` on its base model, with the adapter's rank, scale and modules."""
    from milegpo.config import LoraConfig

    saved = json.loads((path / ADAPTER_CONFIG).read_text())
    base = path / BASE_MODEL_DIR if (path / BASE_MODEL_DIR).is_dir() else saved.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path / ADAPTER_CONFIG} names no base model (base_model_name_or_path): serve a folder "
                         "`milegpo export` wrote")
    targets = saved.get("target_modules")
    lora = LoraConfig(r=int(saved["r"]), alpha=saved["lora_alpha"],
                      target_modules=sorted(targets) if isinstance(targets, list) else None)
    policy = _new_policy(str(base), device, lora=lora)
    policy.load_adapter(path)
    return policy
