"""The credit settings of a verl-agent run, read from its hydra config.

A verl-agent user configures the estimator where they configure everything else::

    algorithm.adv_estimator=milegpo            # or graphgpo, hgpo, milegpo.<method>
    +algorithm.milegpo.preset=webshop          # any field of the method's credit config
    +algorithm.milegpo.eta=0.5
    +algorithm.milegpo.success=auto            # auto | won | reward
    +algorithm.milegpo.success_reward=10.0     # the reward rule's threshold

verl-agent's own keys keep their meaning, as in its GiGPO: ``algorithm.gamma`` is the
step-return discount of the methods that discount (``milegpo.gigpo``, ``hgpo``);
``algorithm.gigpo.mode`` and ``algorithm.gigpo.step_advantage_w`` configure
``milegpo.gigpo``; ``algorithm.norm_adv_by_std_in_grpo`` configures ``milegpo.grpo``;
``actor_rollout_ref.actor.use_invalid_action_penalty`` / ``invalid_action_penalty_coef``
set the invalid-action penalty. A key that would change the result but that milegpo's
credit cannot honour (``algorithm.use_kl_in_reward``, ``algorithm.gigpo.enable_similarity``)
is refused with a message naming it, as is a milegpo field set twice (under
``algorithm.milegpo`` and through verl-agent's own key) and any unknown field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from milegpo.credit import CREDIT_METHODS, CreditConfig, make_credit_config
from milegpo.integrations.verl.steps import SuccessRule

#: ``algorithm.adv_estimator`` names routed to milegpo: the methods verl-agent lacks under
#: their own name, and every method under ``milegpo.<method>``.
ESTIMATORS: dict[str, str] = {"milegpo": "milegpo", "graphgpo": "graphgpo", "hgpo": "hgpo",
                              **{f"milegpo.{method}": method for method in CREDIT_METHODS}}

#: the keys of ``algorithm.milegpo`` that are not credit-config fields
_RUN_KEYS = ("success", "success_reward")

ConfigTree = Mapping[str, object]


@dataclass(frozen=True)
class EstimatorSettings:
    """Everything :func:`~milegpo.integrations.verl.compute_step_advantage` needs for one run."""

    method: str
    credit: CreditConfig
    success: SuccessRule = field(default_factory=SuccessRule)
    invalid_action_penalty: float = 0.1


def _get(tree: object, path: str, default: object = None) -> object:
    node = tree
    for part in path.split("."):
        if node is None:
            return default
        try:
            node = node[part] if part in node else None  # type: ignore[index,operator]
        except TypeError:
            node = getattr(node, part, None)
    return default if node is None else node


def _plain(tree: object) -> dict[str, object]:
    """A hydra/OmegaConf node (or dict) as a plain dict."""
    if tree is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(tree, DictConfig):
            return dict(OmegaConf.to_container(tree, resolve=True))  # type: ignore[arg-type]
    except ImportError:
        pass
    return dict(tree)  # type: ignore[call-overload]


def settings_from_config(config: ConfigTree, estimator: str | None = None) -> EstimatorSettings:
    """The :class:`EstimatorSettings` of a verl-agent trainer config (hydra ``DictConfig`` or dict).

    :param estimator: the ``adv_estimator`` name (default: ``config.algorithm.adv_estimator``).
    :raises ValueError: a key that cannot be honoured, set twice, or unknown (the message names it).
    """
    name = str(estimator if estimator is not None else _get(config, "algorithm.adv_estimator"))
    name = getattr(name, "value", name)
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={name!r} is not a milegpo estimator; milegpo provides "
                         f"{sorted(ESTIMATORS)}")
    method = ESTIMATORS[name]
    ours = _plain(_get(config, "algorithm.milegpo"))
    success = SuccessRule(source=str(ours.pop("success", "auto")),
                          success_reward=float(ours.pop("success_reward", 10.0)))  # type: ignore[arg-type]

    if _get(config, "algorithm.use_kl_in_reward", False):
        raise ValueError("algorithm.use_kl_in_reward=True puts a KL penalty into token_level_rewards, which "
                         "milegpo's step credit does not read (it reads the env rewards): use "
                         "actor_rollout_ref.actor.use_kl_loss=True instead")
    if _get(config, "algorithm.gigpo.enable_similarity", False):
        raise ValueError("algorithm.gigpo.enable_similarity=True (similarity-merged anchor states) is not "
                         f"implemented by milegpo's estimators; set it to False for {name!r}")

    inherited: dict[str, object] = {}
    gamma = _get(config, "algorithm.gamma")
    if method in ("gigpo", "hgpo") and gamma is not None:
        inherited["gamma"] = float(gamma)  # type: ignore[arg-type]
    if method == "gigpo":
        mode = _get(config, "algorithm.gigpo.mode")
        weight = _get(config, "algorithm.gigpo.step_advantage_w")
        if mode is not None:
            inherited["norm"] = str(mode)
        if weight is not None:
            inherited["w_step"] = float(weight)  # type: ignore[arg-type]
    if method == "grpo":
        by_std = _get(config, "algorithm.norm_adv_by_std_in_grpo")
        if by_std is not None:
            inherited["norm"] = "mean_std_norm" if by_std else "mean_norm"
    twice = sorted(set(inherited) & set(ours))
    if twice:
        source = {"gamma": "algorithm.gamma", "w_step": "algorithm.gigpo.step_advantage_w",
                  "norm": "algorithm.gigpo.mode" if method == "gigpo" else "algorithm.norm_adv_by_std_in_grpo"}
        raise ValueError(f"algorithm.milegpo.{twice[0]} is set, and verl-agent's {source[twice[0]]} sets the same "
                         f"value of {name!r}: set it in one place")
    try:
        credit = make_credit_config(method, **{**inherited, **ours})
    except (TypeError, ValueError) as err:
        raise ValueError(f"algorithm.milegpo for {name!r}: {err} (or one of {list(_RUN_KEYS)})") from None

    use_penalty = bool(_get(config, "actor_rollout_ref.actor.use_invalid_action_penalty", True))
    coef = float(_get(config, "actor_rollout_ref.actor.invalid_action_penalty_coef", 0.1))  # type: ignore[arg-type]
    return EstimatorSettings(method=method, credit=credit, success=success,
                             invalid_action_penalty=coef if use_penalty else 0.0)
