"""Export a trained run for use outside milegpo: the LoRA adapter in peft's format, or a merged model.

``milegpo export RUN_DIR OUT`` writes the run's final (or latest) adapter with the
tokenizer; it loads with ``PeftModel.from_pretrained(base, OUT)`` and carries the run's
``r`` and ``lora_alpha`` (checked after writing: an exported adapter with another scale
would silently change the model). ``--merged`` folds the adapter into the base weights
(``merge_and_unload``) and writes a plain ``save_pretrained`` model + tokenizer that
loads with ``AutoModelForCausalLM.from_pretrained(OUT)`` or ``vllm.LLM(OUT)``, no peft
needed. Weights are written as safetensors, in the dtype the policy trained in.

A run whose base model lives in its own folder (the offline tiny model) exports a
self-contained adapter: the base model is copied to ``OUT/base_model`` and the adapter
names it by its absolute path. peft resolves that name against the working directory, so
after moving ``OUT`` load it as ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
OUT/"base_model"), OUT)``. A hub base model stays a hub id; a local base model outside the run
folder is named by its absolute path.

Export only ever replaces what an export wrote (:func:`check_export_target`), and replaces it
atomically: the new export is written beside ``OUT`` and swapped in, so a failed export
leaves the previous one whole.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from milegpo.config.policy import absolute_model_path
from milegpo.policies.model import quiet_library_bars
from milegpo.run_folder import BASE_MODEL_DIR, EXPORT_MARKER, inside


class ExportRefused(ValueError):
    """``OUT`` is a folder export must not write into or replace (the message says why)."""


def check_export_target(run_dir: str | Path, out: str | Path, overwrite: bool) -> None:
    """Refuse, with :class:`ExportRefused`, an ``out`` whose replacement could lose data: the run
    folder itself, a folder containing it or inside it, a file, a non-empty folder that no export
    wrote, and (without ``overwrite``) a previous export."""
    run, target = Path(run_dir).resolve(), Path(out).resolve()
    if target == run:
        raise ExportRefused(f"{str(out)!r} is the run folder itself: export to a new folder outside it")
    if inside(run, target):
        raise ExportRefused(f"{str(out)!r} contains the run folder {str(run_dir)!r}: export to a new folder outside "
                            "it")
    if inside(target, run):
        raise ExportRefused(f"{str(out)!r} is inside the run folder {str(run_dir)!r}: export to a folder outside it")
    if not target.exists():
        return
    if not target.is_dir():
        raise ExportRefused(f"{str(out)!r} is a file: export to a new or empty folder")
    if not any(target.iterdir()):
        return
    if not (target / EXPORT_MARKER).is_file():
        raise ExportRefused(f"{str(out)!r} is not empty and holds no milegpo export (no {EXPORT_MARKER}): "
                            "export to a new or empty folder; --overwrite replaces only a previous export")
    if not overwrite:
        raise ExportRefused(f"{str(out)!r} holds a previous export: pass --overwrite to replace it, or choose "
                            "another folder")


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False, overwrite: bool = False) -> Path:
    """Write the run's trained policy to ``out`` (see the module docstring); returns ``out``.

    Raises ``FileNotFoundError`` for a folder that is no run (or has no checkpoint yet) and
    :class:`ExportRefused` for an ``out`` that :func:`check_export_target` refuses.
    """
    from milegpo.run.train import load_run

    out = Path(out)
    check_export_target(run_dir, out, overwrite)
    config, model = load_run(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        with quiet_library_bars():
            _write_export(tmp, out, run_dir, config, model, merged)
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_export(tmp: Path, out: Path, run_dir: str | Path, config: Any, model: Any, merged: bool) -> None:
    """Write the export of ``model`` (trained by the run ``run_dir`` with ``config``) into ``tmp``,
    the folder that becomes ``out``."""
    policy = model.policy
    base = str(absolute_model_path(str(policy.model_name)))
    if merged:
        merged_model = policy.model.merge_and_unload()
        merged_model.save_pretrained(str(tmp), safe_serialization=True)
    else:
        policy.save_adapter(tmp)
        if Path(base).is_absolute() and inside(Path(base), Path(run_dir)):  # the run's own base: carry a copy
            shutil.copytree(base, tmp / BASE_MODEL_DIR)
            base = str(out.resolve() / BASE_MODEL_DIR)
        _name_base_model(tmp / "adapter_config.json", base)
        _check_adapter_config(tmp / "adapter_config.json", policy.model.peft_config["default"])
    policy.tokenizer.save_pretrained(str(tmp))
    (tmp / EXPORT_MARKER).write_text(json.dumps(
        {"run_dir": str(Path(run_dir).resolve()), "algo": config.algo.method, "env": config.env.id,
         "num_timesteps": int(model.num_timesteps), "merged": merged, "base_model": base}, indent=2) + "\n")


def _swap_in(new: Path, out: Path) -> None:
    """Put the folder ``new`` at ``out``; a previous export there is moved aside first and deleted
    only once the new one is in place (a failure in between puts it back)."""
    if not out.exists():
        os.replace(new, out)
        return
    if not any(out.iterdir()):
        out.rmdir()
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.previous-", dir=out.parent))
    old.rmdir()
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _name_base_model(path: Path, base: str) -> None:
    """Write the base model the exported adapter loads onto (an absolute path, or the hub id):
    peft records the path the run used, which may be relative to where training ran."""
    saved = json.loads(path.read_text())
    saved["base_model_name_or_path"] = base
    path.write_text(json.dumps(saved, indent=2) + "\n")


def _check_adapter_config(path: Path, lora: Any) -> None:
    """The written adapter config must carry the trained rank and scale (``lora_alpha / r``)."""
    saved = json.loads(path.read_text())
    if int(saved.get("r", -1)) != int(lora.r) or float(saved.get("lora_alpha", -1)) != float(lora.lora_alpha):
        raise RuntimeError(f"the exported adapter config has r={saved.get('r')} lora_alpha={saved.get('lora_alpha')}, "
                           f"but the policy trained with r={lora.r} lora_alpha={lora.lora_alpha}")
