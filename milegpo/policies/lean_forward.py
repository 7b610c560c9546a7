"""A lean no-grad forward of a Llama-family causal LM: transformers' computation without its per-call machinery.

A transformers forward of a small model is mostly fixed cost: output-capturing and
config-default wrappers, a cache object, the mask builder, a module call per layer and per
projection. The offline tiny model's whole network takes ~0.1 ms, and its call ~0.7 ms.
:class:`LeanCausalLM` runs the same network on the same weights with the same tensor
operations in the same order (embedding, rotary tables from the model's own rotary module,
RMS norms by their own ``forward``, projections, ``apply_rotary_pos_emb`` of the model's
module, keys and values appended to a cache by concatenation, ``scaled_dot_product_attention``
with the mask transformers would build or ``is_causal`` where it would skip it, the MLP, the
head on the kept positions), so its logits are transformers' to the bit (the tests compare
them with ``torch.equal``).

It takes the calls the policy's acting makes: ``input_ids`` with an optional 2D padding mask
or a 4D mask as given, ``position_ids``, a cache made by an earlier call (extended in place,
rows picked by ``batch_select_indices``), ``logits_to_keep``. Any other call (a packed batch
recognised from its positions, extra keyword arguments) goes to the transformers model
unchanged. Only Llama and Qwen2 (full attention only) with sdpa attention on CPU or CUDA
qualify (:func:`lean_supported`); any other model keeps its transformers forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch as th
import torch.nn.functional as F
from torch import nn

#: model_type -> (causal LM class, decoder layer, attention, MLP) class names the lean forward reproduces
LEAN_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP"),
}


def lean_supported(model: Any) -> bool:
    """Whether :class:`LeanCausalLM` reproduces ``model`` (a transformers causal LM, no peft wrapper):
    one of :data:`LEAN_ARCHITECTURES` exactly, sdpa attention, full attention in every layer, plain
    linear projections, no module hooks, on a CPU or CUDA device."""
    config: Any = getattr(model, "config", None)
    names = LEAN_ARCHITECTURES.get(getattr(config, "model_type", ""))
    if names is None or type(model).__name__ != names[0] or config._attn_implementation != "sdpa":
        return False
    if not getattr(config, "is_causal", True) or any(t != "full_attention" for t in getattr(config, "layer_types", None)
                                                     or ["full_attention"]):
        return False
    if next(model.parameters()).device.type not in ("cpu", "cuda"):
        return False
    for module in model.modules():
        if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"):
            return False
    decoder = model.get_decoder()
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (type(layer).__name__, type(attn).__name__, type(mlp).__name__) != names[1:]:
            return False
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(p) is not nn.Linear for p in projections):
            return False
    return type(model.get_output_embeddings()) is nn.Linear


class LeanCache:
    """The keys and values of every layer (what transformers' ``DynamicCache`` holds), extended by
    concatenation along the sequence as transformers extends its own."""

    def __init__(self, layers: int):
        self.keys: list[th.Tensor | None] = [None] * layers
        self.values: list[th.Tensor | None] = [None] * layers

    def get_seq_length(self) -> int:
        """Tokens held (those of the first layer)."""
        keys = self.keys[0]
        return 0 if keys is None else int(keys.shape[-2])

    def update(self, keys: th.Tensor, values: th.Tensor, layer: int) -> tuple[th.Tensor, th.Tensor]:
        """Append ``keys`` / ``values`` of ``layer``; the layer's whole keys and values."""
        old_keys, old_values = self.keys[layer], self.values[layer]
        if old_keys is not None and old_values is not None:
            keys, values = th.cat([old_keys, keys], dim=-2), th.cat([old_values, values], dim=-2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def batch_select_indices(self, indices: th.Tensor) -> None:
        """Keep the rows ``indices`` (in that order, repeats allowed) of every layer."""
        self.keys = [k[indices, ...] if k is not None else None for k in self.keys]
        self.values = [v[indices, ...] if v is not None else None for v in self.values]


@dataclass
class LeanOutput:
    """What a forward returns: the kept logits and the cache (None without ``use_cache``)."""

    logits: th.Tensor
    past_key_values: LeanCache | None


def _attention_mask(mask: th.Tensor | None, batch: int, q_length: int, past: int,
                    device: th.device) -> th.Tensor | None:
    """The boolean 4D mask transformers' sdpa mask builder makes from a 2D padding ``mask`` (or no mask) for
    ``batch`` rows of ``q_length`` queries after ``past`` cached tokens, or None where it leaves causality to
    sdpa's ``is_causal``."""
    kv_length = past + q_length
    padding = None
    if mask is not None:
        padding = mask.to(device=device, dtype=th.bool)
        if padding.shape[-1] < kv_length:
            padding = F.pad(padding, (0, kv_length - padding.shape[-1]))
        elif padding.shape[-1] > kv_length:
            padding = padding[:, :kv_length]
    if (q_length == 1 or kv_length == q_length) and (padding is None or bool(padding.all())):
        return None
    if past == 0 and (padding is None or (bool(padding[:, :q_length].all()) and bool((~padding[:, q_length:]).all()))):
        return None
    kv_index = th.arange(kv_length, device=device)
    causal = kv_index[None, None, None, :] <= (th.arange(q_length, device=device) + past)[None, None, :, None]
    if padding is not None:
        causal = causal & padding[:, None, None, :]
    return causal.expand(batch, -1, q_length, kv_length)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors and settings, read once (module attribute lookups cost a call each)."""

    input_norm: tuple[th.Tensor, float]
    post_norm: tuple[th.Tensor, float]
    q: tuple[th.Tensor, th.Tensor | None]
    k: tuple[th.Tensor, th.Tensor | None]
    v: tuple[th.Tensor, th.Tensor | None]
    o: tuple[th.Tensor, th.Tensor | None]
    gate: tuple[th.Tensor, th.Tensor | None]
    up: tuple[th.Tensor, th.Tensor | None]
    down: tuple[th.Tensor, th.Tensor | None]
    act: Any
    head_dim: int
    groups: int
    scaling: float


def _linear(module: Any) -> tuple[th.Tensor, th.Tensor | None]:
    return module.weight, module.bias


def _norm(module: Any) -> tuple[th.Tensor, float]:
    return module.weight, float(module.variance_epsilon)


def _rms_norm(hidden: th.Tensor, norm: tuple[th.Tensor, float]) -> th.Tensor:
    """transformers' Llama RMS norm, operation for operation (the float32 casts only where they convert)."""
    weight, eps = norm
    dtype = hidden.dtype
    states = hidden if dtype == th.float32 else hidden.to(th.float32)
    states = states * th.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (states if dtype == th.float32 else states.to(dtype))


def _rotate(states: th.Tensor, cos: th.Tensor, sin: th.Tensor) -> th.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor (``cos`` / ``sin`` already unsqueezed)."""
    half = states.shape[-1] // 2
    return (states * cos) + (th.cat((-states[..., half:], states[..., :half]), dim=-1) * sin)


class LeanCausalLM(nn.Module):
    """``model``'s no-grad forward without transformers' per-call machinery (see the module docstring).

    :param model: a transformers causal LM that :func:`lean_supported` accepts (its modules and
        weights are used as they are, nothing is copied).
    """

    hf: Any  # the transformers model (a submodule: its parameters are this module's)

    def __init__(self, model: Any):
        super().__init__()
        if not lean_supported(model):
            raise ValueError(f"{type(model).__name__} is not a model the lean forward reproduces (see lean_supported)")
        self.hf = model
        decoder = model.get_decoder()
        self._embed = (decoder.embed_tokens.weight, decoder.embed_tokens.padding_idx)
        self._rotary = decoder.rotary_emb
        rope_type = str(getattr(self._rotary, "rope_type", ""))
        #: rotary tables computed here unless the module may change its frequencies in its forward
        self._inline_rotary = "dynamic" not in rope_type and rope_type != "longrope"
        self._final_norm = _norm(decoder.norm)
        self._layers = [_Layer(_norm(layer.input_layernorm), _norm(layer.post_attention_layernorm),
                               _linear(layer.self_attn.q_proj), _linear(layer.self_attn.k_proj),
                               _linear(layer.self_attn.v_proj), _linear(layer.self_attn.o_proj),
                               _linear(layer.mlp.gate_proj), _linear(layer.mlp.up_proj), _linear(layer.mlp.down_proj),
                               layer.mlp.act_fn, int(layer.self_attn.head_dim),
                               int(layer.self_attn.num_key_value_groups), float(layer.self_attn.scaling))
                        for layer in decoder.layers]
        self._head = _linear(model.get_output_embeddings())

    @property
    def config(self) -> Any:
        return self.hf.config

    def _rotary_tables(self, hidden: th.Tensor, position_ids: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """The rotary module's ``(cos, sin)`` for ``position_ids`` (its forward's operations, inline)."""
        if not self._inline_rotary:
            return self._rotary(hidden, position_ids=position_ids)
        rotary = self._rotary
        freqs = position_ids[..., None].float() * rotary.inv_freq.to(device=hidden.device, dtype=th.float)
        emb = th.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if rotary.attention_scaling != 1.0:
            cos, sin = cos * rotary.attention_scaling, sin * rotary.attention_scaling
        return (cos, sin) if hidden.dtype == th.float32 else (cos.to(dtype=hidden.dtype), sin.to(dtype=hidden.dtype))

    def forward(self, input_ids: th.Tensor, attention_mask: th.Tensor | None = None,
                position_ids: th.Tensor | None = None, past_key_values: LeanCache | None = None,
                use_cache: bool | None = None, logits_to_keep: int | th.Tensor = 0, **kwargs: Any) -> Any:
        """Logits (and the cache) of ``input_ids``, as the transformers model's call with the same arguments."""
        if not self._reproduces(attention_mask, position_ids, past_key_values, kwargs):
            return self.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep,
                           **kwargs)
        hidden, cache = self.hidden_states(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return LeanOutput(F.linear(hidden[:, kept, :], *self._head), cache)

    def get_output_embeddings(self) -> nn.Module:
        """The LM head (what :meth:`forward` applies to the hidden states)."""
        return self.hf.get_output_embeddings()

    @staticmethod
    def _reproduces(attention_mask: th.Tensor | None, position_ids: th.Tensor | None, past_key_values: Any,
                    kwargs: dict[str, Any]) -> bool:
        """Whether a call is one the lean forward reproduces: no gradients, no extra arguments, its own cache (or
        none), and not a packed batch (positions without a mask or cache, which transformers splits by position)."""
        packed = position_ids is not None and attention_mask is None and past_key_values is None
        return (not kwargs and not th.is_grad_enabled() and not packed
                and isinstance(past_key_values, (LeanCache, type(None))))

    def hidden_states(self, input_ids: th.Tensor, attention_mask: th.Tensor | None = None,
                      position_ids: th.Tensor | None = None, past_key_values: LeanCache | None = None,
                      use_cache: bool | None = None) -> tuple[th.Tensor, Any]:
        """The final hidden states (after the last norm) and the cache: the decoder's part of :meth:`forward`
        (calls it does not reproduce go to the transformers decoder)."""
        if not self._reproduces(attention_mask, position_ids, past_key_values, {}):
            out = self.hf.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                        past_key_values=past_key_values, use_cache=use_cache)
            return out.last_hidden_state, out.past_key_values
        cache = past_key_values
        if cache is None and (self.hf.config.use_cache if use_cache is None else use_cache):
            cache = LeanCache(len(self._layers))
        hidden = th.embedding(self._embed[0], input_ids, self._embed[1] if self._embed[1] is not None else -1)
        batch, q_length = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (th.arange(q_length, device=hidden.device) + past).unsqueeze(0)
        if attention_mask is not None and attention_mask.dim() == 4:
            mask: th.Tensor | None = attention_mask
        else:
            mask = _attention_mask(attention_mask, batch, q_length, past, hidden.device)
        cos, sin = self._rotary_tables(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for index, layer in enumerate(self._layers):
            hidden = hidden + self._attention(layer, _rms_norm(hidden, layer.input_norm), cos, sin, mask, cache,
                                              index)
            states = _rms_norm(hidden, layer.post_norm)
            hidden = hidden + F.linear(layer.act(F.linear(states, *layer.gate)) * F.linear(states, *layer.up),
                                       *layer.down)
        return _rms_norm(hidden, self._final_norm), cache

    @staticmethod
    def _attention(layer: _Layer, hidden: th.Tensor, cos: th.Tensor, sin: th.Tensor, mask: th.Tensor | None,
                   cache: LeanCache | None, index: int) -> th.Tensor:
        """The attention block of one layer (transformers' attention with its sdpa interface)."""
        shape = (*hidden.shape[:-1], -1, layer.head_dim)
        query = F.linear(hidden, *layer.q).view(shape).transpose(1, 2)
        key = F.linear(hidden, *layer.k).view(shape).transpose(1, 2)
        value = F.linear(hidden, *layer.v).view(shape).transpose(1, 2)
        query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, index)
        extra = {}
        if layer.groups > 1:
            if mask is None and key.shape[-1] == value.shape[-1] <= 256:
                extra["enable_gqa"] = True
            else:
                key, value = _repeat_kv(key, layer.groups), _repeat_kv(value, layer.groups)
        q_length = query.shape[2]
        is_causal = q_length > 1 and mask is None
        if is_causal and key.shape[2] > q_length:
            key, value = key[:, :, :q_length, :], value[:, :, :q_length, :]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, scale=layer.scaling,
                                             is_causal=is_causal, **extra)
        return F.linear(out.transpose(1, 2).contiguous().reshape(*hidden.shape[:-1], -1), *layer.o)


def _repeat_kv(states: th.Tensor, groups: int) -> th.Tensor:
    """Each key/value head repeated ``groups`` times (transformers' ``repeat_kv``)."""
    batch, heads, length, dim = states.shape
    expanded = states[:, :, None, :, :].expand(batch, heads, groups, length, dim)
    return expanded.reshape(batch, heads * groups, length, dim)
