"""Adapter overhead: env steps/s through milegpo's adapters vs the raw engines.

For each engine the same episodes (same seeds, same actions) are played three ways:

- ``raw``: the engine's own Python API (``textworld_express.TextWorldExpressEnv``;
  ``textworld.gym`` with the same ``EnvInfos`` the adapter requests);
- ``adapter``: the milegpo ``TextEnv`` (``milegpo/TWX-<game>-v0``, ``milegpo/TextWorld-v0``);
- ``bare`` (TextWorld-Express only): the JVM calls alone (``generateNewGameJSON`` /
  ``stepJSON`` + JSON parsing), the floor any Python wrapper pays.

The actions are recorded once from a seeded random policy over the admissible
commands (horizon 30). Timings include the resets; each variant runs ``--rounds``
times interleaved with the others and the best round counts (the machine is shared).
The figure is ``ratio = adapter steps/s / raw steps/s`` (target >= 0.8).

    python -m benchmarks.speed.adapter_overhead            # writes benchmarks/results/adapter_overhead.json
"""

from __future__ import annotations

import json
import platform
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks import harness
from milegpo.envs import make_env
from milegpo.envs.textworld_express import _java_gateway

HORIZON = 30
TWX_SETTINGS = {
    "coin": {"numLocations": 3, "numDistractorItems": 0, "includeDoors": 0},
    "cookingworld": {"numLocations": 3, "numIngredients": 2, "numDistractorItems": 2, "includeDoors": 0},
    "twc": {},
    "mapreader": {},
}


def steps_per_second(play: Callable[[], int]) -> float:
    """Steps per second of one call of ``play`` (which returns its step count)."""
    with harness.Stopwatch() as clock:
        steps = play()
    return steps / clock.wall_s


def random_episodes(reset: Callable[[int], list[str]], step: Callable[[str], tuple[list[str], bool]],
                    n_episodes: int, rng: random.Random) -> list[list[str]]:
    """Action lists of a uniform random policy over the admissible commands, ending at done or the horizon."""
    episodes = []
    for seed in range(n_episodes):
        commands, actions = reset(seed), []
        for _ in range(HORIZON):
            actions.append(rng.choice(sorted(commands)))
            commands, done = step(actions[-1])
            if done:
                break
        episodes.append(actions)
    return episodes


def bench_twx(game: str, params: dict, n_episodes: int, rounds: int) -> dict:
    from textworld_express import TextWorldExpressEnv as UpstreamEnv

    from milegpo.envs.textworld_express import game_param_string

    adapter = make_env(f"milegpo/TWX-{game}-v0", game_params=params, max_episode_steps=HORIZON)
    upstream = UpstreamEnv(envStepLimit=HORIZON + 1)
    upstream.load(game, game_param_string(params))
    bare = _java_gateway().jvm.textworldexpress.runtime.PythonInterface()
    bare.load(game, game_param_string(params))
    seeds = [adapter.engine_seed(s) for s in range(n_episodes)]

    def up_reset(s: int) -> list[str]:
        return upstream.reset(seed=seeds[s], gameFold="train")[1]["validActions"]

    def up_step(action: str) -> tuple[list[str], bool]:
        _, _, done, info = upstream.step(action)
        return info["validActions"], done

    episodes = random_episodes(up_reset, up_step, n_episodes, random.Random(0))

    def play_raw() -> int:
        for s, actions in enumerate(episodes):
            upstream.reset(seed=seeds[s], gameFold="train")
            for action in actions:
                upstream.step(action)
        return sum(map(len, episodes))

    def play_adapter() -> int:
        for s, actions in enumerate(episodes):
            adapter.reset(seed=s)
            for action in actions:
                adapter.step(action)
        return sum(map(len, episodes))

    def play_bare() -> int:
        for s, actions in enumerate(episodes):
            json.loads(bare.generateNewGameJSON(seeds[s], "train", False))
            for action in actions:
                json.loads(bare.stepJSON(action))
        return sum(map(len, episodes))

    rates = {"raw": [], "adapter": [], "bare": []}
    for _ in range(rounds):  # interleave the variants so machine load hits them alike
        for name, play in (("raw", play_raw), ("adapter", play_adapter), ("bare", play_bare)):
            rates[name].append(steps_per_second(play))
    upstream.close()
    result = {name: max(values) for name, values in rates.items()}
    return {"engine": "textworld-express", "game": game, "game_params": game_param_string(params),
            "episodes": n_episodes, "steps": sum(map(len, episodes)),
            "raw_steps_per_s": round(result["raw"], 1), "adapter_steps_per_s": round(result["adapter"], 1),
            "bare_jvm_steps_per_s": round(result["bare"], 1),
            "ratio": round(result["adapter"] / result["raw"], 3),
            "ratio_vs_bare_jvm": round(result["adapter"] / result["bare"], 3)}


def make_tw_game(directory: Path) -> Path:
    """The tests' tw-make game: 3 rooms, 5 objects, a 3-step quest, seed 7."""
    path = directory / "game.z8"
    tw_make = Path(sys.executable).parent / "tw-make"
    subprocess.run([sys.executable, str(tw_make), "custom", "--world-size", "3", "--nb-objects", "5",
                    "--quest-length", "3", "--seed", "7", "--output", str(path), "--silent", "-f"], check=True)
    return path


def bench_textworld(n_episodes: int, rounds: int) -> dict:
    import warnings

    import textworld
    import textworld.gym

    warnings.filterwarnings("ignore", message=".*is not fully supported")
    with tempfile.TemporaryDirectory() as directory:
        game = make_tw_game(Path(directory))
        adapter = make_env("milegpo/TextWorld-v0", game_files=[game], max_episode_steps=HORIZON)
        request = textworld.EnvInfos(admissible_commands=True, facts=True, objective=True, score=True, won=True,
                                     lost=True)
        raw = textworld.gym.make(textworld.gym.register_game(str(game), request, max_episode_steps=None))

        def raw_reset(_: int) -> list[str]:
            return raw.reset()[1]["admissible_commands"]

        def raw_step(action: str) -> tuple[list[str], bool]:
            _, _, done, info = raw.step(action)
            return info["admissible_commands"], done

        episodes = random_episodes(raw_reset, raw_step, n_episodes, random.Random(0))

        def play_raw() -> int:
            for actions in episodes:
                raw.reset()
                for action in actions:
                    raw.step(action)
            return sum(map(len, episodes))

        def play_adapter() -> int:
            for actions in episodes:
                adapter.reset(seed=0)
                for action in actions:
                    adapter.step(action)
            return sum(map(len, episodes))

        rates = {"raw": [], "adapter": []}
        for _ in range(rounds):
            for name, play in (("raw", play_raw), ("adapter", play_adapter)):
                rates[name].append(steps_per_second(play))
        raw.close()
        adapter.close()
    result = {name: max(values) for name, values in rates.items()}
    return {"engine": "textworld", "game": "tw-make custom --world-size 3 --nb-objects 5 --quest-length 3 --seed 7",
            "episodes": n_episodes, "steps": sum(map(len, episodes)),
            "raw_steps_per_s": round(result["raw"], 1), "adapter_steps_per_s": round(result["adapter"], 1),
            "ratio": round(result["adapter"] / result["raw"], 3)}


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "adapter_overhead.json")
    parser.add_argument("--twx-episodes", type=int, default=100)
    parser.add_argument("--tw-episodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    results = [bench_twx(game, params, args.twx_episodes, args.rounds) for game, params in TWX_SETTINGS.items()]
    results.append(bench_textworld(args.tw_episodes, args.rounds))
    for row in results:
        print(f"{row['engine']:18s} {row['game'][:40]:40s} raw {row['raw_steps_per_s']:8.1f}  "
              f"adapter {row['adapter_steps_per_s']:8.1f} steps/s  ratio {row['ratio']:.3f}")
    harness.write_json(args.out, {"horizon": HORIZON, "rounds": args.rounds, "python": platform.python_version(),
                                  "machine": platform.machine(), "load_1min": harness.load_1min(), "results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
