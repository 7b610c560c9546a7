"""MileGPO and the baselines it is compared with: one trainer, one credit function each.

Every class is :class:`~milegpo.algos.base.GroupRLAlgorithm` with another
``credit_method`` (and its presets); the rollouts, the buffer, the update and the
logging are identical, so differences in results come from the credit alone::

    from milegpo import MileGPO, make_vec_env

    env = make_vec_env("milegpo/House-v0", n_tasks=4, group_size=8)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3,
                    policy_kwargs={"model": path, "mode": "choose"}, credit_preset="alfworld")
    model.learn(total_timesteps=20_000, progress_bar=True)

The keyword arguments are :class:`~milegpo.config.AlgoConfig` fields (or pass ``config=AlgoConfig(...)``);
``policy_kwargs`` those of :class:`~milegpo.config.PolicyConfig`. ``credit_kwargs`` overrides single
fields of the credit config (e.g.
``{"eta": 0.0}`` makes MileGPO equal GraphGPO; ``{"norm": "mean_norm"}``).
"""

from __future__ import annotations

from typing import ClassVar

from milegpo.algos.base import GroupRLAlgorithm


class GRPO(GroupRLAlgorithm):
    """GRPO: every step of trajectory ``i`` gets ``(Z_i - mean_q Z) / (std_q Z + eps)``."""

    credit_method: ClassVar[str] = "grpo"


class RLOO(GroupRLAlgorithm):
    """RLOO: every step of trajectory ``i`` gets ``Z_i`` minus the mean outcome of the group's other trajectories."""

    credit_method: ClassVar[str] = "rloo"


class GiGPO(GroupRLAlgorithm):
    """GiGPO (arXiv 2505.10978): episode term plus a step term normalised among steps
    taken from the same anchor state (discounted return, gamma 0.95)."""

    credit_method: ClassVar[str] = "gigpo"


class HGPO(GroupRLAlgorithm):
    """HGPO (arXiv 2602.22817): step groups of the same task sharing the last 1..H+1 states,
    normalised per history length and averaged with weights growing with the length."""

    credit_method: ClassVar[str] = "hgpo"


class GraphGPO(GroupRLAlgorithm):
    """GraphGPO: step return ``c * gamma_G ** d(s_{t+1}, goal)`` on the task graph,
    normalised within same-state step groups, plus the episode term."""

    credit_method: ClassVar[str] = "graphgpo"


class MileGPO(GroupRLAlgorithm):
    """MileGPO: GraphGPO plus milestone discovery, reliability-calibrated shaping and
    progress-contrastive calibration (:mod:`milegpo.credit.milegpo`).

    Presets (the paper's per-env values): ``"alfworld"`` (theta_m 1.1, rho 0, eta 0.2,
    kappa_bc 0; also the config defaults) and ``"webshop"`` (theta_m 0.5, rho 0.5,
    eta 1.0, kappa_bc 1).
    """

    credit_method: ClassVar[str] = "milegpo"


class GAGPO(GroupRLAlgorithm):
    """GAGPO (arXiv 2605.13217): the generalised advantage estimate of TD errors against a value
    proxy, the mean discounted return of the task's steps taken from the same state, normalised per task
    (:mod:`milegpo.credit.gagpo`)."""

    credit_method: ClassVar[str] = "gagpo"


class G2PO(GroupRLAlgorithm):
    """G2PO (arXiv 2606.22995): steps grouped by state, each group scored by the discounted outcome of its
    steps; a step is credited for the score of the group it led to (against the other steps from its state)
    and for its score gain (against the task's steps), plus the episode term (:mod:`milegpo.credit.g2po`)."""

    credit_method: ClassVar[str] = "g2po"


#: Algorithm classes by name (for the CLI and scripts).
ALGORITHMS: dict[str, type[GroupRLAlgorithm]] = {"milegpo": MileGPO, "graphgpo": GraphGPO, "hgpo": HGPO, "gigpo": GiGPO,
                                                  "rloo": RLOO, "grpo": GRPO, "gagpo": GAGPO, "g2po": G2PO}
