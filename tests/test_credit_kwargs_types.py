"""``algo.credit_kwargs`` of the wrong type: one line naming the key, the value and what it takes.

Before, a text or a list for a number field ended in a ``TypeError`` traceback from a range check
(``'<' not supported between instances of 'str' and 'float'``), and a number or a text for a flag was
taken as true; an integer field took a fraction.
"""

from __future__ import annotations

import numpy as np
import pytest

from milegpo.cli import main
from milegpo.config import AlgoConfig
from milegpo.credit import make_credit_config
from milegpo.credit.milegpo import MileGPOConfig


@pytest.mark.parametrize("value", ["abc", [1, 2], {"a": 1}, None, True, float("nan")])
def test_a_number_field_refuses_what_is_not_a_number(value: object) -> None:
    with pytest.raises(ValueError, match=rf"^algo.credit_kwargs: omega must be a number, got {value!r}$".replace(
            "[", r"\[").replace("]", r"\]")):
        AlgoConfig(method="milegpo", credit_kwargs={"omega": value})


@pytest.mark.parametrize("value", ["abc", 1, 0, None])
def test_a_flag_refuses_what_is_not_true_or_false(value: object) -> None:
    with pytest.raises(ValueError, match=rf"^algo.credit_kwargs: rcs must be true or false, got {value!r}$"):
        AlgoConfig(method="milegpo", credit_kwargs={"rcs": value})


@pytest.mark.parametrize("value", [0.5, 1.0, "1", True])
def test_an_integer_field_refuses_what_is_not_an_integer(value: object) -> None:
    with pytest.raises(ValueError, match=rf"^algo.credit_kwargs: kappa_bc must be an integer, got {value!r}$"):
        AlgoConfig(method="milegpo", credit_kwargs={"kappa_bc": value})


def test_a_text_field_refuses_a_number() -> None:
    with pytest.raises(ValueError, match=r"^algo.credit_kwargs: norm must be text, got 3$"):
        AlgoConfig(method="grpo", credit_kwargs={"norm": 3})


def test_an_optional_field_takes_null_and_refuses_text() -> None:
    assert AlgoConfig(method="graphgpo", credit_kwargs={"success_threshold": None}).credit_config() \
        .success_threshold is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^algo.credit_kwargs: success_threshold must be a number or null, got 'x'$"):
        AlgoConfig(method="graphgpo", credit_kwargs={"success_threshold": "x"})


def test_a_value_its_field_refuses_names_where_it_was_set() -> None:
    with pytest.raises(ValueError, match=r"^algo.credit_kwargs: omega must be in \[0.0, 1.0\], got -1.0$"):
        AlgoConfig(method="milegpo", credit_kwargs={"omega": -1})


def test_outside_a_train_config_the_field_alone_is_named() -> None:
    with pytest.raises(ValueError, match=r"^omega must be a number, got 'abc'$"):
        make_credit_config("milegpo", omega="abc")
    with pytest.raises(ValueError, match=r"^gamma must be a number, got \[0.9\]$"):
        make_credit_config("gigpo", gamma=[0.9])


def test_valid_values_still_pass_as_their_fields_types() -> None:
    config = AlgoConfig(method="milegpo", credit_preset="webshop", credit_kwargs={
        "omega": 0.5, "lam": 1, "w_c": np.float32(0.5), "kappa_bc": np.int64(2), "rcs": False, "pcc": np.bool_(True),
        "memory_half_life": "inf", "memory_max_tasks": 10, "norm": "mean_norm", "success_threshold": None,
    }).credit_config()
    assert isinstance(config, MileGPOConfig)
    assert (config.omega, config.lam, config.w_c, config.kappa_bc, config.rcs, config.pcc) == (0.5, 1.0, 0.5, 2, False,
                                                                                              True)
    assert type(config.lam) is float and type(config.kappa_bc) is int and type(config.pcc) is bool
    assert config.memory_half_life == float("inf") and config.memory_max_tasks == 10 and config.norm == "mean_norm"
    assert config.eta == 1.0  # the preset is kept under the overrides
    assert AlgoConfig(method="milegpo").credit_config() == MileGPOConfig()


def test_the_command_line_says_it_in_one_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "algo.credit_kwargs.omega=abc", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err == "error: algo.credit_kwargs: omega must be a number, got 'abc'\n", err
    assert main(["train", "algo.credit_kwargs.omega=0.5", "--print-config"]) == 0
    assert "omega: 0.5" in capsys.readouterr().out
