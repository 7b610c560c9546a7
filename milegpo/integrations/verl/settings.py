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

import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from milegpo.config.fields import check_type
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


#: verl-agent's own keys that configure a credit method: (its default in verl-agent's
#: ppo_trainer.yaml, the milegpo methods that read it, the credit field it sets)
_VERL_KEYS: dict[str, tuple[object, tuple[str, ...], str]] = {
    "algorithm.gamma": (1.0, ("gigpo", "hgpo"), "gamma"),
    "algorithm.gigpo.mode": ("mean_norm", ("gigpo",), "norm"),
    "algorithm.gigpo.step_advantage_w": (1.0, ("gigpo",), "w_step"),
    "algorithm.norm_adv_by_std_in_grpo": (True, ("grpo",), "norm"),
}
#: what a value of each type must be, as said in an error message
_KINDS: dict[type, tuple[type | tuple[type, ...], str]] = {
    float: ((int, float), "a number"), int: (int, "an integer"), bool: (bool, "true or false"), str: (str, "a string"),
}
#: where the milegpo run keys and the penalty keys are read from, and their types
_PENALTY = "actor_rollout_ref.actor.use_invalid_action_penalty"
_PENALTY_COEF = "actor_rollout_ref.actor.invalid_action_penalty_coef"


def _checked(path: str, value: object, kind: type, optional: bool = False) -> object:
    """``value`` unless it is not of ``kind`` (an int passes for a float): then ``ValueError`` naming ``path``."""
    accepted, what = _KINDS[kind]
    check_type(path, value, accepted, what, optional=optional)
    return value


def _number(path: str, value: object) -> float:
    """``value`` as a float, refused with ``path`` in the message unless it is a number."""
    return float(typing.cast(float, _checked(path, value, float)))


def _field_kinds(method: str) -> dict[str, tuple[type, bool]]:
    """Each credit-config field of ``method``: (its type, whether it may be None)."""
    config_cls = type(make_credit_config(method))
    kinds: dict[str, tuple[type, bool]] = {}
    for field_name, hint in typing.get_type_hints(config_cls).items():
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        kinds[field_name] = (args[0] if args else hint, bool(args))
    return kinds


def _milegpo_keys(config: ConfigTree, method: str) -> tuple[dict[str, object], SuccessRule]:
    """The ``algorithm.milegpo`` keys as credit-config overrides (each type-checked under its own
    name) and the success rule."""
    ours = _plain(_get(config, "algorithm.milegpo"))
    success = SuccessRule(
        source=str(_checked("algorithm.milegpo.success", ours.pop("success", "auto"), str)),
        success_reward=_number("algorithm.milegpo.success_reward", ours.pop("success_reward", 10.0)))
    kinds = _field_kinds(method)
    for key, value in ours.items():
        if key == "preset":
            _checked("algorithm.milegpo.preset", value, str)
        elif key in kinds:
            _checked(f"algorithm.milegpo.{key}", value, *kinds[key])
    return ours, success


def _inherited(config: ConfigTree, name: str, method: str) -> dict[str, object]:
    """The credit fields verl-agent's own keys set for ``method``; a key set away from verl-agent's
    default for a method that does not read it is refused (it would have no effect)."""
    inherited: dict[str, object] = {}
    for path, (default, readers, field_name) in _VERL_KEYS.items():
        value = _get(config, path)
        if value is None:
            continue
        _checked(path, value, type(default))
        if method not in readers:
            if value != default:
                users = " and ".join(repr(f"milegpo.{reader}") for reader in readers)
                raise ValueError(f"{path}={value!r} has no effect on {name!r} (only {users} read it): remove it or "
                                 f"leave verl-agent's default {default!r}")
        elif isinstance(value, bool):  # norm_adv_by_std_in_grpo
            inherited[field_name] = "mean_std_norm" if value else "mean_norm"
        else:
            inherited[field_name] = value if isinstance(value, str) else _number(path, value)
    return inherited


def invalid_action_penalty(config: ConfigTree) -> float:
    """verl-agent's invalid-action penalty of a run: ``invalid_action_penalty_coef`` when
    ``use_invalid_action_penalty`` (both verl-agent's keys, defaults True and 0.1), else 0."""
    use = _checked(_PENALTY, _get(config, _PENALTY, True), bool)
    coef = _number(_PENALTY_COEF, _get(config, _PENALTY_COEF, 0.1))
    if not math.isfinite(coef) or coef < 0:
        raise ValueError(f"{_PENALTY_COEF} must be a finite number >= 0 (it is subtracted), got {coef!r}")
    return coef if use else 0.0


def settings_from_config(config: ConfigTree, estimator: str | None = None) -> EstimatorSettings:
    """The :class:`EstimatorSettings` of a verl-agent trainer config (hydra ``DictConfig`` or dict).

    :param estimator: the ``adv_estimator`` name (default: ``config.algorithm.adv_estimator``).
    :raises ValueError: a key that cannot be honoured, set twice, unknown, or of the wrong type
        (the message names it).
    """
    name = estimator if estimator is not None else _get(config, "algorithm.adv_estimator")
    name = str(getattr(name, "value", name))
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={name!r} is not a milegpo estimator; milegpo provides "
                         f"{sorted(ESTIMATORS)}")
    method = ESTIMATORS[name]
    if _get(config, "algorithm.use_kl_in_reward", False):
        raise ValueError("algorithm.use_kl_in_reward=True puts a KL penalty into token_level_rewards, which "
                         "milegpo's step credit does not read (it reads the env rewards): use "
                         "actor_rollout_ref.actor.use_kl_loss=True instead")
    if _get(config, "algorithm.gigpo.enable_similarity", False):
        raise ValueError("algorithm.gigpo.enable_similarity=True (similarity-merged anchor states) is not "
                         f"implemented by milegpo's estimators; set it to False for {name!r}")
    ours, success = _milegpo_keys(config, method)
    inherited = _inherited(config, name, method)
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
    return EstimatorSettings(method=method, credit=credit, success=success,
                             invalid_action_penalty=invalid_action_penalty(config))
