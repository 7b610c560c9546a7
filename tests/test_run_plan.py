"""The run plan: a run's settings checked once and everything a run derives from them, worked out by hand."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from milegpo.config.run import resolve_config
from milegpo.options import HELD_OUT_SEEDS_START, HELD_OUT_SPLIT
from milegpo.run.plan import RunPlan, checked_settings


def test_the_plan_derives_each_split_s_env_arguments_tasks_and_seed(tmp_path: Path) -> None:
    settings = resolve_config("cpu-demo", overrides=["run.seed=7", "eval.n_tasks=3", "env.kwargs={size: 5}",
                                                     "eval.splits=[eval_id, held_out]", "run.report_to=[WANDB, wandb]"])
    plan = RunPlan.of(settings, tmp_path / "run")

    assert plan.train_split.name == "train" and dict(plan.train_split.env_kwargs) == {"size": 5, "split": "train"}
    eval_id, held_out = plan.eval_splits
    assert (eval_id.name, dict(eval_id.env_kwargs), eval_id.task_seeds) == ("eval_id", {"size": 5, "split": "eval_id"},
                                                                            (0, 1, 2))
    # an env without splits is evaluated on the seeds training never draws, with no split argument
    assert dict(held_out.env_kwargs) == {"size": 5}
    assert held_out.task_seeds == (HELD_OUT_SEEDS_START, HELD_OUT_SEEDS_START + 1, HELD_OUT_SEEDS_START + 2)
    # each split's sampling seed is fixed by (run seed, split): what a checkpoint's score on it depends on
    assert eval_id.seed == zlib.crc32(b"7:eval_id") and held_out.seed == zlib.crc32(f"7:{HELD_OUT_SPLIT}".encode())
    # no model named: the run's own tiny model in its folder, and the policy acts with it
    assert plan.base_model == str((tmp_path / "run" / "base_model").resolve()) == plan.policy.model
    assert plan.trackers == ("wandb",)
    assert plan.eval_sampling == {"deterministic": False, "temperature": settings.eval.temperature}


def test_a_warm_start_without_a_seed_takes_the_run_s(tmp_path: Path) -> None:
    settings = resolve_config("cpu-demo", overrides=["run.seed=11"]).replace(**{"run.warm_start": {"episodes": 2}})
    assert settings.run.warm_start is not None and settings.run.warm_start.seed is None
    assert RunPlan.of(settings, tmp_path).warm_start.seed == 11  # type: ignore[union-attr]
    seeded = settings.replace(**{"run.warm_start": {"episodes": 2, "seed": 3}})
    assert RunPlan.of(seeded, tmp_path).warm_start.seed == 3  # type: ignore[union-attr]
    assert RunPlan.of(settings.replace(**{"run.warm_start": None}), tmp_path).warm_start is None


def test_checked_settings_fit_an_env_without_splits_and_make_a_local_model_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # an env of the user's own, without task splits, in a module of the working directory
    (tmp_path / "my_plain_env.py").write_text(
        "from milegpo.envs import TextEnv\n"
        "class Plain(TextEnv):\n"
        "    def _reset(self, seed, options):\n"
        "        return 'start', {'task': 'go'}\n"
        "    def _step(self, action):\n"
        "        return 'end', 1.0, True, {'won': True}\n"
        "    def admissible_commands(self):\n"
        "        return ['go']\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = resolve_config("cpu-demo", overrides=["env.id=my_plain_env:Plain", "run.report_to=[]"])

    settings = checked_settings(config)
    assert settings.env.train_split is None and settings.eval.splits == [HELD_OUT_SPLIT]
    assert "has no task splits" in capsys.readouterr().out
    assert settings.env.module_dir == str(tmp_path)

    named = checked_settings(config.replace(**{"policy.model": "model"}), verbose=0)
    assert named.policy.model == str(model.resolve())
    # what the run folder's config.json holds is these settings, whole
    assert type(settings).from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
