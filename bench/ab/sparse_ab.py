#!/usr/bin/python3
"""Block-sparse kernels from two builds of sparse_bench, interleaved (or one build alone).

    /usr/bin/python3 bench/ab/sparse_ab.py --a build [--b /tmp/old/build] [--rounds 6]
        [--blocks 16,8,4,1] [--runs 7]

For checking what a change did to the sparse kernels on a shared, noisy host: fresh processes
alternating a, b, a, b, ... so both sides see the same load. Each sparse_bench run times the
dense and the sparse layer interleaved and reports the medians of --runs; this prints, per
block size, every round's speedup over the dense GEMMs, each side's median, and (with --b) the
ratio of the medians a / b.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import cpu  # noqa: E402

TARGETS = {16: 6.0, 8: 5.0, 4: 4.0, 1: 2.5}  # issue #12's must-reach speedups


def run(build, blocks, runs):
    cmd = [os.path.join(build, "sparse_bench"), "--runs", str(runs), "--blocks", blocks]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {d["block"]: d for d in map(json.loads, out.splitlines())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build directory A (e.g. this commit)")
    ap.add_argument("--b", help="build directory B (e.g. the previous commit); omit for A alone")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--blocks", default="16,8,4,1")
    ap.add_argument("--runs", type=int, default=7, help="sparse_bench --runs")
    a = ap.parse_args()
    sides = ["a", "b"] if a.b else ["a"]
    model, isa = cpu()
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; sparse_bench --runs {a.runs}, "
          f"{a.rounds} rounds{', a and b alternating' if a.b else ''}")
    got = {side: [] for side in sides}
    for r in range(a.rounds):
        for side in sides:
            got[side].append(run(getattr(a, side), a.blocks, a.runs))
        print(f"  round {r + 1}: " + "  ".join(
            f"{side} " + " ".join(f"{b}:{d['speedup']:.2f}" for b, d in got[side][-1].items())
            for side in sides), flush=True)
    blocks = list(got["a"][0])
    head = "| block | " + " | ".join(f"{s} speedup, each round | {s} median" for s in sides)
    head += " | a / b |" if a.b else " |"
    print()
    print(head + " must reach |")
    print("|---:|" + "---|---:|" * len(sides) + ("---:|" if a.b else "") + "---:|")
    for b in blocks:
        cells, medians = [], {}
        for side in sides:
            speedups = [rnd[b]["speedup"] for rnd in got[side]]
            medians[side] = statistics.median(speedups)
            cells += [" ".join(f"{x:.2f}" for x in speedups), f"{medians[side]:.2f}x"]
        if a.b:
            cells.append(f"{medians['a'] / medians['b']:.3f}")
        target = TARGETS.get(b)
        met = "" if target is None else (" (met)" if medians["a"] >= target else " (missed)")
        print(f"| {b} × {b} | " + " | ".join(cells) + f" | {target}x{met} |")


if __name__ == "__main__":
    main()
