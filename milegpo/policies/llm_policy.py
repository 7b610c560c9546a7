"""``LLMPolicy``: a causal LM with a LoRA adapter as an SB3 policy over text.

Two action modes:

``generate``
    the model writes a reply (optionally ``<think>…</think>``) ending in
    ``<action>…</action>``; the unit of the policy-gradient loss is each generated
    token, its log-prob taken under the exact sampling distribution
    ``softmax(logits / temperature)`` (no top-k / top-p).
``choose``
    the env lists its admissible commands; each candidate ``c`` is scored by the
    sum of its token log-probs ``s(c)`` (the command followed by the end-of-turn
    token) and the policy samples from ``softmax(s / temperature)``. One unit per
    step: ``log pi(chosen)``. ``candidate_score="mean"`` uses the mean token
    log-prob instead, which removes the bias towards short commands (a random
    tiny model gives a 4-token command ~1e-3 of the probability of a 3-token one).

The reference policy for the KL term is the same model with the adapter disabled
(``model.disable_adapter()``): no second copy in memory. Only the LoRA weights are
trainable, and :meth:`LLMPolicy.state_dict` holds only them, so SB3-style saving
never writes the base model.

Batched log-probs (:func:`milegpo.policies.scoring.completion_logprobs`): prompts left-padded, completions
right-padded, ``position_ids = cumsum(attention_mask) - 1``, only the logits that
predict completion tokens are computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch as th
from gymnasium import spaces

from milegpo.config import PolicyConfig
from milegpo.config.fields import to_dict, with_overrides
from milegpo.policies.adapter_files import AdapterFilesMixin
from milegpo.policies.candidate_scoring import candidate_scores
from milegpo.policies.chat_requests import AGENT_REQUEST, answer_requests, request_prompt
from milegpo.policies.conversation import single_pass_logprobs
from milegpo.policies.model import load_lora_model, merged_forwards
from milegpo.policies.optim import resolve_optimizer_class
from milegpo.policies.parsing import action_parser
from milegpo.policies.prompt_tokens import CandidateTokens, KeptPromptBuilder
from milegpo.policies.prompts import INSTRUCTIONS, ChatPromptBuilder
from milegpo.policies.sample import ActionSample
from milegpo.policies.sampling import HFSampler, Sampler, choose_candidates, chosen_log_probs
from milegpo.policies.scoring import score_rows, supports_right_padded_rows


class LLMPolicy(AdapterFilesMixin):
    """A ``transformers`` causal LM + peft LoRA adapter acting on text observations.

    Its settings are one :class:`~milegpo.config.PolicyConfig` (the model, the mode, the LoRA
    adapter, the prompt, the sampler, the optimizer); SB3-style keyword arguments
    (``LLMPolicy(obs_space, act_space, lr_schedule, model="...", mode="choose")``) set its fields
    on top of ``config``.

    :param observation_space: the env's (text) observation space.
    :param action_space: the env's (text) action space.
    :param lr_schedule: SB3 learning-rate schedule; the optimizer starts at ``lr_schedule(1)``.
    :param config: the settings (None: the defaults, the paper's).
    :param device: "auto", "cpu", "cuda", "cuda:1", ...
    :param seed: seeds the adapter's initial weights and the policy's own sampling generators.
    :param settings: :class:`~milegpo.config.PolicyConfig` fields replacing those of ``config``
        (a sub-config such as ``lora`` as a dict or a :class:`~milegpo.config.LoraConfig`).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Callable[[float], float],
        config: PolicyConfig | None = None,
        *,
        device: str = "auto",
        seed: int = 0,
        **settings: Any,
    ):
        config = with_overrides(PolicyConfig, config, settings, "policy")
        if config.model is None:
            raise ValueError("policy.model is not set: pass policy_kwargs={'model': 'Qwen/Qwen2.5-1.5B-Instruct'} "
                             "(a hub name or a local folder of a causal LM); an algorithm given an env and no model "
                             "trains the offline demo setting instead")
        super().__init__(observation_space, action_space,
                         optimizer_class=resolve_optimizer_class(config.optimizer_class),
                         optimizer_kwargs=dict(config.optimizer_kwargs))
        self.config = config
        self.model_name = config.model
        self.mode = config.mode
        self.temperature = float(config.temperature)
        self.device_name = device
        self.seed = seed

        self._build_model()
        kind = "choose" if self.mode == "choose" else ("think" if config.think else "generate")
        instructions = INSTRUCTIONS[kind]
        self.prompts = KeptPromptBuilder(self.tokenizer, config.prompt_template, instructions,
                                         config.history_length, config.max_prompt_tokens)
        self.chat = ChatPromptBuilder(self.tokenizer, instructions, config.history_length, config.max_prompt_tokens,
                                      stop_ids=self.eos_ids) if config.prompt_format == "chat" else None
        self._request_prompts: ChatPromptBuilder | None = None
        self.parse = action_parser(config.action_parser, self.tokenizer)
        self._command_tokens = CandidateTokens(self.tokenizer)
        self._rng = np.random.default_rng(seed)
        self.sampler = self._make_sampler()
        make_optimizer: Callable[..., th.optim.Optimizer] = self.optimizer_class  # SB3 types it as Optimizer's own
        self.optimizer = make_optimizer(self.trainable_parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def set_training_mode(self, mode: bool) -> None:
        """Dropout on (training) or off (acting). Setting it walks every submodule (~0.7 ms for the CPU demo's
        one-layer LoRA model, a tenth of a small policy call), and every :meth:`act` sets it and sets it back:
        skipped where the policy and its language model are already in ``mode``."""
        if self.training != mode or self.model.training != mode:
            super().set_training_mode(mode)

    # ------------------------------------------------------------------ setup
    def _build_model(self) -> None:
        self.tokenizer, self.model, self.pad_id, self.eos_ids = load_lora_model(
            self.model_name, self.config.lora, self.device_name, self.config.dtype, self.config.gradient_checkpointing,
            self.seed)

    def _make_sampler(self) -> Sampler:
        """The sampler of generate mode (the vLLM engine itself starts at the first reply)."""
        if self.config.sampler.backend == "hf":
            return HFSampler(self.model, self.tokenizer, self.eos_ids, self.pad_id)
        from milegpo.policies.vllm_sampler import VLLMSampler

        dtype = {th.float32: "float32", th.bfloat16: "bfloat16",
                 th.float16: "float16"}[next(self.model.parameters()).dtype]
        return VLLMSampler(self.model_name, self.save_adapter, self.eos_ids, dtype, self.config.lora.r,
                           self.config.max_prompt_tokens + self.config.max_new_tokens, self.seed,
                           dict(self.config.sampler.vllm_kwargs))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        for key in ("normalize_images", "optimizer_class", "optimizer_kwargs"):  # SB3's; in the config here
            data.pop(key, None)
        data.update(config=to_dict(self.config), device=self.device_name, seed=self.seed)
        return data

    @property
    def device(self) -> th.device:
        return next(self.model.parameters()).device

    @property
    def batch_tokens(self) -> int:
        """Padded tokens per scoring forward pass: ``max_batch_tokens`` or the device's default."""
        if self.config.max_batch_tokens is not None:
            return int(self.config.max_batch_tokens)
        return CPU_BATCH_TOKENS if self.device.type == "cpu" else GPU_BATCH_TOKENS

    def trainable_parameters(self) -> list[th.nn.Parameter]:
        """The LoRA parameters (the only ones with ``requires_grad``)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    # ---------------------------------------------------------------- prompts
    def build_prompt(self, observation: str, info: Mapping[str, Any], history: Sequence[tuple[str, str]]) -> list[int]:
        """Prompt token ids for one env (task from ``info["task"]``, commands from ``info``); an agent program's
        step (``info["agent_request"]``, :mod:`milegpo.policies.chat_requests`): its request's own messages."""
        if info.get(AGENT_REQUEST) is not None:
            return request_prompt(self, info[AGENT_REQUEST], history)
        if self.chat is not None:
            return self.chat.build(str(info.get("task", "")), str(observation), history, info)
        commands = info.get("admissible_commands")
        return self.prompts.build(str(info.get("task", "")), str(observation), history, commands)

    @property
    def request_prompts(self) -> ChatPromptBuilder:
        """The chat prompts of requests that bring their own messages (an agent program's, ``milegpo serve``'s):
        the policy's chat builder, or, in the template format, one without instructions or history (built once,
        growing a continued conversation from the sampled ids all the same)."""
        if self.chat is not None:
            return self.chat
        if self._request_prompts is None:
            self._request_prompts = ChatPromptBuilder(self.tokenizer, "", 0, self.config.max_prompt_tokens,
                                                      stop_ids=self.eos_ids)
        return self._request_prompts

    def history_text(self, sample: ActionSample) -> str:
        """What a step's history keeps of its action: the action (template prompts show the past
        actions) or, in a chat prompt, the model's whole reply (its assistant turn)."""
        if self.chat is not None and sample.raw_text is not None:
            return sample.raw_text
        return sample.text

    def _candidate_ids(self, command: str) -> list[int]:
        return self._command_tokens(command)  # the command's tokens and the end-of-turn token

    def _scores(self, prompts: Sequence[Sequence[int]],
                candidates: Sequence[Sequence[Sequence[int]]]) -> list[th.Tensor]:
        """Each prompt's candidate scores (:func:`~milegpo.policies.candidate_scoring.candidate_scores`)."""
        return candidate_scores(self.model, prompts, candidates, self.pad_id, self.batch_tokens,
                                 self.config.candidate_score)

    def _logprobs(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                  with_entropy: bool = False) -> tuple[list[th.Tensor], list[th.Tensor | None]]:
        """Each completion's token log-probs at the policy's temperature
        (:func:`~milegpo.policies.scoring.score_rows`)."""
        if self.chat is not None and supports_right_padded_rows(self.model):
            # a chat conversation's turns extend each other: one pass over each conversation's longest sample
            return single_pass_logprobs(self.model, prompts, completions, self.pad_id, self.temperature,
                                        self.batch_tokens, with_entropy)
        return score_rows(self.model, prompts, completions, self.pad_id, self.temperature, self.batch_tokens,
                          with_entropy)

    def demonstration(self, observation: str, info: Mapping[str, Any], history: Sequence[tuple[str, str]],
                      action: str) -> ActionSample:
        """``action`` taken in this state as a sample the policy can be trained to imitate
        (supervised warm start): choose mode, the admissible command it names; generate
        mode, the reply ``<action>action</action>`` and the end-of-turn token."""
        prompt = self.build_prompt(observation, info, history)
        if self.mode == "choose":
            commands = list(info.get("admissible_commands") or [])
            if action not in commands:
                raise ValueError(f"demonstrated action {action!r} is not among the state's admissible commands")
            candidates = [self._candidate_ids(c) for c in commands]
            chosen = commands.index(action)
            return ActionSample(text=action, prompt_ids=prompt, action_ids=candidates[chosen], candidate_ids=candidates,
                                chosen=chosen, old_logprobs=np.zeros(1, dtype=np.float32), parsed=True)
        reply = self._candidate_ids(f"<action>{action}</action>")
        return ActionSample(text=action, prompt_ids=prompt, action_ids=reply, candidate_ids=None, chosen=None,
                            old_logprobs=np.zeros(len(reply), dtype=np.float32), parsed=True,
                            raw_text=f"<action>{action}</action>")

    # ----------------------------------------------------------------- acting
    def act(
        self,
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
        histories: Sequence[Sequence[tuple[str, str]]],
        deterministic: bool = False,
        sample_seeds: Sequence[int] | None = None,
    ) -> list[ActionSample]:
        """Sample one action per env (see the module docstring for the two modes).

        ``sample_seeds`` (one per env) make each env's sample its own: in choose mode an env's action
        is drawn from a generator seeded by its seed, so it does not depend on which other envs share
        the call (the asynchronous rollout relies on it); in generate mode each reply is sampled from its
        env's seed, by either sampler (the same independence, up to the float noise batching adds to the
        logits). Default: the policy's generator.
        """
        if not (len(observations) == len(infos) == len(histories)):
            raise ValueError(f"got {len(observations)} observations, {len(infos)} infos, {len(histories)} histories")
        if sample_seeds is not None and len(sample_seeds) != len(observations):
            raise ValueError(f"got {len(sample_seeds)} sample seeds for {len(observations)} observations")
        if len(observations) == 0:
            return []
        prompts = [self.build_prompt(o, i, h) for o, i, h in zip(observations, infos, histories)]
        was_training = self.training
        self.set_training_mode(False)  # sample from the policy without dropout: old_logprobs are exact
        try:
            with th.no_grad(), merged_forwards(self.model):  # the adapter merged in: no peft wrappers
                if self.mode == "choose":
                    return self._choose(prompts, infos, deterministic, sample_seeds)
                samples = self._generate(prompts, [str(i.get("action_format", "tags")) for i in infos], deterministic,
                                         sample_seeds)
                if any(i.get(AGENT_REQUEST) is not None for i in infos):  # replies to agent programs' requests
                    answer_requests(self, samples, infos)
                return samples
        finally:
            self.set_training_mode(was_training)

    def _choose(self, prompts: list[list[int]], infos: Sequence[Mapping[str, Any]],
                deterministic: bool, sample_seeds: Sequence[int] | None = None) -> list[ActionSample]:
        commands = []
        for i, info in enumerate(infos):
            cmds = info.get("admissible_commands")
            if not cmds:
                raise ValueError(
                    f"env {i} lists no admissible commands: mode='choose' needs info['admissible_commands']; "
                    "use mode='generate' for free-text envs"
                )
            commands.append(list(cmds))
        candidates = [self._command_tokens.many(cmds) for cmds in commands]
        rngs = [np.random.default_rng(seed) for seed in sample_seeds] if sample_seeds is not None else self._rng
        chosen, logps = choose_candidates(self._scores(prompts, candidates), self.temperature, deterministic, rngs)
        return [ActionSample(text=cmds[c], prompt_ids=prompt, action_ids=cands[c], candidate_ids=cands, chosen=c,
                             old_logprobs=logps[k : k + 1].copy(), parsed=True)
                for k, (prompt, cmds, cands, c) in enumerate(zip(prompts, commands, candidates, chosen))]

    def reseed_sampling(self, seed: int) -> None:
        """Restart the action-sampling generator from ``seed`` (the trainer does it before every
        rollout, so a resumed or data-parallel run samples reproducibly without saving its state)."""
        self._rng = np.random.default_rng(seed)

    @contextmanager
    def seeded_sampling(self, seed: int) -> Iterator[None]:
        """Sample from a generator seeded with ``seed`` inside the block, then continue the
        previous one (an evaluation gives the same result wherever it runs in training)."""
        rng = self._rng
        self._rng = np.random.default_rng(seed)
        try:
            yield
        finally:
            self._rng = rng

    def _generate(self, prompts: list[list[int]], action_formats: Sequence[str],
                  deterministic: bool, sample_seeds: Sequence[int] | None = None) -> list[ActionSample]:
        """Replies from the sampler, parsed into actions (each env's ``action_format`` under
        ``action_parser="auto"``), with the behaviour log-probs of their tokens."""
        if sample_seeds is not None:  # each row's own seed
            seeds = [int(s) for s in sample_seeds]
        else:  # the sampler's randomness follows the policy's generator
            first = int(self._rng.integers(2**31 - 1))
            seeds = [first + k for k in range(len(prompts))]
        completions = self.sampler.generate(prompts, self.temperature, self.config.max_new_tokens, deterministic, seeds)
        replies = [c.token_ids for c in completions]
        recompute = not isinstance(self.sampler,
                                   HFSampler) and not self.config.sampler.trust_logprobs and not deterministic
        behaviour = self._logprobs(prompts, replies)[0] if recompute else None
        samples = []
        for i, completion in enumerate(completions):
            raw = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            text, parsed = self.parse(raw, action_formats[i])
            old = completion.logprobs if behaviour is None else behaviour[i].float().cpu().numpy().astype(np.float32)
            samples.append(
                ActionSample(
                    text=text, prompt_ids=prompts[i], action_ids=list(completion.token_ids), candidate_ids=None,
                    chosen=None, old_logprobs=old, parsed=parsed, raw_text=raw,
                    sampler_logprobs=completion.logprobs if behaviour is not None else None,
                )  # fmt: skip
            )
        return samples

    def before_update(self) -> None:
        """Called by the trainer before it changes the weights (a vLLM engine sleeps on CUDA)."""
        self.sampler.before_update()

    def after_update(self) -> None:
        """Called by the trainer after it changed the weights (a vLLM engine takes the new adapter)."""
        self.sampler.after_update()

    def close(self) -> None:
        """Release the sampler (a vLLM engine)."""
        self.sampler.close()

    # -------------------------------------------------------------- training
    def evaluate_actions(
        self, samples: Sequence[ActionSample], with_entropy: bool = False, use_reference: bool = False
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Per-unit log-probs of ``samples`` under the current policy (or the reference).

        Returns ``(logp [B, L], mask [B, L] bool, entropy [B, L] | None)`` on the
        policy's device; generate: L = the longest action, entropy of the
        vocabulary distribution per token; choose: L = 1, entropy of the
        candidate softmax. With ``use_reference`` the adapter is disabled and no
        graph is built.
        """
        if not samples:
            raise ValueError("evaluate_actions needs at least one sample")
        if use_reference:
            with self.model.disable_adapter(), th.no_grad():
                return self._evaluate(samples, with_entropy)
        return self._evaluate(samples, with_entropy)

    def _evaluate(self, samples: Sequence[ActionSample],
                  with_entropy: bool) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        device = self.device
        if self.mode == "generate":
            logps, ents = self._logprobs([s.prompt_ids for s in samples], [s.action_ids for s in samples], with_entropy)
            length = max(len(s.action_ids) for s in samples)
            logp = th.zeros((len(samples), length), device=device)
            entropy = th.zeros((len(samples), length), device=device) if with_entropy else None
            mask = th.zeros((len(samples), length), dtype=th.bool, device=device)
            for i, lp in enumerate(logps):
                logp[i, : len(lp)] = lp
                mask[i, : len(lp)] = True
                if entropy is not None:
                    entropy[i, : len(lp)] = cast(th.Tensor, ents[i])  # scored with_entropy
            return logp, mask, entropy
        if any(s.candidate_ids is None or s.chosen is None for s in samples):
            raise ValueError("choose-mode evaluate_actions needs samples with candidate_ids and chosen")
        scores = self._scores([s.prompt_ids for s in samples], [s.candidate_ids or [] for s in samples])
        logp, entropy = chosen_log_probs(scores, [int(cast(int, s.chosen)) for s in samples], self.temperature,
                                         with_entropy)
        return logp, th.ones((len(samples), 1), dtype=th.bool, device=device), entropy

    # ------------------------------------------------------------- SB3 glue
    def predict(  # type: ignore[override]
        self,
        observation: str | Sequence[str] | np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        infos: Sequence[dict[str, Any]] | None = None,
        histories: Sequence[Sequence[tuple[str, str]]] | None = None,
    ) -> tuple[str | np.ndarray, None]:
        """SB3-style ``(actions, None)``: action strings for text observations.

        Choose mode needs ``infos`` (with ``admissible_commands``); ``deterministic``
        is greedy / argmax.
        """
        self.set_training_mode(False)
        single = isinstance(observation, str)
        obs: list[str] = [observation] if isinstance(observation, str) else [str(o) for o in observation]
        if infos is None and self.mode == "choose":
            raise ValueError("predict() in choose mode needs the env's infos (they list the admissible commands it "
                             "scores): predict(obs, infos=infos) with the infos of reset/step, model.predict(obs) with "
                             "the obs the model's own env returned, or milegpo.evaluate_policy(model, env)")
        infos = [{}] * len(obs) if infos is None else ([infos] if isinstance(infos, dict) else list(infos))
        histories = [[] for _ in obs] if histories is None else list(histories)
        actions = [s.text for s in self.act(obs, infos, histories, deterministic=deterministic)]
        return (actions[0] if single else np.array(actions, dtype=object)), None

    def _predict(self, observation: Any, deterministic: bool = False) -> th.Tensor:
        raise TypeError("LLMPolicy acts on text: call predict() or act(), not _predict()")


#: Default scoring chunk sizes (padded tokens per forward pass), see ``max_batch_tokens``.
CPU_BATCH_TOKENS = 4096
GPU_BATCH_TOKENS = 16384
