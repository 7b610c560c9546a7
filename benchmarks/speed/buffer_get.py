"""One epoch of ``TextRolloutBuffer.get()`` (every minibatch of a rollout) from 2k to 64k rows.

The buffer is filled as a rollout fills it (16 envs per task group, 50-step episodes of
choose-mode samples with ~300-token prompts), credit is computed, then the time of one
full pass over ``get()`` (minibatches of 256 steps) is the median of ``--repeats`` passes.
A linear ``get()`` keeps the time per row flat. Up to 8k rows it also times the previous
``get()``, which read the ``samples`` property (a new list of every row) once per row. Writes
``benchmarks/results/buffer_get.json``.

    python -m benchmarks.speed.buffer_get
"""

from __future__ import annotations

import os
import platform

import numpy as np

from benchmarks import harness
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.policies import ActionSample

HORIZON, GROUP = 50, 16


def filled_buffer(rows: int, seed: int = 0) -> TextRolloutBuffer:
    rng = np.random.default_rng(seed)
    envs = rows // HORIZON
    buffer = TextRolloutBuffer(envs, np.arange(envs) // GROUP)
    buffer.reset(task_seeds=list(range((envs + GROUP - 1) // GROUP)))
    prompt = rng.integers(0, 1000, 300).tolist()
    for env in range(envs):
        for t in range(HORIZON):
            candidates = [rng.integers(0, 1000, 4).tolist() for _ in range(5)]
            sample = ActionSample(text=f"go {t % 5}", prompt_ids=prompt, action_ids=candidates[0],
                                  candidate_ids=candidates, chosen=0, old_logprobs=np.zeros(1, np.float32), parsed=True)
            done = t == HORIZON - 1
            buffer.add(env, sample, f"task {env // GROUP} room {t % 7}", 0.0, done,
                       {"state_key": f"task {env // GROUP} room {(t + 1) % 7}", "won": False, "valid_action": True,
                        "score": 0.0})
    return buffer


def previous_epoch(buffer: TextRolloutBuffer, rng: np.random.Generator) -> None:
    """The previous get(): ``buffer.samples`` (a list of every row, built anew on each read) read per row."""
    from milegpo.algos.buffer import minibatch_rows, step_tokens

    n_rows = len(buffer.advantages)
    tokens = np.array([step_tokens(s) for s in buffer.samples], dtype=np.int64)
    units = np.array([len(buffer.samples[r].old_logprobs) for r in range(n_rows)], dtype=np.int64)
    for rows in minibatch_rows(rng, tokens, 256, None):
        _ = [buffer.samples[r] for r in rows], int(units[rows].sum())


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "buffer_get.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows_out = []
    for rows in (2_048, 4_096, 8_192, 16_384, 32_768, 65_536):
        buffer = filled_buffer(rows)
        buffer.compute_credit("grpo", None)
        times = []
        for repeat in range(args.repeats):
            with harness.Stopwatch() as clock:
                for _ in buffer.get(np.random.default_rng(repeat), batch_size=256):
                    pass
            times.append(clock.wall_s)
        seconds = float(np.median(times))
        rows_out.append({"rows": buffer.num_steps, "epoch_s": seconds, "us_per_row": 1e6 * seconds / buffer.num_steps})
        if rows <= 8_192:
            with harness.Stopwatch() as clock:
                previous_epoch(buffer, np.random.default_rng(0))
            rows_out[-1]["previous_epoch_s"] = clock.wall_s
        last = rows_out[-1]
        before = f", previous get() {last['previous_epoch_s']:.2f} s" if "previous_epoch_s" in last else ""
        print(f"{buffer.num_steps:6d} rows: {seconds * 1e3:8.1f} ms per epoch, {rows_out[-1]['us_per_row']:.2f} us/row"
              f"{before}", flush=True)
    steps = [r["rows"] for r in rows_out]
    slope = float(np.polyfit(np.log(steps), np.log([r["epoch_s"] for r in rows_out]), 1)[0])
    print(f"log-log slope: {slope:.3f}")
    result = {"benchmark": "buffer_get", "repeats": args.repeats, "batch_size": 256,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_1min": harness.load_1min()},
              "loglog_slope": slope, "results": rows_out}
    harness.write_results(args.out, result, markdown(result))


def markdown(result: dict) -> str:
    lines = [f"Median of {result['repeats']} epochs, minibatches of {result['batch_size']} steps, "
             f"{result['machine']['cpus']} cores (1-min load {result['machine']['load_1min']:.2f}).", "",
             "| rows | ms per epoch | µs per row | previous get(), s per epoch |", "|---:|---:|---:|---:|"]
    for row in result["results"]:
        before = f"{row['previous_epoch_s']:.2f}" if "previous_epoch_s" in row else "-"
        lines.append(f"| {row['rows']:,} | {1e3 * row['epoch_s']:.1f} | {row['us_per_row']:.2f} | {before} |")
    lines += ["", f"log-log slope of time against rows: {result['loglog_slope']:.2f}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
