"""Checkpoint directories: LoRA adapter + optimizer state + JSON config, written atomically.

A checkpoint of a group-RL algorithm is a directory::

    <path>/
      config.json     algorithm, its AlgoConfig, the policy class and PolicyConfig,
                      base-model fingerprint, counters and RNG states (plain JSON)
      adapter/        the LoRA adapter (peft ``save_pretrained``, safetensors)
      behaviour_adapter/  with ``algo.max_staleness=1``, when a rollout was in flight: the
                      adapter that samples it (:mod:`milegpo.algos.staleness`)
      optimizer.pt    ``torch.save`` of the optimizer's state dict (tensors only,
                      loaded with ``weights_only=True``)

Nothing is unpickled when loading. The directory is first written under a
temporary name next to ``path`` (``.<name>.tmp-<hex>``) and then renamed into
place, so a run killed while saving leaves the previous checkpoint intact; an
existing checkpoint of the same name is first moved aside (``.<name>.old-<hex>``).
A kill leaves such hidden folders behind: :func:`remove_stale_saves` (called on
resume) deletes them, and puts back a moved-aside checkpoint whose replacement
never arrived. ``config.json`` lists the size
and SHA-256 of every other file (``files``): a file truncated or changed later
(a full disk, a bad copy) makes the checkpoint *corrupt*, reported as such, and
:func:`checkpoints` lets a resume fall back to an older intact one.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch as th

FORMAT = "milegpo-checkpoint"
FORMAT_VERSION = 2
CONFIG_FILE = "config.json"
ADAPTER_DIR = "adapter"
BEHAVIOUR_ADAPTER_DIR = "behaviour_adapter"
OPTIMIZER_FILE = "optimizer.pt"


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, corrupt or does not fit the model being loaded."""


def check_plain(value: Any, where: str) -> None:
    """Raise ``TypeError`` unless ``value`` is made of JSON-able plain values
    (str, int, float, bool, None, lists/tuples and str-keyed dicts of them)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            check_plain(item, f"{where}[{k}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has a non-string key {key!r}")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"{where} must hold only plain values (paths, numbers, strings, lists, dicts), got {type(value).__name__}: "
        "pass e.g. a model path instead of a model object, so checkpoints stay plain JSON"
    )


def to_builtin(value: Any) -> Any:
    """``json.dumps`` default: numpy scalars/arrays to Python numbers/lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"


def _aside(path: Path, tag: str) -> Path:
    """A hidden sibling of ``path`` for a save in progress (``tag``: :data:`_TMP_TAG` or :data:`_OLD_TAG`)."""
    return path.parent / f".{path.name}{tag}{uuid.uuid4().hex[:8]}"


def replaceable(path: str | os.PathLike) -> bool:
    """Whether ``path`` may be replaced by a checkpoint: nothing there, or a folder holding only what a
    checkpoint holds (a corrupt or partial checkpoint included). A user's folder is never replaced."""
    path = Path(path)
    if not path.exists():
        return True
    contents = (CONFIG_FILE, ADAPTER_DIR, BEHAVIOUR_ADAPTER_DIR, OPTIMIZER_FILE)
    return path.is_dir() and all(child.name in contents for child in path.iterdir())


def write_checkpoint(path: str | os.PathLike, config: dict[str, Any], policy: Any,
                     optimizer: th.optim.Optimizer, behaviour: Any | None = None) -> Path:
    """Write a checkpoint directory at ``path`` atomically (see the module docstring), with ``behaviour``'s
    adapter when given. An existing ``path`` is replaced only when it is a checkpoint (:func:`replaceable`);
    else ``FileExistsError``."""
    path = Path(path)
    if not replaceable(path):
        raise FileExistsError(f"{str(path)!r} exists and is not a milegpo checkpoint: save to a new folder "
                              "(a checkpoint replaces only an earlier checkpoint)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _aside(path, _TMP_TAG)
    try:
        tmp.mkdir()
        _save_adapter(policy, tmp, ADAPTER_DIR)
        if behaviour is not None:
            _save_adapter(behaviour, tmp, BEHAVIOUR_ADAPTER_DIR)
        _save_tensors(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        config = {**config, "files": _manifest(tmp)}
        with open(tmp / CONFIG_FILE, "w") as f:
            json.dump(config, f, indent=2, default=to_builtin)
        if path.exists():
            old = _aside(path, _OLD_TAG)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _save_adapter(policy: Any, folder: Path, name: str) -> None:
    """``policy.save_adapter`` into ``folder / name``; a full disk as the ``OSError`` it is, naming the folder."""
    try:
        policy.save_adapter(str(folder / name))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, exc.filename or str(folder / name)) from exc
    except Exception as exc:  # safetensors reports a full disk as its own error type
        if not disk_full(folder):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / name)) from exc


def _save_tensors(state: dict[str, Any], file: Path) -> None:
    """``torch.save`` through memory, then one plain write: a full disk surfaces as the ``OSError``
    it is, naming the file (torch's zip writer would say only "unexpected pos ...")."""
    buffer = io.BytesIO()
    th.save(state, buffer)
    try:
        with open(file, "wb") as f:
            f.write(buffer.getbuffer())
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(file)) from exc


def disk_full(folder: str | os.PathLike, margin: int = 1 << 16) -> bool:
    """Whether the file system of ``folder`` has less than ``margin`` bytes left."""
    try:
        return shutil.disk_usage(folder).free < margin
    except OSError:
        return False


def remove_stale_saves(directory: str | os.PathLike) -> list[str]:
    """Clean up after saves into ``directory`` that a kill interrupted; returns what was done, one line each.

    A ``.<name>.tmp-<hex>`` folder is an unfinished save: deleted. A ``.<name>.old-<hex>``
    folder is a checkpoint moved aside to be replaced: put back as ``<name>`` if the
    replacement never arrived (the kill fell between the two renames), else deleted.
    Nothing else in ``directory`` is touched.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    done = []
    for child in sorted(directory.iterdir()):
        if not (child.is_dir() and child.name.startswith(".")):
            continue
        for tag in (_TMP_TAG, _OLD_TAG):
            name, found, suffix = child.name[1:].rpartition(tag)
            if found and name and len(suffix) == 8:
                break
        else:
            continue
        target = directory / name
        if tag == _OLD_TAG and not target.exists():
            os.replace(child, target)
            done.append(f"put back {target.name} (its replacement was not written)")
        else:
            shutil.rmtree(child, ignore_errors=True)
            done.append(f"removed the unfinished save {child.name}")
    return done


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """Check that ``path`` is a complete checkpoint directory and return its config."""
    path = Path(path)
    if not path.is_dir():
        hint = " (SB3 .zip files are not milegpo checkpoints)" if path.suffix == ".zip" else ""
        raise CheckpointError(f"no checkpoint directory at {str(path)!r}{hint}")
    missing = [name for name in (CONFIG_FILE, ADAPTER_DIR, OPTIMIZER_FILE) if not (path / name).exists()]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: missing {', '.join(missing)}")
    try:
        with open(path / CONFIG_FILE) as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} has a corrupt {CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{str(path / CONFIG_FILE)!r} is not a milegpo checkpoint config")
    if config.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {config.get('format_version')!r}; "
            f"this milegpo reads version {FORMAT_VERSION}"
        )
    for key in ("algorithm", "algo", "policy", "counters", "base_model"):
        if key not in config:
            raise CheckpointError(f"checkpoint {str(path)!r}: {CONFIG_FILE} lacks the {key!r} entry")
    _verify_manifest(path, config.get("files"))
    return config


def _manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file under ``directory`` (relative POSIX paths)."""
    return {file.relative_to(directory).as_posix(): {"size": file.stat().st_size, "sha256": _sha256(file)}
            for file in sorted(directory.rglob("*")) if file.is_file() and file.name != CONFIG_FILE}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify_manifest(path: Path, files: dict[str, dict[str, Any]] | None) -> None:
    """Raise CheckpointError("... is corrupt ...") if a listed file is missing, truncated or changed
    (checkpoints written before manifests existed have none and are not checked)."""
    for name, expected in (files or {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {name} is missing")
        size = file.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {name} has {size} bytes, "
                                  f"{expected['size']} were written")
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {name} changed after it was written "
                                  "(SHA-256 mismatch)")


def load_optimizer_state(path: str | os.PathLike, optimizer: th.optim.Optimizer, device: th.device) -> None:
    """Load ``optimizer.pt`` (tensors only, ``weights_only=True``) into ``optimizer``."""
    file = Path(path) / OPTIMIZER_FILE
    try:
        state = th.load(file, map_location=device, weights_only=True)
        optimizer.load_state_dict(state)
    except Exception as exc:  # corrupt file or a state of other parameters
        raise CheckpointError(f"cannot load the optimizer state {str(file)!r}: {type(exc).__name__}: {exc}") from None


def checkpoints(directory: str | os.PathLike, name_prefix: str = "checkpoint") -> list[Path]:
    """The checkpoints ``<name_prefix>_<steps>_steps`` in ``directory`` that have a config, newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        stem = child.name
        if child.is_dir() and stem.startswith(f"{name_prefix}_") and stem.endswith("_steps"):
            steps = stem[len(name_prefix) + 1 : -len("_steps")]
            if steps.isdigit() and (child / CONFIG_FILE).exists():
                found.append((int(steps), child))
    return [path for _, path in sorted(found, reverse=True)]


def latest_checkpoint(directory: str | os.PathLike, name_prefix: str = "checkpoint") -> Path | None:
    """The newest checkpoint ``<name_prefix>_<steps>_steps`` in ``directory`` (not checked for corruption:
    :func:`read_config` does that), or None."""
    found = checkpoints(directory, name_prefix)
    return found[0] if found else None
