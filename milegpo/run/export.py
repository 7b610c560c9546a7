"""Export a trained run for use outside milegpo: the LoRA adapter in peft's format, or a merged model.

``milegpo export RUN_DIR OUT`` writes the run's final (or latest) adapter with the
tokenizer; it loads with ``PeftModel.from_pretrained(base, OUT)`` and carries the run's
``r`` and ``lora_alpha`` (checked after writing: an exported adapter with another scale
would silently change the model). ``--merged`` folds the adapter into the base weights
(``merge_and_unload``) and writes a plain ``save_pretrained`` model + tokenizer that
loads with ``AutoModelForCausalLM.from_pretrained(OUT)`` or ``vllm.LLM(OUT)``, no peft
needed. Weights are written as safetensors, in the dtype the policy trained in.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False, overwrite: bool = False) -> Path:
    """Write the run's trained policy to ``out`` (see the module docstring); returns ``out``.

    Raises ``FileNotFoundError`` for a folder that is no run (or has no checkpoint yet) and
    ``FileExistsError`` when ``out`` is not empty and ``overwrite`` is False.
    """
    from milegpo.run.train import load_run

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{str(out)!r} is not empty: choose another folder or pass --overwrite")
    config, model = load_run(run_dir)
    policy = model.policy
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if merged:
            merged_model = policy.model.merge_and_unload()
            merged_model.save_pretrained(str(tmp), safe_serialization=True)
        else:
            policy.save_adapter(tmp)
            _absolute_base_path(tmp / "adapter_config.json")
            _check_adapter_config(tmp / "adapter_config.json", policy.model.peft_config["default"])
        policy.tokenizer.save_pretrained(str(tmp))
        (tmp / "milegpo_export.json").write_text(json.dumps(
            {"run_dir": str(Path(run_dir).resolve()), "algo": config.algo.method, "env": config.env.id,
             "num_timesteps": int(model.num_timesteps), "merged": merged,
             "base_model": _resolved(str(policy.model_name))}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _resolved(name: str) -> str:
    """A local path made absolute; a hub id unchanged."""
    return str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name


def _absolute_base_path(path: Path) -> None:
    """An adapter names its base model by the path the run used (``runs/x/base_model``, relative to
    where training ran): make a local path absolute so the export loads from any directory
    (a hub id, which is no local path, stays as it is)."""
    saved = json.loads(path.read_text())
    base = saved.get("base_model_name_or_path")
    resolved = _resolved(base) if base else base
    if resolved != base:
        saved["base_model_name_or_path"] = resolved
        path.write_text(json.dumps(saved, indent=2) + "\n")


def _check_adapter_config(path: Path, lora: Any) -> None:
    """The written adapter config must carry the trained rank and scale (``lora_alpha / r``)."""
    saved = json.loads(path.read_text())
    if int(saved.get("r", -1)) != int(lora.r) or float(saved.get("lora_alpha", -1)) != float(lora.lora_alpha):
        raise RuntimeError(f"the exported adapter config has r={saved.get('r')} lora_alpha={saved.get('lora_alpha')}, "
                           f"but the policy trained with r={lora.r} lora_alpha={lora.lora_alpha}")
