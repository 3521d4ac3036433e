#!/usr/bin/python3
"""Where sparse bert-medium's training step goes, against dense bert-mini's: issue #12's end-to-end
row in seconds per step. One demo-like step (sequences of the demo corpus's lengths packed into 32 rows
of 128, forward + backward + LAMB) timed by build/train_step_bench for each model, interleaved
round by round (fresh processes), medians reported. The last column scales each step time by the
steps that model takes for dense bert-mini's non-embedding FLOPs (bench/experiments/sparse_learning.py's
accounting): the wall-clock of an equal-FLOPs run relative to dense bert-mini's, with learning
set aside. The floor row keeps one block per weight (s = 0.999): the encoder's linear layers
nearly free, what the rest of bert-medium's step costs on its own, counted at s = 0.9's steps
(the equal-FLOPs wall-clock no s = 0.9 kernel can go under).

    /usr/bin/python3 bench/experiments/sparse_step_cost.py [--rounds 5] [--precision bf16]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, histogram  # noqa: E402
from sparse_learning import flops_per_token  # noqa: E402

# name, preset, sparsity, block; the floor row is counted at s = 0.9's steps
CONFIGS = [("dense bert-mini", "mini", 0.0, 0),
           ("dense bert-medium", "medium", 0.0, 0),
           ("bert-medium s=0.9 16x16", "medium", 0.9, 16),
           ("bert-medium s=0.9 1x1", "medium", 0.9, 1),
           ("bert-medium s=0.999 16x16 (floor)", "medium", 0.999, 16)]


def demo_lengths(seed, rows=32, width=128):
    """Sequence lengths drawn (seeded) from the demo corpus's histogram (data/gcide_128.hist:
    p10 / p50 / p90 = 23 / 52 / 128) until they fill about rows x width slots."""
    hist = histogram("gcide_128")
    lengths, counts = [l for l, _ in hist], [c for _, c in hist]
    rng, out = random.Random(seed), []
    while sum(out) < 0.98 * rows * width:
        out += rng.choices(lengths, weights=counts)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after 1 warm-up)")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    lengths = demo_lengths(1)
    model, isa = cpu()
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; {a.precision}; one step of "
          f"{len(lengths)} sequences, {sum(lengths)} tokens, packed into rows of 128; "
          f"forward + backward + LAMB; median of {a.rounds} interleaved rounds", flush=True)
    times = {name: [] for name, _, _, _ in CONFIGS}
    shares = {name: [] for name, _, _, _ in CONFIGS}
    for r in range(a.rounds):
        for name, preset, s, b in CONFIGS:
            cmd = [os.path.join(a.build, "train_step_bench"), "--preset", preset, "--lengths",
                   ",".join(map(str, lengths)), "--max-seq-len", "128", "--steps", str(a.steps),
                   "--warmup", "1", "--optimizer-step", "--precision", a.precision]
            if s:
                cmd += ["--sparsity", str(s), "--block", str(b)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            times[name].append(d["step_seconds"])
            shares[name].append(d["gemm_share"])
        print(f"  round {r + 1}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()),
              flush=True)
    base = statistics.median(times["dense bert-mini"])
    dense_fpt = flops_per_token("mini")
    print("\n| model | step s (median) | vs dense bert-mini's step | GEMM share | "
          "steps for equal FLOPs | equal-FLOPs wall-clock vs dense bert-mini |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, preset, s, b in CONFIGS:
        t = statistics.median(times[name])
        steps = dense_fpt / flops_per_token(preset, b, min(s, 0.9))
        print(f"| {name} | {t:.3f} | {t / base:.2f}x | {statistics.median(shares[name]):.2f} | "
              f"{steps:.2f}x | {t * steps / base:.2f}x |")


if __name__ == "__main__":
    main()
