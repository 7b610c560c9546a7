"""The update's importance ratio per token or per action, on a toy worked out by hand below."""

from __future__ import annotations

import math

import pytest
import torch as th

from milegpo.algos.loss import policy_loss

# Two actions (rows), old log-probs 0 so that logp is the log-ratio; clip 0.2 -> [0.8, 1.2].
#   action 0: A = +1, 2 tokens, ratios 2 and 1        (a padded third slot, logp 5.0, masked out)
#   action 1: A = -1, 3 tokens, ratios 1, 0.5 and 1.5
# pg per unit = max(-A rho, -A clip(rho)).
LOGP = [[math.log(2.0), 0.0, 5.0], [0.0, math.log(0.5), math.log(1.5)]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
ADV = [1.0, -1.0]
RHO_1 = 0.75 ** (1 / 3)  # action 1: exp(mean(0, ln 0.5, ln 1.5)) = (0.75)^(1/3) ~ 0.9086, inside the clip


def loss(ratio_level: str, loss_agg: str = "token-mean"):
    logp = th.tensor(LOGP, dtype=th.float64, requires_grad=True)
    out = policy_loss(logp, th.zeros(2, 3, dtype=th.float64), th.tensor(ADV, dtype=th.float64),
                      th.tensor(MASK, dtype=th.float64), clip_range=0.2, n_units=5, n_seqs=2, loss_agg=loss_agg,
                      ratio_level=ratio_level)
    out.loss.backward()
    return out, logp.grad


def test_token_and_action_ratios_on_the_hand_worked_toy():
    token, token_grad = loss("token")
    action, action_grad = loss("action")
    # token: action 0: max(-2, -1.2) = -1.2, max(-1, -1) = -1; action 1: max(1, 1) = 1, max(0.5, 0.8) = 0.8,
    # max(1.5, 1.2) = 1.5 -> (-1.2 - 1 + 1 + 0.8 + 1.5) / 5 = 0.22
    assert token.loss.item() == pytest.approx(0.22, abs=1e-12)
    # action: action 0's ratio exp(ln 2 / 2) = sqrt 2 > 1.2 with A > 0: -1.2 on both tokens; action 1's
    # ratio RHO_1 is not clipped: RHO_1 on its three tokens -> (-2.4 + 3 RHO_1) / 5 ~ 0.0651
    assert action.loss.item() == pytest.approx((-2.4 + 3 * RHO_1) / 5, abs=1e-12)
    # units whose ratio is outside [0.8, 1.2]: token 3 of 5 (ratios 2, 0.5, 1.5); action the 2 of action 0
    assert token.stats["clip_fraction"] == pytest.approx(0.6) and action.stats["clip_fraction"] == pytest.approx(0.4)
    # gradients: token level, d/dlogp of -A rho / 5 where not clipped: action 0 token 1 -> -1/5, action 1
    # tokens 0 and 2 -> 1/5 and 1.5/5, the clipped ones 0. Action level: action 0 clipped -> 0; action 1
    # loss 3 RHO_1 / 5 with RHO_1 = exp(mean of its 3 log-ratios) -> RHO_1 / 5 on each of its tokens.
    assert token_grad.flatten().tolist() == pytest.approx([0.0, -0.2, 0.0, 0.2, 0.0, 0.3], abs=1e-12)
    assert action_grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, *[RHO_1 / 5] * 3], abs=1e-12)


def test_action_ratio_with_step_mean_aggregation():
    # seq-mean-token-mean: token ((-1.2 - 1) / 2 + 3.3 / 3) / 2 = -0.0; action (-1.2 + RHO_1) / 2
    assert loss("token", "seq-mean-token-mean")[0].loss.item() == pytest.approx((-1.1 + 1.1) / 2, abs=1e-12)
    assert loss("action", "seq-mean-token-mean")[0].loss.item() == pytest.approx((-1.2 + RHO_1) / 2, abs=1e-12)


def test_one_unit_per_action_makes_both_levels_equal():
    # choose mode: one unit per step, so the action's mean log-ratio is the unit's own
    gen = th.Generator().manual_seed(0)
    logp, old = th.randn(6, 1, generator=gen), th.randn(6, 1, generator=gen)
    adv, mask = th.randn(6, generator=gen), th.ones(6, 1)
    kwargs = {"clip_range": 0.2, "n_units": 6, "n_seqs": 6}
    token = policy_loss(logp, old, adv, mask, ratio_level="token", **kwargs)
    action = policy_loss(logp, old, adv, mask, ratio_level="action", **kwargs)
    assert th.equal(token.loss, action.loss) and token.stats == action.stats


def test_token_level_is_the_per_unit_ppo_clip():
    # the default keeps PPO's per-token form: rho = exp(logp - old) on every unit, clipped per unit
    gen = th.Generator().manual_seed(1)
    logp, old, adv = th.randn(4, 5, generator=gen), th.randn(4, 5, generator=gen), th.randn(4, generator=gen)
    mask = (th.rand(4, 5, generator=gen) > 0.3).float()
    ratio = th.exp(logp - old)
    pg = th.maximum(-adv[:, None] * ratio, -adv[:, None] * th.clamp(ratio, 0.8, 1.2))
    out = policy_loss(logp, old, adv, mask, clip_range=0.2, n_units=int(mask.sum()), n_seqs=4)
    assert th.equal(out.loss, (pg * mask).sum() / int(mask.sum()))


def test_unknown_ratio_level_is_refused():
    with pytest.raises(ValueError, match="ratio_level"):
        loss("sequence")


def test_algo_ratio_level_reaches_the_update(model_path: str):
    from milegpo import GAGPO, make_vec_env
    from milegpo.envs.house import HouseEnv

    env = make_vec_env(HouseEnv, n_tasks=2, group_size=2, seed=0, env_kwargs={"max_episode_steps": 4})
    model = GAGPO("LLMPolicy", env, policy_kwargs={"model": model_path, "mode": "choose", "history_length": 0,
                                                   "prompt_template": "{observation}"},
                  ratio_level="action", learning_rate=1e-2, seed=0)
    assert model.update_settings.ratio_level == "action"
    model.learn(total_timesteps=1)
    assert model.last_update_stats["optimizer_steps"] >= 1
    assert GAGPO("LLMPolicy", env, policy_kwargs={"model": model_path}, _init_setup_model=False)\
        .update_settings.ratio_level == "token"  # the default: PPO's per-token ratio
