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

Export only ever replaces what an export wrote (:func:`check_export_target`): the marker file
``milegpo_export.json`` lists every file the export wrote, and ``--overwrite`` refuses a previous
export that holds anything else. The new export is written to a hidden folder beside ``OUT``
and only then put in place, so an export that fails (a full disk included) leaves ``OUT`` and a
previous export in it whole. An existing ``OUT`` folder is kept and filled, never replaced: a
symlink to it (the export goes into the folder it points to), a shell whose working directory
it is, and its permissions stay as they were.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from milegpo.config.policy import absolute_model_path
from milegpo.policies.model import quiet_library_bars
from milegpo.run_folder import BASE_MODEL_DIR, CONFIG_FILE, EXPORT_MARKER, inside


class ExportRefused(ValueError):
    """``OUT`` is a folder export must not write into or replace (the message says why)."""


#: the most unexpected files a refusal names (then "and N more")
_NAMED_FILES = 5


def check_export_target(run_dir: str | Path, out: str | Path, overwrite: bool) -> None:
    """Refuse, with :class:`ExportRefused`, an ``out`` whose replacement could lose data: the run
    folder itself, a folder containing it or inside it, a file, a non-empty folder that no export
    wrote, (without ``overwrite``) a previous export, and (with it) a previous export that holds
    a file it did not write. ``run_dir`` must be a run folder (``FileNotFoundError`` otherwise),
    so that the messages may call it one."""
    run = Path(run_dir).resolve()
    try:
        target = Path(out).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop: RuntimeError before Python 3.13, then OSError
        raise ExportRefused(f"{str(out)!r} does not resolve to a folder ({exc}): export to a new or empty "
                            "folder") from exc
    if not (run / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo "
                                "train` wrote")
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
    extra = _unlisted(target, _written_files(target, out))
    if extra:
        named = ", ".join(extra[:_NAMED_FILES]) + (f" and {len(extra) - _NAMED_FILES} more"
                                                   if len(extra) > _NAMED_FILES else "")
        raise ExportRefused(f"{str(out)!r} holds files the previous export did not write ({named}): move them out "
                            "of it, or export to another folder")


def _written_files(target: Path, out: str | Path) -> set[str]:
    """The files (paths relative to ``target``, ``/``-separated) that the export in ``target``
    wrote, as its marker lists them. A marker without the list (an older milegpo wrote it) or
    one that does not read is refused: what else the folder holds cannot be told apart."""
    try:
        files = json.loads((target / EXPORT_MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError) as exc:
        raise ExportRefused(f"{str(out)!r} holds an unreadable {EXPORT_MARKER} ({exc}): delete the folder yourself "
                            "or export to another one") from exc
    if not isinstance(files, list) or not all(isinstance(file, str) for file in files):
        raise ExportRefused(f"{str(out)!r} holds an export whose {EXPORT_MARKER} does not list its files (an older "
                            "milegpo wrote it): delete the folder yourself or export to another one")
    return set(files)


def _unlisted(folder: Path, listed: set[str]) -> list[str]:
    """What ``folder`` holds besides the ``listed`` files and the marker, sorted: a file (or
    symlink) by its path, a folder that holds no listed file by its path and a ``/``, once."""
    wanted_dirs = {str(parent) for file in listed for parent in PurePosixPath(file).parents} - {"."}
    extra: list[str] = []
    for root, dirs, files in os.walk(folder):
        here = PurePosixPath(Path(root).relative_to(folder).as_posix())
        for name in list(dirs):
            rel = str(here / name)
            if rel not in wanted_dirs or Path(root, name).is_symlink():
                extra.append(f"{rel}/")
                dirs.remove(name)  # named once, not file by file
        extra += [str(here / name) for name in files if str(here / name) not in listed | {EXPORT_MARKER}]
    return sorted(extra)


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False, overwrite: bool = False) -> Path:
    """Write the run's trained policy to ``out`` (see the module docstring); returns ``out``.

    Raises ``FileNotFoundError`` for a folder that is no run (or has no checkpoint yet),
    :class:`ExportRefused` for an ``out`` that :func:`check_export_target` refuses, and the
    ``OSError`` of a write that failed (``ENOSPC`` for a full disk), ``out`` left as it was.
    """
    from milegpo.run.finish import load_run

    check_export_target(run_dir, out, overwrite)
    config, model = load_run(run_dir)
    target = Path(out).resolve()  # a symlink's folder, the working directory for "."
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        with quiet_library_bars():
            _write_export(tmp, target, run_dir, config, model, merged)
        check_export_target(run_dir, out, overwrite)  # again: loading and writing took a while
        _swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Path(out)


def _write_export(tmp: Path, out: Path, run_dir: str | Path, config: Any, model: Any, merged: bool) -> None:
    """Write the export of ``model`` (trained by the run ``run_dir`` with ``config``) into ``tmp``,
    the folder whose files go to ``out``. A full disk is raised as the ``OSError`` it is
    (safetensors reports it as its own error type)."""
    from milegpo.algos.checkpoint import disk_full

    try:
        _write_files(tmp, out, run_dir, config, model, merged)
    except OSError:
        raise
    except Exception as exc:
        if not disk_full(tmp):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp)) from exc


def _write_files(tmp: Path, out: Path, run_dir: str | Path, config: Any, model: Any, merged: bool) -> None:
    """The files of the export, into ``tmp``; the marker last, listing the others."""
    policy = model.policy
    base = str(absolute_model_path(str(policy.model_name)))
    if merged:
        merged_model = policy.model.merge_and_unload()
        merged_model.save_pretrained(str(tmp), safe_serialization=True)
    else:
        policy.save_adapter(tmp)
        if Path(base).is_absolute() and inside(Path(base), Path(run_dir)):  # the run's own base: carry a copy
            _copy_folder(Path(base), tmp / BASE_MODEL_DIR)
            base = str(out / BASE_MODEL_DIR)
        _name_base_model(tmp / "adapter_config.json", base)
        _check_adapter_config(tmp / "adapter_config.json", policy.model.peft_config["default"])
    policy.tokenizer.save_pretrained(str(tmp))
    files = sorted(path.relative_to(tmp).as_posix() for path in tmp.rglob("*") if not path.is_dir())
    (tmp / EXPORT_MARKER).write_text(json.dumps(
        {"run_dir": str(Path(run_dir).resolve()), "algo": config.algo.method, "env": config.env.id,
         "num_timesteps": int(model.num_timesteps), "merged": merged, "base_model": base, "files": files},
        indent=2) + "\n")


def _copy_folder(src: Path, dst: Path) -> None:
    """Copy the folder ``src`` to ``dst`` file by file (symlinks followed), a failed copy raising
    its own ``OSError`` naming the file written: ``shutil.copytree`` gathers failures into one
    ``shutil.Error`` whose errno is gone, so a full disk would not read as one."""
    for root, _, files in os.walk(src, followlinks=True):
        folder = dst / Path(root).relative_to(src)
        folder.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                shutil.copy2(Path(root, name), folder / name)
            except OSError as exc:  # its filename is the source
                raise OSError(exc.errno, exc.strerror, str(folder / name)) from exc


def _swap_in(new: Path, out: Path) -> None:
    """Put the files of the folder ``new`` at ``out`` (symlinks resolved). A new ``out`` is one
    rename. An existing ``out`` (empty, or a previous export that :func:`check_export_target`
    let through) stays the same folder: its entries are moved into a hidden folder beside it
    (the marker first), the new ones moved in (the marker last), and the previous ones deleted
    only once all are in; a failure in between puts the previous export back."""
    if not out.exists():
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.previous-", dir=out.parent))
    moved_in: list[str] = []
    try:
        for entry in sorted(out.iterdir(), key=lambda path: path.name != EXPORT_MARKER):
            os.replace(entry, old / entry.name)
        for entry in sorted(new.iterdir(), key=lambda path: path.name == EXPORT_MARKER):
            os.replace(entry, out / entry.name)
            moved_in.append(entry.name)
    except BaseException:
        for name in moved_in:
            os.replace(out / name, new / name)
        for entry in old.iterdir():
            os.replace(entry, out / entry.name)
        old.rmdir()
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
