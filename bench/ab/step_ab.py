#!/usr/bin/python3
"""One training step (forward + backward) from two builds of train_step_bench, interleaved.

    /usr/bin/python3 bench/ab/step_ab.py --a build --b /tmp/old/build [--rounds 5] [--case full|wiki]
        [--precision fp32|bf16|fp16] [--layers N] [--optimizer-step]

For checking what a change did to the step: the same batch, fresh processes, runs alternating
a, b, a, b, ...; prints each side's median step time, model GFLOP/s as a share of the matmul
rate measured in the same process (sgemm; oneDNN's bf16 matmul under bf16), and the ratio
b / a.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import cpu, wiki_lengths  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build directory A (e.g. this commit)")
    ap.add_argument("--b", required=True, help="build directory B (e.g. the previous commit)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--case", default="full")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--layers", type=int, default=12, help="encoder layers of BERT-base")
    ap.add_argument("--optimizer-step", action="store_true",
                    help="time a LAMB update after each backward too")
    a = ap.parse_args()
    model, isa = cpu()
    lengths = wiki_lengths(8, 11) if a.case == "wiki" else [512] * 4
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; BERT-base, {a.layers} layers, "
          f"{a.precision}, case {a.case}" + (", with the LAMB update" if a.optimizer_step else ""))
    rate = "bf16_matmul_gflops" if a.precision == "bf16" else "sgemm_gflops"
    runs = {"a": [], "b": []}
    for _ in range(a.rounds):
        for side in ("a", "b"):
            cmd = [os.path.join(getattr(a, side), "train_step_bench"), "--lengths",
                   ",".join(map(str, lengths)), "--steps", "1", "--warmup", "1", "--precision",
                   a.precision, "--layers", str(a.layers)] + (
                       ["--optimizer-step"] if a.optimizer_step else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[side].append(json.loads(out.strip().splitlines()[-1]))
    print(f"| build | step s (median) | model GFLOP/s | of {rate.split('_gflops')[0]} rate |")
    print("|---|---:|---:|---:|")
    med = {}
    for side in ("a", "b"):
        r = runs[side]
        med[side] = statistics.median(x["step_seconds"] for x in r)
        g = statistics.median(x["model_gflops"] for x in r)
        s = statistics.median(x["model_gflops"] / x[rate] for x in r)
        print(f"| {getattr(a, side)} | {med[side]:.3f} | {g:.1f} | {100 * s:.0f}% |")
    print(f"\nB / A step time: {med['b'] / med['a']:.3f}x ({a.rounds} interleaved runs each)")


if __name__ == "__main__":
    main()
