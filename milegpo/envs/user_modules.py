"""Importing the modules users name (a ``module:...`` env id's, the hubs' ``openenv:module:Class`` and
``verifiers:module``) as ``python -m`` would, remembering where they came from, and the one-line error
when one cannot be imported.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from milegpo.envs.registry import UnknownEnvError

#: folders user modules were imported from that are not on ``sys.path`` by themselves (the working directory
#: of a ``milegpo`` command, a run's recorded ``env.module_dir``), in the order they are tried
_module_dirs: list[str] = []


def remember_module_dir(folder: str) -> None:
    """Try ``folder`` too when a user's module is not installed (a run's ``env.module_dir``: the folder its env
    module was imported from, so eval, resume, export and serve of the run work from any directory)."""
    folder = os.path.abspath(folder)
    if folder not in _module_dirs:
        _module_dirs.append(folder)


def env_module_folder(env_id: str) -> str | None:
    """The folder the user's module named in ``env_id`` (``module:ClassName``, ``openenv:module:Class``,
    ``verifiers:module``) was imported from, when it is no installed package; None otherwise or before import."""
    prefix, _, rest = env_id.partition(":")
    for name in dict.fromkeys([prefix, rest.rpartition(":")[0] or rest, rest]):
        module = sys.modules.get(name)
        folder = _source_folder(module) if module is not None else None
        if folder is not None:
            return folder
    return None


def _source_folder(module: ModuleType) -> str | None:
    """The ``sys.path`` folder an imported module's top-level package or file lies in, when it is no installed
    package (not under the interpreter's prefixes: site-packages, the standard library); else None."""
    top = sys.modules.get(module.__name__.split(".")[0], module)
    location = getattr(top, "__file__", None)
    if location is None:
        return None
    location = os.path.abspath(location)
    root = os.path.dirname(os.path.dirname(location) if os.path.basename(location) == "__init__.py" else location)
    installed = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return None if any(root == p or root.startswith(p + os.sep) for p in installed) else root


def import_user_module(module: str) -> ModuleType:
    """Import ``module`` as ``python -m`` and ``python script.py`` would: from the installed packages, else
    from the working directory (the ``milegpo`` console script does not put it on ``sys.path``), else from
    the folders :func:`remember_module_dir` was given. The modules users name: a ``module:...`` env id's,
    and the hubs' (``openenv:module:Class``, ``verifiers:module``). Raises the ``ImportError`` of the
    first try."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:  # a module it imports is missing
            raise
        first = exc
    else:
        folder = _source_folder(imported)
        if folder is not None:  # a user's module on sys.path already (python -m, PYTHONPATH): where it came from
            remember_module_dir(folder)
        return imported
    for folder in dict.fromkeys([os.getcwd(), *_module_dirs]):
        if folder in sys.path:  # tried already
            continue
        sys.path.insert(0, folder)
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            sys.path.remove(folder)
            if exc.name != module.split(".")[0]:
                raise
            continue
        except ImportError:
            sys.path.remove(folder)
            raise
        remember_module_dir(_source_folder(imported) or folder)
        return imported
    raise first


def user_module_error(module: str, what: str, exc: ImportError) -> UnknownEnvError:
    """The one-line error for a user's ``module`` that :func:`import_user_module` could not import (``what``
    says whose module it is): where it was looked for, and what the import raised."""
    missing = isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]
    others = [folder for folder in _module_dirs if folder != os.getcwd()]
    also = f" or {' or '.join(others)}" if others else ""
    where = f" from the installed packages or the working directory {os.getcwd()}{also}" if missing else ""
    return UnknownEnvError(f"cannot import {module!r}, {what},{where} ({type(exc).__name__}: {exc})")
