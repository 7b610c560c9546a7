"""A tiny causal LM built offline: random weights from a config + a word-level tokenizer.

Tests, the CPU demo and the learning benchmarks need a real ``transformers``
model that can be created without a model hub. :func:`tiny_model` builds one
(Llama-, Qwen2- or GPT-2-style) with a tokenizer whose vocabulary is the words
of the environment, saves both with ``save_pretrained`` and returns the folder,
which then loads with ``AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer.from_pretrained`` exactly like a hub model.

The tokenizer is word-level (``tokenizers.models.WordLevel``): one token per
word, punctuation mark, digit and newline, with spaces carried by a ``▁``
word prefix (Metaspace), so decoding reproduces the text exactly — a generated
``<action>go to kitchen</action>`` decodes to that string. Unknown words map to
``<unk>``. ``<think>``, ``</think>``, ``<action>``, ``</action>`` and the chat
markers are single tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from milegpo.config import TinyModelConfig

#: Chat markers and the tags the policy asks the model to write.
UNK, PAD, BOS, EOS = "<unk>", "<|pad|>", "<|im_start|>", "<|im_end|>"
TAG_TOKENS = ("<think>", "</think>", "<action>", "</action>")
SPACE = "\u2581"  # "▁", the Metaspace space marker

#: A ChatML-style template (the format Qwen2.5 and SmolLM2 use).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ARCHS = ("llama", "qwen2", "gpt2")


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )


def build_word_tokenizer(vocab_texts: Iterable[str]):
    """A ``PreTrainedTokenizerFast`` whose vocabulary holds every word of ``vocab_texts``.

    Each word is added bare, with the space prefix, and capitalised both ways,
    so a word found anywhere in a sentence never becomes ``<unk>``. The prompt
    templates of :mod:`milegpo.policies.prompts` are always included.
    """
    import string

    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from milegpo.policies.prompts import template_vocabulary

    pre = _pre_tokenizer()
    pieces: set[str] = set(string.digits) | set(string.punctuation) | {"\n", SPACE}
    texts = [*vocab_texts, *template_vocabulary(), "system user assistant"]
    for text in texts:
        for piece, _ in pre.pre_tokenize_str(str(text)):
            word = piece.lstrip(SPACE)
            if not word:
                continue
            for form in {word, word.lower(), word.capitalize()}:
                pieces.add(form)
                pieces.add(SPACE + form)
    specials = [UNK, PAD, BOS, EOS]
    vocab = {tok: i for i, tok in enumerate([*specials, *TAG_TOKENS, *sorted(pieces)])}

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    tok.add_special_tokens(specials)
    tok.add_tokens(list(TAG_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _config(arch: str, vocab_size: int, tokenizer, hidden_size: int, num_layers: int, num_heads: int,
            max_positions: int,
            init_std: float):  # fmt: skip
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=init_std,
    )
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers, n_head=num_heads, n_positions=max_positions,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids,
        )  # fmt: skip
    cls = LlamaConfig if arch == "llama" else Qwen2Config
    return cls(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads, max_position_embeddings=max_positions,
        attention_dropout=0.0, **ids,
    )  # fmt: skip


def tiny_model(
    vocab_texts: Iterable[str],
    save_dir: str | os.PathLike,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 4096,
    init_std: float = 0.2,
) -> str:
    """Build a small randomly initialised causal LM and its word-level tokenizer; save them.

    :param vocab_texts: texts whose words make the vocabulary (e.g. ``HouseEnv.vocabulary()``).
    :param save_dir: folder to write; it then loads with ``from_pretrained(save_dir)``.
    :param arch: ``"llama"`` or ``"qwen2"`` (rotary positions) or ``"gpt2"`` (learned
        absolute positions — the architecture on which wrong ``position_ids`` show).
    :param seed: seeds the weight initialisation (same seed, same weights).
    :param init_std: std of the random weights. The (tied) embeddings stay frozen
        under LoRA and the final norm fixes the hidden-state scale, so they bound
        how peaked the output can become: with the usual 0.02 no token can get
        much probability (a 40-step LoRA fit of one reply plateaus at 4.6 nats
        per token); 0.2 fits it to 0.007 while the initial distribution stays
        broad (about 7 nats per token on a 330-word vocabulary).
    :return: ``str(save_dir)``.
    """
    from milegpo.policies.model import quiet_library_bars

    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {_ARCHS}, got {arch!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    with quiet_library_bars():
        _build_tiny_model(vocab_texts, save_dir, arch, hidden_size, num_layers, num_heads, seed,
                          max_position_embeddings, init_std)
    return str(save_dir)


def _build_tiny_model(vocab_texts: Iterable[str], save_dir: Path, arch: str, hidden_size: int, num_layers: int,
                      num_heads: int, seed: int, max_position_embeddings: int, init_std: float) -> None:
    """:func:`tiny_model`'s work: tokenizer, random weights, both saved in ``save_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = build_word_tokenizer(vocab_texts)
    tokenizer.save_pretrained(save_dir)
    # AutoTokenizer may rewrite parts of a custom tokenizer (its normaliser) on load:
    # load it once the way every user will and save that version.
    tokenizer = AutoTokenizer.from_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)

    config = _config(arch, len(tokenizer), tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings,
                     init_std)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(save_dir, safe_serialization=True)


def env_tiny_model(env_texts: Iterable[str], save_dir: str | os.PathLike, config: TinyModelConfig,
                   seed: int = 0) -> str:
    """The offline tiny model of an env (:func:`tiny_model` with ``config``'s sizes): its vocabulary is
    the env's texts (:func:`milegpo.envs.vocabulary.env_texts`) and the words the policy's own
    prompts add (templates, history lines, instructions)."""
    from milegpo.policies.prompts import HISTORY_HEADER, HISTORY_STEP, INSTRUCTIONS, PROMPT_TEMPLATES

    texts = [*env_texts, *PROMPT_TEMPLATES.values(), HISTORY_HEADER, HISTORY_STEP, *map(str, INSTRUCTIONS.values())]
    return tiny_model(texts, save_dir, hidden_size=config.hidden_size, num_layers=config.layers,
                      num_heads=config.heads, seed=seed)


def cached_env_tiny_model(env_texts: Iterable[str], config: TinyModelConfig, seed: int = 0,
                          cache_dir: str | os.PathLike | None = None) -> str:
    """:func:`env_tiny_model` in the cache folder (default ``$MILEGPO_CACHE`` or ``~/.cache/milegpo``),
    under a name made of a hash of its texts, sizes and seed: built once, found again by any later
    process (written beside and renamed into place, so a concurrent builder never sees half a model)."""
    import hashlib
    import json
    import shutil
    import tempfile

    from milegpo.policies.smollm import default_cache_dir

    texts = list(env_texts)
    recipe = json.dumps({"texts": texts, "sizes": [config.hidden_size, config.layers, config.heads], "seed": seed})
    target = Path(cache_dir or default_cache_dir()) / "tiny-models" / hashlib.sha256(recipe.encode()).hexdigest()[:16]
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        env_tiny_model(texts, tmp, config, seed)
        try:
            tmp.rename(target)
        except OSError:  # another process built it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
