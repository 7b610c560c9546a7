"""Who samples replies in ``generate`` mode: the sampler interface and the HF sampler.

:class:`~milegpo.policies.LLMPolicy` keeps the trainable model, the prompts, the
scoring of log-probs and the update. A :class:`Sampler` turns token prompts into
sampled replies, recording for every sampled token its log-prob under the
distribution it was drawn from, ``log_softmax(logits / T)`` (no top-k, no top-p),
and stopping at an end-of-reply token or once the reply contains ``</action>``.
The trainer does not care which sampler ran:

* :class:`HFSampler` (``rollout_backend="hf"``, the default): the trainer's own
  transformers model in a KV-cached loop; nothing to install, exact log-probs;
* :class:`~milegpo.policies.vllm_sampler.VLLMSampler` (``rollout_backend="vllm"``):
  a vLLM engine in the trainer's process, given the LoRA adapter after every update.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch as th
from transformers import PreTrainedTokenizerBase

from milegpo.policies.model import forward_model
from milegpo.policies.scoring import cache_argument, output_cache, pad_rows

#: The text that ends a reply in generate mode.
STOP_TEXT = "</action>"


@dataclass
class Completion:
    """One sampled reply: its tokens (the stop token included) and each token's log-prob."""

    token_ids: list[int]
    logprobs: np.ndarray


def inverse_cdf_sample(log_probs: th.Tensor, uniforms: th.Tensor) -> th.Tensor:
    """One token per row of ``log_probs`` (B, V), drawn by inverting the row's CDF at its uniform in
    ``uniforms`` (B,, in [0, 1)): a row's token depends on its own distribution and uniform only. The
    CDF is summed in float64 and the point kept strictly below its total, so the token found is the
    first whose CDF exceeds the point: never one of probability 0, whatever the rounding."""
    cdf = log_probs.double().exp().cumsum(-1)
    total = cdf[:, -1:]
    point = th.minimum(uniforms.to(cdf.dtype).unsqueeze(-1) * total, th.nextafter(total, th.zeros_like(total)))
    return th.searchsorted(cdf, point, right=True).squeeze(-1)


class Sampler(ABC):
    """Samples replies to token prompts (see the module docstring)."""

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], temperature: float, max_new_tokens: int,
                 deterministic: bool, seeds: Sequence[int]) -> list[Completion]:
        """One reply per prompt; greedy when ``deterministic``, else sampled reproducibly from ``seeds``
        (one per prompt: each reply is drawn from its own seed, so it does not depend on the other
        prompts of the call; the asynchronous rollout relies on it)."""

    def before_update(self) -> None:  # noqa: B027  an optional hook: a no-op unless the sampler needs it
        """The trainer is about to update the weights (an engine may free its memory meanwhile)."""

    def after_update(self) -> None:  # noqa: B027  an optional hook: a no-op unless the sampler needs it
        """The weights changed: every later reply must come from the new ones."""

    def close(self) -> None:  # noqa: B027  an optional hook: a no-op unless the sampler needs it
        """Release the sampler's resources."""


class HFSampler(Sampler):
    """The trainer's transformers model sampling token by token with a KV cache.

    Cheaper than a plain loop in three ways: finished replies leave the batch (the
    cache is compacted whenever a quarter of the running rows have finished), one
    host transfer per step (the sampled tokens) instead of one per check, and the
    stop test decodes only rows whose new token contains ``>``.

    :param model: the (peft) causal LM.
    :param tokenizer: its tokenizer.
    :param eos_ids: tokens that end a reply.
    :param pad_id: the padding token.
    """

    def __init__(self, model: th.nn.Module, tokenizer: PreTrainedTokenizerBase, eos_ids: Sequence[int], pad_id: int):
        self.model, self.tokenizer, self.pad_id = model, tokenizer, int(pad_id)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        #: tokens whose text contains ">": only after one of them can a reply end with "</action>"
        self.gt_ids = frozenset(i for i, t in enumerate(vocab) if t is not None and ">" in t)

    def generate(self, prompts: Sequence[Sequence[int]], temperature: float, max_new_tokens: int,
                 deterministic: bool, seeds: Sequence[int]) -> list[Completion]:
        """See :meth:`Sampler.generate`. Each row draws its ``t``-th token from the ``t``-th number of its
        own stream (a generator seeded by the row's seed) by :func:`inverse_cdf_sample`: a reply depends
        on its own prompt and seed, not on the other rows of the call (up to the float noise that
        batching adds to the logits)."""
        model = forward_model(self.model)  # the merged copy when acting (milegpo.policies.model.merged_forwards)
        cache_arg = cache_argument(model)
        device = next(model.parameters()).device
        n = len(prompts)
        ids, mask = pad_rows(prompts, self.pad_id, left=True, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache, next_pos = output_cache(out), positions[:, -1:] + 1
        streams = None if deterministic else np.stack([np.random.default_rng(int(s)).random(max_new_tokens)
                                                       for s in seeds])
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        running = list(range(n))  # original row of each batch row
        finished: set[int] = set()  # rows done but still in the batch (until the next compaction)
        for step in range(max_new_tokens):
            log_probs = th.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)
            if streams is None:
                token = log_probs.argmax(-1)
            else:
                token = inverse_cdf_sample(log_probs, th.as_tensor(streams[running, step], device=device))
            token_logp = log_probs.gather(-1, token.unsqueeze(-1)).squeeze(-1)
            sampled, sampled_logp = token.tolist(), token_logp.tolist()  # the one host transfer of the step
            keep = []
            for b, row in enumerate(running):
                if row in finished:
                    continue
                tokens[row].append(sampled[b])
                logps[row].append(sampled_logp[b])
                if sampled[b] in self.eos_ids or (sampled[b] in self.gt_ids and self._stopped(tokens[row])):
                    finished.add(row)
                else:
                    keep.append(b)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) <= 0.75 * len(running):  # drop finished rows: a smaller batch from now on
                index = th.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, next_pos, token = mask[index], next_pos[index], token[index]
                running = [running[b] for b in keep]
            mask = th.cat([mask, th.ones((len(running), 1), dtype=mask.dtype, device=device)], dim=-1)
            out = model(input_ids=token.unsqueeze(-1), attention_mask=mask, position_ids=next_pos, use_cache=True,
                        **{cache_arg: cache})
            cache, next_pos = output_cache(out), next_pos + 1
        return [Completion(t, np.asarray(lp, dtype=np.float32)) for t, lp in zip(tokens, logps)]

    def _stopped(self, reply: list[int]) -> bool:
        """The reply now contains ``</action>`` (the tag may span several tokens)."""
        return STOP_TEXT in self.tokenizer.decode(reply[-16:])


def choose_candidates(scores: Sequence[th.Tensor], temperature: float, deterministic: bool,
                      rngs: Sequence[np.random.Generator] | np.random.Generator) -> tuple[list[int], np.ndarray]:
    """Choose mode's draw for a batch of rows: row ``k``'s candidate scores ``scores[k]`` give
    ``log pi = log_softmax(scores / temperature)``; the chosen index is its argmax (``deterministic``) or is
    drawn as ``Generator.choice(n, p=pi)`` draws it (the row's CDF in float64, cut at one ``random()`` of
    its generator: ``rngs[k]``, or the one shared generator, row after row). Returns the chosen indices
    and their log-probs (float32).

    One padded softmax for all rows and one vectorised CDF search instead of a softmax, a host copy and
    a ``choice`` per row; the draws follow the generators exactly as the per-row ``choice`` calls did, so
    the same scores give the same actions, up to float rounding between a padded row's softmax and the
    row's own (a last-bit difference that moves a draw only when its uniform falls within it of a CDF step).
    """
    counts = np.fromiter(map(len, scores), dtype=np.int64, count=len(scores))
    width = int(counts.max(initial=0))
    present = np.arange(width)[None, :] < counts[:, None]
    flat = th.cat(list(scores)).detach().reshape(-1).float().cpu()  # one call for the rows (each 1-D)
    padded = th.full((len(scores), width), float("-inf"))
    padded[th.from_numpy(present)] = flat
    log_pi = th.log_softmax(padded / temperature, dim=-1)
    if deterministic:
        chosen = log_pi.argmax(-1).numpy()
    else:
        if isinstance(rngs, np.random.Generator):
            uniforms = rngs.random(len(scores))
        else:
            uniforms = np.array([rng.random() for rng in rngs])
        p = np.where(present, log_pi.exp().numpy().astype(np.float64), 0.0)
        p /= p.sum(axis=1, keepdims=True)
        cdf = np.cumsum(p, axis=1)
        cdf /= cdf[np.arange(len(scores)), counts - 1][:, None]
        chosen = np.minimum((cdf <= uniforms[:, None]).sum(axis=1), counts - 1)
    logp = log_pi[th.arange(len(scores)), th.from_numpy(np.asarray(chosen))].numpy().astype(np.float32)
    return [int(c) for c in chosen], logp


def chosen_log_probs(scores: Sequence[th.Tensor], chosen: Sequence[int], temperature: float,
                     with_entropy: bool = False) -> tuple[th.Tensor, th.Tensor | None]:
    """Choose mode's units for the update: row ``k``'s ``log pi(chosen[k])`` under
    ``log_softmax(scores[k] / temperature)`` (``[R, 1]``) and, with ``with_entropy``, the entropy of that
    softmax (``[R, 1]``), differentiable in the scores.

    One padded softmax for all rows (the padding at ``-inf``, taking no probability) instead of a softmax,
    two indexed writes and their autograd nodes per row: the update's backward then runs a handful of
    operations per micro-batch rather than several per sample. A row may share its scores tensor with
    others (identical prompts scored once): their gradients add up, as before."""
    counts = th.tensor([len(s) for s in scores])
    device = scores[0].device
    present = (th.arange(int(counts.max())) < counts[:, None]).to(device)
    flat = th.cat(list(scores)) / temperature
    padded = th.full(present.shape, float("-inf"), dtype=flat.dtype, device=device).masked_scatter(present, flat)
    log_pi = th.log_softmax(padded, dim=-1)
    logp = log_pi.gather(1, th.tensor(list(chosen), device=device).unsqueeze(1))
    if not with_entropy:
        return logp, None
    safe = log_pi.masked_fill(~present, 0.0)  # 0 * -inf would be nan, in the value and in the gradient
    return logp, -(safe.exp() * safe).masked_fill(~present, 0.0).sum(-1, keepdim=True)
