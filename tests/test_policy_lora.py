"""LoRA: only the adapter trains, the reference is the base model, adapters save and load exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, completion_logprobs, tiny_model

TEXTS = ["you are in the hall . you see a red box", "go to kitchen", "open red box", "look"]
INFO = {"task": "open the red box", "admissible_commands": ["go to kitchen", "open red box", "look"]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(TEXTS, tmp_path_factory.mktemp("tiny") / "m", seed=4)


def make_policy(path, **kwargs):
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, **kwargs)


def perturb(policy, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_only_lora_parameters_train(tiny_dir):
    policy = make_policy(tiny_dir, lora={"r": 4})
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    targets = {n.split(".")[-4] for n in names}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert sum(p.numel() for p in policy.trainable_parameters()) == sum(
        p.numel() for g in policy.optimizer.param_groups for p in g["params"]
    )
    assert policy.device.type == "cpu" and next(policy.model.parameters()).dtype == torch.float32


def test_architecture_defaults_and_explicit_targets(tiny_dir, tmp_path):
    gpt2 = make_policy(tiny_model(TEXTS, tmp_path / "g", arch="gpt2"))
    adapted = {n.split(".")[-4] for n, p in gpt2.model.named_parameters() if p.requires_grad}
    assert adapted == {"c_attn", "c_proj", "c_fc"}
    only_q = make_policy(tiny_dir, lora={"target_modules": ["q_proj"]})
    assert {n.split(".")[-4] for n, p in only_q.model.named_parameters() if p.requires_grad} == {"q_proj"}
    with pytest.raises(ValueError, match=r"unknown setting\(s\) policy.lora.rank"):
        make_policy(tiny_dir, lora={"rank": 4})


@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_reference_is_the_base_model(tiny_dir, mode):
    policy = make_policy(tiny_dir, mode=mode, max_new_tokens=6, temperature=10.0)  # no near-certain choice
    samples = policy.act(["you see a red box"] * 3, [INFO] * 3, [[]] * 3)
    before, mask, _ = policy.evaluate_actions(samples)
    ref_before, _, _ = policy.evaluate_actions(samples, use_reference=True)
    torch.testing.assert_close(before, ref_before)  # LoRA B starts at zero: policy == reference
    perturb(policy)
    after, _, _ = policy.evaluate_actions(samples)
    ref_after, _, _ = policy.evaluate_actions(samples, use_reference=True)
    assert (after - before).abs()[mask].max() > 1e-2
    torch.testing.assert_close(ref_after, ref_before, atol=1e-6, rtol=0)
    assert not ref_after.requires_grad and after.requires_grad
    if mode == "generate":  # and the reference is exactly the plain base model
        base = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
        with torch.no_grad():
            plain, _, _ = completion_logprobs(base, [s.prompt_ids for s in samples], [s.action_ids for s in samples],
                                              policy.pad_id, temperature=10.0)  # fmt: skip
        torch.testing.assert_close(ref_after, plain, atol=1e-5, rtol=0)


def test_gradients_reach_only_lora(tiny_dir):
    policy = make_policy(tiny_dir)
    perturb(policy, scale=0.1)
    samples = policy.act(["you see a red box"] * 2, [INFO] * 2, [[]] * 2)
    logp, _, entropy = policy.evaluate_actions(samples, with_entropy=True)
    (logp.sum() + entropy.sum()).backward()
    assert all(p.grad is not None for p in policy.trainable_parameters())
    assert all(p.grad is None for p in policy.model.parameters() if not p.requires_grad)


def test_save_and_load_adapter(tiny_dir, tmp_path):
    policy = make_policy(tiny_dir, mode="generate", max_new_tokens=5, lora={"r": 4})
    perturb(policy, seed=1)
    samples = policy.act(["you see a red box"] * 3, [INFO] * 3, [[]] * 3)
    expected, _, _ = policy.evaluate_actions(samples)
    policy.save_adapter(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    fresh = make_policy(tiny_dir, mode="generate", max_new_tokens=5, lora={"r": 4})
    fresh.load_adapter(tmp_path / "adapter")
    torch.testing.assert_close(fresh.evaluate_actions(samples)[0], expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="does not match"):
        make_policy(tiny_dir, lora={"r": 8}).load_adapter(tmp_path / "adapter")
    with pytest.raises(FileNotFoundError, match="no saved adapter"):
        fresh.load_adapter(tmp_path / "nothing")
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read adapter"):
        fresh.load_adapter(tmp_path / "adapter")


def test_state_dict_holds_only_the_adapter(tiny_dir):
    policy = make_policy(tiny_dir)
    perturb(policy, seed=2)
    state = policy.state_dict()
    assert state and all("lora_" in k for k in state)
    assert sum(v.numel() for v in state.values()) == sum(p.numel() for p in policy.trainable_parameters())
    other = make_policy(tiny_dir)
    other.load_state_dict(state)
    for k, v in other.state_dict().items():
        assert torch.equal(v, state[k])
    with pytest.raises(RuntimeError, match="mismatch"):
        other.load_state_dict({k: v for k, v in list(state.items())[1:]})


def test_constructor_parameters_are_plain_values(tiny_dir):
    params = make_policy(tiny_dir, mode="generate", temperature=0.5)._get_constructor_parameters()
    config = params["config"]
    assert config["model"] == tiny_dir and config["mode"] == "generate" and config["temperature"] == 0.5
    assert json.loads(json.dumps(params["config"])) == config  # plain values
    assert config["lora"]["alpha"] == 32 and config["optimizer_class"] == "torch.optim:AdamW"


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir):
    grads = []
    for checkpointing in (False, True):
        policy = make_policy(tiny_dir, mode="generate", max_new_tokens=4, gradient_checkpointing=checkpointing, seed=3)
        perturb(policy, scale=0.1)
        samples = policy.act(["you see a red box"] * 2, [INFO] * 2, [[]] * 2)
        policy.set_training_mode(True)
        logp, mask, _ = policy.evaluate_actions(samples)
        logp[mask].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_act_samples_in_eval_mode_and_restores_the_mode(tiny_dir):
    policy = make_policy(tiny_dir, lora={"dropout": 0.5})
    perturb(policy)
    policy.set_training_mode(True)
    samples = policy.act(["you see a red box"] * 2, [INFO] * 2, [[]] * 2)
    assert policy.training
    policy.set_training_mode(False)
    logp, _, _ = policy.evaluate_actions(samples)
    np.testing.assert_allclose(logp[:, 0].detach().numpy(), [s.old_logprobs[0] for s in samples], atol=1e-5)


def test_seed_fixes_the_adapter_initialisation(tiny_dir):
    a, b, c = (make_policy(tiny_dir, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.trainable_parameters(), b.trainable_parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.trainable_parameters(), c.trainable_parameters()))


def test_policy_save_load_without_pickle(tiny_dir, tmp_path):
    policy = make_policy(tiny_dir, mode="generate", max_new_tokens=5, temperature=0.8, history_length=1)
    perturb(policy, seed=3)
    samples = policy.act(["you see a red box"] * 2, [INFO] * 2, [[]] * 2)
    policy.save(tmp_path / "policy")
    files = {p.name for p in (tmp_path / "policy").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "policy.json"} <= files
    assert not any(name.endswith((".pkl", ".pt", ".zip")) for name in files)
    loaded = LLMPolicy.load(tmp_path / "policy", device="cpu")
    assert (loaded.mode, loaded.temperature, loaded.config.history_length) == ("generate", 0.8, 1)
    assert loaded.config == policy.config
    torch.testing.assert_close(loaded.evaluate_actions(samples)[0], policy.evaluate_actions(samples)[0], atol=0, rtol=0)
    assert LLMPolicy.load(tmp_path / "policy", temperature=0.4).temperature == 0.4
    with pytest.raises(FileNotFoundError, match="policy.json"):
        LLMPolicy.load(tmp_path)
