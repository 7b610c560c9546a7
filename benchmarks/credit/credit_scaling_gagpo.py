"""GAGPO's cost against the batch size, beside GiGPO and GraphGPO on the same batches.

The batches are ``credit_scaling.py``'s (random house walks: ``house`` with recurring
states, ``distinct`` with the step index in every state); the timing is its median of
``--repeats`` calls after a warm-up. Reports microseconds per step and the log-log slope
of time against steps (1 = linear). Writes ``benchmarks/results/credit_scaling_gagpo.json``
after every size and ``credit_scaling_gagpo.md`` at the end.

    python -m benchmarks.credit.credit_scaling_gagpo                        # ~1k .. ~240k steps, a few minutes
    python -m benchmarks.credit.credit_scaling_gagpo --max-steps 1100000    # up to ~1M steps
"""

from __future__ import annotations

from benchmarks import harness
from benchmarks.credit.credit_scaling import SIZES, house_batch, slope
from milegpo.credit import compute_credit

METHODS = ("gigpo", "graphgpo", "gagpo")


def measure(kind: str, size: tuple[int, int, int], repeats: int) -> dict:
    """Steps of one batch and the median seconds of each method on it."""
    batch = house_batch(*size, distinct=kind == "distinct")
    seconds = {m: harness.timed(lambda m=m: compute_credit(m, batch), repeats)[0] for m in METHODS}
    return {"kind": kind, "size": list(size), "steps": batch.num_steps, "seconds": seconds}


def markdown(rows: list[dict], load: float) -> str:
    """The per-step table and the slopes per batch kind."""
    lines = ["### GAGPO's cost against the batch size (µs per step, median of calls)", "",
             f"1-min load at start {load:.2f}.", "",
             "| batch | steps | " + " | ".join(METHODS) + " |", "|---|---:|" + "---:|" * len(METHODS)]
    for r in rows:
        label = f"{r['kind']} {'x'.join(map(str, r['size']))}"
        lines.append(f"| {label} | {r['steps']:,} | "
                     + " | ".join(f"{1e6 * r['seconds'][m] / r['steps']:.2f}" for m in METHODS) + " |")
    lines.append("")
    for kind in ("house", "distinct"):
        mine = [r for r in rows if r["kind"] == kind]
        if len(mine) > 1:
            lines.append(f"log-log slope, {kind}: " + ", ".join(
                f"{m} {slope([r['steps'] for r in mine], [r['seconds'][m] for r in mine]):.3f}" for m in METHODS))
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "credit_scaling_gagpo",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--max-steps", type=int, default=250_000, help="skip sizes above about this many steps")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out = args.out
    load = harness.load_1min()
    rows: list[dict] = []
    for kind in ("house", "distinct"):
        for size in SIZES:
            if size[0] * size[1] * size[2] * 0.95 > args.max_steps:
                continue
            rows.append(measure(kind, size, args.repeats))
            harness.write_json(out.with_suffix(".json"), {"load": load, "rows": rows})
            print(rows[-1], flush=True)
    harness.write_text(out.with_suffix(".md"), markdown(rows, load))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
