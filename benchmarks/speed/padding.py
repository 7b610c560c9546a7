"""Padding of generate mode's scoring passes (the update's forward and the log-prob recompute).

A generate-mode step is a prompt and a reply. ``score_rows`` scores a batch of them in
length-sorted chunks of ``batch_tokens`` padded tokens, either as left-padded prompts next to
right-padded replies (every row as long as the longest prompt plus the longest reply of its
chunk) or as ``[prompt | reply]`` rows right-padded to the longest row. This script counts the
tokens each path feeds the model (a forward hook on the real transformers model) against the
real tokens, and times both paths on the same rows, interleaved.

Shapes: the paper's setting has prompts of about 360 tokens (task, last 2 steps, admissible
commands) and replies of about 278 (``<think>`` text, capped at 512). Without recorded
shapes here, rows are drawn with prompts uniform in [200, 520] and replies normal(278, 120)
clipped to [16, 512] (seeded); ``--batch-tokens`` is the GPU chunk (16,384).

    python -m benchmarks.speed.padding            # writes benchmarks/results/padding.json
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks import harness
from milegpo.policies import tiny_model
from milegpo.policies.scoring import score_rows


def paper_shapes(n: int, seed: int, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    prompt_lengths = rng.integers(200, 521, n)
    reply_lengths = np.clip(rng.normal(278, 120, n), 16, 512).astype(int)
    prompts = [rng.integers(4, vocab, p).tolist() for p in prompt_lengths]
    replies = [rng.integers(4, vocab, r).tolist() for r in reply_lengths]
    return prompts, replies


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "padding.json")
    parser.add_argument("--rows", type=int, default=256, help="steps in the scored batch (one minibatch)")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import tempfile

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        words = [f"w{i}" for i in range(2000)]
        path = tiny_model([" ".join(words)], tmp, hidden_size=args.hidden, num_layers=args.layers, num_heads=4)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts, replies = paper_shapes(args.rows, 0, model.config.vocab_size)
    real = sum(len(p) + len(r) for p, r in zip(prompts, replies))
    fed = {"tokens": 0}
    def count(_module, _args, kwargs):
        fed["tokens"] += kwargs["input_ids"].numel()

    model.model.register_forward_pre_hook(count, with_kwargs=True)
    result = {"rows": args.rows, "real_tokens": real, "batch_tokens": args.batch_tokens,
              "prompt_mean": float(np.mean([len(p) for p in prompts])),
              "reply_mean": float(np.mean([len(r) for r in replies])),
              "model": {"hidden": args.hidden, "layers": args.layers, "threads": args.threads}, "paths": {}}
    logps = {}
    paths = (("left-padded prompts + right-padded replies", False), ("[prompt | reply] right-padded", True))
    for path_name, right in paths:
        fed["tokens"] = 0
        with torch.no_grad():
            logps[right], _ = score_rows(model, prompts, replies, 0, 1.0, args.batch_tokens, right_padded=right)
        result["paths"][path_name] = {"right_padded": right, "fed_tokens": fed["tokens"],
                                      "padded_per_real": fed["tokens"] / real, "seconds": []}
    gap = max(float((a - b).abs().max()) for a, b in zip(logps[False], logps[True]))
    result["max_logprob_gap"] = gap
    for _ in range(args.repeats):  # interleaved, so load changes hit both paths alike
        for entry in result["paths"].values():
            with harness.Stopwatch() as clock, torch.no_grad():
                score_rows(model, prompts, replies, 0, 1.0, args.batch_tokens, right_padded=entry["right_padded"])
            entry["seconds"].append(clock.wall_s)
    result["load_1min"] = harness.load_1min()
    (old, new) = result["paths"].values()
    result["time_ratio_median"] = float(np.median(old["seconds"]) / np.median(new["seconds"]))
    harness.write_json(args.out, result)
    for name, entry in result["paths"].items():
        print(f"{name}: {entry['padded_per_real']:.2f} fed/real tokens, median {np.median(entry['seconds']):.2f} s")
    print(f"time ratio {result['time_ratio_median']:.2f}x, max log-prob gap {gap:.2e}")


if __name__ == "__main__":
    main()
