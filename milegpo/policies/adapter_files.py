"""What an LLMPolicy keeps on disk: its LoRA adapter and its settings, nothing pickled.

A saved policy is a folder with peft's ``adapter_model.safetensors`` +
``adapter_config.json`` and ``policy.json`` (the constructor's settings, plain JSON);
loading rebuilds the policy from its base model and these files. ``state_dict`` holds only
the trainable (LoRA) tensors, so SB3-style checkpoints never copy the base model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch as th
from peft import LoraConfig, PeftModel
from stable_baselines3.common.policies import BasePolicy

from milegpo.spaces import TextSpace

POLICY_FILE = "policy.json"


class AdapterFilesMixin(BasePolicy):
    """Saving and loading of :class:`~milegpo.policies.LLMPolicy` (its base class)."""

    #: the causal LM with its LoRA adapter (set by the policy)
    model: PeftModel

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, th.Tensor]:  # type: ignore[override]
        """Only the trainable (LoRA) tensors: the base model is reloaded from ``model``."""
        full = super().state_dict(*args, **kwargs)
        names = {f"model.{n}" for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in full.items() if k in names}

    def load_state_dict(self, state_dict: dict[str, th.Tensor], strict: bool = True,  # type: ignore[override]
                        assign: bool = False) -> Any:
        """Load LoRA tensors saved by :meth:`state_dict` (strict: exactly the same keys)."""
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if strict and (missing or unexpected):
            raise RuntimeError(f"adapter state mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return super().load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False, assign=assign)

    def save_adapter(self, path: str | os.PathLike) -> None:
        """Save the LoRA adapter with peft (``adapter_model.safetensors`` + ``adapter_config.json``).

        peft keeps ``target_modules`` as a set and writes it in hash order, which changes
        from process to process: the list is sorted here so that equal adapters give
        equal files.
        """
        self.model.save_pretrained(str(path), safe_serialization=True)
        config_file = Path(path) / "adapter_config.json"
        config = json.loads(config_file.read_text())
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load adapter weights saved by :meth:`save_adapter` into this policy's adapter."""
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = Path(path)
        weights, config_file = path / "adapter_model.safetensors", path / "adapter_config.json"
        if not weights.is_file() or not config_file.is_file():
            raise FileNotFoundError(f"{path} holds no saved adapter (adapter_model.safetensors + adapter_config.json)")
        saved = json.loads(config_file.read_text())
        ours = self.model.peft_config["default"]
        assert isinstance(ours, LoraConfig)
        targets = ours.target_modules if isinstance(ours.target_modules, (list, set)) else [ours.target_modules]
        same_modules = set(saved.get("target_modules") or []) == {t for t in targets if t}
        if int(saved.get("r", -1)) != ours.r or not same_modules:
            raise ValueError(
                f"adapter in {path} (r={saved.get('r')}, target_modules={saved.get('target_modules')}) does not match "
                f"this policy (r={ours.r}, target_modules={sorted(t for t in targets if t)})"
            )
        try:
            state = load_file(str(weights), device=str(self.device))
        except Exception as err:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"cannot read adapter weights {weights}: {err}") from err
        result = set_peft_model_state_dict(self.model, state)
        bad = list(getattr(result, "unexpected_keys", []))
        if bad:
            raise ValueError(f"adapter in {path} has tensors this model lacks: {bad[:5]}")

    def save(self, path: str | os.PathLike) -> None:
        """Save the policy to a folder: the adapter (safetensors) and ``policy.json`` (the settings).

        Nothing is pickled; :meth:`load` rebuilds the policy from the base model and these two files.
        """
        path = Path(path)
        self.save_adapter(path)
        params = self._get_constructor_parameters()
        for key in ("observation_space", "action_space"):
            params.pop(key)
        (path / POLICY_FILE).write_text(json.dumps(params, indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "auto", **overrides: Any) -> Any:  # type: ignore[override]
        """Rebuild a policy saved by :meth:`save` (``overrides`` replace saved
        :class:`~milegpo.config.PolicyConfig` fields, e.g. ``temperature``)."""
        path = Path(path)
        if not (path / POLICY_FILE).is_file():
            raise FileNotFoundError(f"{path} holds no saved LLMPolicy ({POLICY_FILE} missing)")
        params = json.loads((path / POLICY_FILE).read_text())
        params["device"] = device
        policy = cls(TextSpace(), TextSpace(), lambda _: 0.0, **params, **overrides)
        policy.load_adapter(path)
        return policy
