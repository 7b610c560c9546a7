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
``algorithm.g2po.mode`` and ``algorithm.g2po.step_advantage_w`` (keys of the G2PO authors' fork
of verl-agent) configure ``milegpo.g2po``;
``actor_rollout_ref.actor.use_invalid_action_penalty`` / ``invalid_action_penalty_coef``
set the invalid-action penalty. A key that would change the result but that milegpo's
credit cannot honour is refused with a message naming it: ``algorithm.use_kl_in_reward``,
``algorithm.gigpo.enable_similarity``, ``algorithm.milegpo.memory_half_life > 0`` (the milestone
memory needs the trainer to carry it across iterations), and the keys that score replies into
``token_level_scores`` (``reward_model.enable``, a ``reward_model.reward_manager`` other
than verl-agent's ``episode``, ``custom_reward_function.path``), a column verl-agent's own
estimators read and milegpo's do not. So are a milegpo field set twice (under
``algorithm.milegpo`` and through verl-agent's own key), an unknown field, and a value a
field does not take (named by the key the user set). Every key is checked before
anything is refused, and one message lists every refusal.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from milegpo.config.fields import check_type
from milegpo.credit import CREDIT_METHODS, CreditConfig, make_credit_config
from milegpo.credit.memory import uses_memory
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
    # the G2PO authors' verl-agent fork adds these two (default as in its ppo_trainer.yaml); verl-agent has neither
    "algorithm.g2po.mode": ("mean_norm", ("g2po",), "norm"),
    "algorithm.g2po.step_advantage_w": (1.0, ("g2po",), "w_step"),
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


class _Refusals:
    """The refusals of one settings check, gathered so that one message lists every line to change."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        self.messages.append(message)

    def checked(self, path: str, value: object, kind: type, optional: bool = False) -> bool:
        """Whether ``value`` is of ``kind`` (see :func:`_checked`); if not, the refusal is kept."""
        try:
            _checked(path, value, kind, optional)
        except ValueError as err:
            self.add(str(err))
            return False
        return True

    def raise_if_any(self, name: str) -> None:
        """One ``ValueError`` listing every refusal (a single one as it is)."""
        if len(self.messages) == 1:
            raise ValueError(self.messages[0])
        if self.messages:
            lines = "\n".join(f"  - {message}" for message in self.messages)
            raise ValueError(f"{len(self.messages)} settings cannot be used with algorithm.adv_estimator={name!r}; "
                             f"change or drop each:\n{lines}")


def _said_of(path: str, label: str, value: object, err: ValueError) -> str:
    """``err``, a message about the setting ``label``, said of the key ``path`` the user set instead."""
    text = str(err)
    if text.startswith(f"{label} "):
        return f"{path} {text[len(label) + 1:]}"
    return f"{path}={value!r}: {text}"


#: verl-agent's keys that put a score other than the env's rewards into ``token_level_scores``, the column its
#: own estimators read and milegpo's do not: (the key, whether its value puts such a score there, what it puts)
_SCORE_KEYS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("reward_model.enable", bool, "the reward model's scores into token_level_scores (verl-agent's episode reward "
                                  "manager returns them in place of the env's episode rewards)"),
    ("reward_model.reward_manager", lambda value: value != "episode",
     "its compute_score's scores into token_level_scores in place of the env's episode rewards (verl-agent's "
     "default manager is 'episode')"),
    ("custom_reward_function.path", bool, "the custom reward function's scores into token_level_scores"),
)


def _refuse_scores(config: ConfigTree, refusals: _Refusals) -> None:
    """Refuse the keys that put a score into ``token_level_scores`` / ``token_level_rewards``: verl-agent's own
    estimators read those columns, milegpo's step credit reads each step's env reward
    (``non_tensor_batch["rewards"]``) and the env's ``won``, so such a score would move verl-agent's advantages and
    leave milegpo's unchanged. It is refused rather than read: a row's score (the reward model's judgement of one
    reply) has no place among a trajectory's step rewards, outcome and success without an arbitrary choice of how
    it enters each method."""
    if _get(config, "algorithm.use_kl_in_reward", False):
        refusals.add("algorithm.use_kl_in_reward=True puts a KL penalty into token_level_rewards, which milegpo's "
                     "step credit does not read (it reads the env rewards): use "
                     "actor_rollout_ref.actor.use_kl_loss=True instead")
    for path, scores, what in _SCORE_KEYS:
        value = _get(config, path)
        if value is not None and scores(value):
            refusals.add(f"{path}={value!r} puts {what}; verl-agent's estimators read that column, milegpo's step "
                         f"credit does not (it reads each step's env reward and the env's won): drop {path}")


def _milegpo_keys(config: ConfigTree, method: str, refusals: _Refusals) -> tuple[dict[str, object], SuccessRule]:
    """The ``algorithm.milegpo`` keys that pass their type check, as credit-config overrides, and the
    success rule; each key that does not pass is refused under its own name."""
    ours = _plain(_get(config, "algorithm.milegpo"))
    source = ours.pop("success", "auto")
    threshold = ours.pop("success_reward", 10.0)
    source_ok = refusals.checked("algorithm.milegpo.success", source, str)
    threshold_ok = refusals.checked("algorithm.milegpo.success_reward", threshold, float)
    if source_ok:
        try:
            SuccessRule(source=str(source))
        except ValueError as err:
            source_ok = False
            refusals.add(_said_of("algorithm.milegpo.success", "success source", source, err))
    if threshold_ok:
        try:
            SuccessRule(success_reward=_number("algorithm.milegpo.success_reward", threshold))
        except ValueError as err:
            threshold_ok = False
            refusals.add(_said_of("algorithm.milegpo.success_reward", "success_reward", threshold, err))
    success = SuccessRule()
    if source_ok and threshold_ok:
        success = SuccessRule(str(source), _number("algorithm.milegpo.success_reward", threshold))
    kinds = _field_kinds(method)
    checked: dict[str, object] = {}
    for key, value in ours.items():
        if key == "preset":
            passed = refusals.checked("algorithm.milegpo.preset", value, str)
        else:
            passed = key not in kinds or refusals.checked(f"algorithm.milegpo.{key}", value, *kinds[key])
        if passed:
            checked[key] = value
    return checked, success


def _inherited(config: ConfigTree, name: str, method: str, refusals: _Refusals) -> dict[str, tuple[str, object]]:
    """The credit fields verl-agent's own keys set for ``method``, as ``{field: (key, value)}``. A key set away
    from verl-agent's default for a method that does not read it is refused (it would have no effect), as is a
    value the field does not take (the message names the key, not the field)."""
    inherited: dict[str, tuple[str, object]] = {}
    for path, (default, readers, field_name) in _VERL_KEYS.items():
        value = _get(config, path)
        if value is None or not refusals.checked(path, value, type(default)):
            continue
        if method not in readers:
            if value != default:
                users = ", ".join(repr(estimator) for estimator, reader in sorted(ESTIMATORS.items())
                                  if reader in readers)
                refusals.add(f"{path}={value!r} has no effect on {name!r} (only {users} read it): remove it or "
                             f"leave verl-agent's default {default!r}")
            continue
        if isinstance(value, bool):  # norm_adv_by_std_in_grpo
            setting: object = "mean_std_norm" if value else "mean_norm"
        else:
            setting = value if isinstance(value, str) else _number(path, value)
        try:
            make_credit_config(method, **{field_name: setting})
        except ValueError as err:
            refusals.add(_said_of(path, field_name, value, err))
            continue
        inherited[field_name] = (path, setting)
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

    Every key is checked before anything is refused, so one message lists every line a run's
    command line must change (a ``run_*.sh`` script converted to milegpo meets them all at once).

    :param estimator: the ``adv_estimator`` name (default: ``config.algorithm.adv_estimator``).
    :raises ValueError: keys that cannot be honoured, set twice, unknown, or of the wrong type
        (the message names each).
    """
    name = estimator if estimator is not None else _get(config, "algorithm.adv_estimator")
    name = str(getattr(name, "value", name))
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={name!r} is not a milegpo estimator; milegpo provides "
                         f"{sorted(ESTIMATORS)}")
    method = ESTIMATORS[name]
    refusals = _Refusals()
    _refuse_scores(config, refusals)
    if _get(config, "algorithm.gigpo.enable_similarity", False):
        refusals.add("algorithm.gigpo.enable_similarity=True (similarity-merged anchor states) is not "
                     f"implemented by milegpo's estimators; set it to False for {name!r}")
    ours, success = _milegpo_keys(config, method, refusals)
    inherited = _inherited(config, name, method, refusals)
    for field_name in sorted(set(inherited) & set(ours)):
        refusals.add(f"algorithm.milegpo.{field_name} is set, and verl-agent's {inherited[field_name][0]} sets the "
                     f"same value of {name!r}: set it in one place")
    credit = None
    try:
        credit = make_credit_config(method, **{**{key: value for key, (_, value) in inherited.items()}, **ours})
    except (TypeError, ValueError) as err:
        refusals.add(f"algorithm.milegpo for {name!r}: {err} (or one of {list(_RUN_KEYS)})")
    if credit is not None and uses_memory(credit):
        refusals.add(f"algorithm.milegpo.memory_half_life={ours.get('memory_half_life')} (the milestone memory) is not "
                     "available under verl-agent: its estimator credits each batch alone and carries nothing "
                     "across steps; set it to 0, or train with milegpo's own trainer")
    penalty = 0.0
    try:
        penalty = invalid_action_penalty(config)
    except ValueError as err:
        refusals.add(str(err))
    refusals.raise_if_any(name)
    assert credit is not None  # built, else a refusal was raised
    return EstimatorSettings(method=method, credit=credit, success=success, invalid_action_penalty=penalty)
