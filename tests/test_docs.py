"""The documentation holds as written: its getting-started and custom-env code runs, every
public symbol has a docstring, and the README stays short with the commands a user runs first."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ["milegpo", "milegpo.credit", "milegpo.envs", "milegpo.algos", "milegpo.policies",
                  "milegpo.integrations.verl", "milegpo.config", "milegpo.config.run"]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


@pytest.mark.parametrize("page", ["getting-started.md"])
def test_the_page_code_runs_as_written(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page)
    assert blocks, f"docs/{page} has no python block"
    monkeypatch.chdir(tmp_path)  # the examples write runs/ into the working directory
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), {"__name__": "__docs__"})


def test_the_custom_env_page_runs_as_written_from_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's module in a new folder, its Python session beside it, then its commands from that folder
    through the installed ``milegpo`` console script (which does not put the working directory on sys.path):
    train, eval, play and export a user's env with no extra flags."""
    page = (ROOT / "docs" / "environments" / "custom.md").read_text()
    module, *session = python_blocks("environments/custom.md")
    assert module.startswith("# safe.py\n")
    (tmp_path / "safe.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for block in session:
            exec(compile(block, "docs/environments/custom.md", "exec"), {"__name__": "__docs__"})
    finally:
        sys.modules.pop("safe", None)
    [commands] = re.findall(r"```bash\n(.*?)```", page, re.S)
    # and the module:id form the page names beside module:ClassName
    commands += ("milegpo train env.id=safe:examples/Safe-v0 run.total_timesteps=200 --run-dir runs/safe-id\n"
                 "milegpo play safe:examples/Safe-v0 --seed 1\n")
    script = Path(sys.executable).with_name("milegpo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    for line in commands.strip().splitlines():
        assert line.startswith("milegpo "), line
        result = subprocess.run([str(script), *shlex.split(line)[1:]], cwd=tmp_path, env=env, input="1\n:q\n",
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
        if line.startswith("milegpo eval"):
            assert "held_out: success" in result.stdout
        if line.startswith("milegpo play"):
            assert "open the green safe." in result.stdout
    assert (tmp_path / "exported" / "safe" / "adapter_config.json").exists()


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_symbol_is_documented(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = []
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            if not (value.__doc__ or "").strip():
                missing.append(name)
            if inspect.isclass(value):
                missing += [f"{name}.{m}" for m, member in vars(value).items()
                            if not m.startswith("_") and inspect.isfunction(member)
                            and not (member.__doc__ or "").strip()
                            and not any(getattr(base, m, None) is not None and getattr(base, m).__doc__
                                        for base in value.__mro__[1:])]
    assert not missing, f"{module_name}: no docstring for {missing}"


def test_the_readme_headline_line_trains_as_written(tmp_path: Path) -> None:
    """``MileGPO("LLMPolicy", env).learn()`` with nothing else, offline on a CPU: it picks the demo's setting,
    says so in one line, and trains (the budget cut by $MILEGPO_TOTAL_TIMESTEPS, the one thing changed)."""
    readme = (ROOT / "README.md").read_text()
    headline = re.findall(r"```python\n(.*?)```", readme[readme.index("## The Python API"):], re.S)[0]
    assert 'MileGPO("LLMPolicy", env).learn()' in headline
    check = "\nprint('TRAINED', model.num_timesteps, model.iterations, model.policy.model_name)\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MILEGPO_TOTAL_TIMESTEPS": "64", "MILEGPO_CACHE": str(tmp_path),
           "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", headline + check], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("No model given")]
    assert len(said) == 1 and "cpu-demo setting" in said[0] and "policy_kwargs={'model':" in said[0]
    steps, iterations, model = result.stdout.split("TRAINED", 1)[1].split()
    assert int(steps) >= 64 and int(iterations) >= 1 and model.startswith(str(tmp_path / "tiny-models"))


def test_the_readme_is_short_and_starts_with_what_a_user_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    order = [readme.index(text) for text in ("pip install -e \".[dev]\"", "milegpo train\n", "python -m pytest -q")]
    assert order == sorted(order)
    assert "DESIGN" not in readme
