#!/usr/bin/python3
"""The demo's step cost, packed and padded, from two builds of packbert, interleaved.

    /usr/bin/python3 bench/ab/demo_step_ab.py --a build --b /tmp/old/build [--rounds 3] [--steps 60]
    /usr/bin/python3 bench/ab/demo_step_ab.py --a build --b build --b-args "--master-weights bf16"
    /usr/bin/python3 bench/ab/demo_step_ab.py --a build --preset small

`packbert demo`'s ratio is the ratio of its packed and padded step costs (both runs take the
same steps), so a change to what both steps share (the optimizer, the MLM head) shows here in a
few minutes rather than a 9-minute demo. Each round runs, in order, A packed, A padded, B packed,
B padded: `packbert pretrain` on the demo corpus with the demo's settings (bert-mini, LAMB, 16
packs a step; padded: the same packs one sequence per row with computed padding) for --steps
steps, and takes the median step time (from metrics.jsonl) after the first 20. Prints each
side's median over rounds of those medians and its packed / padded ratio. --a-args / --b-args
add pretrain flags to one side's runs, so one build can be compared against itself under two
settings. Without --b, A alone (its packed / padded ratio); --preset runs another model size
than the demo's bert-mini.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import cpu, demo_data  # noqa: E402


def step_ms(exe, seqs, packs, padded, steps, precision, preset, out, extra):
    """Median seconds of the steps after the 20th of one run, in ms."""
    cmd = [exe, "pretrain", "--data", seqs, "--packs", packs, "--out", out, "--overwrite",
           "--preset", preset, "--optimizer", "lamb", "--batch-rows", "16", "--warmup", "10",
           "--steps", str(steps), "--eval-fraction", "0.005", "--precision", precision, *extra]
    if padded:
        cmd += ["--one-per-row", "--compute-padding"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    secs = [r["seconds"] for r in rows if r.get("type") == "step" and r["step"] > 20]
    return 1000 * statistics.median(secs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="build directory A (e.g. this commit)")
    ap.add_argument("--b", default="", help="build directory B (e.g. the previous commit); "
                    "without it, A alone")
    ap.add_argument("--a-args", default="", help="extra pretrain flags for A's runs")
    ap.add_argument("--b-args", default="", help="extra pretrain flags for B's runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="steps a run (the first 20 not timed)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--preset", default="mini", help="model size (the demo's: mini)")
    ap.add_argument("--data", default="out/demo", help="where the demo corpus is (made if absent)")
    a = ap.parse_args()
    if a.steps <= 20:
        sys.exit("demo_step_ab: --steps must be above 20 (the first 20 are not timed)")
    model, isa = cpu()
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; bert-{a.preset}, {a.precision}, "
          f"16 packs a step, {a.steps} steps a run, {a.rounds} rounds")
    sides = "ab" if a.b else "a"
    for side in sides:
        print(f"{side.upper()}: {getattr(a, side)} {getattr(a, side + '_args')}".rstrip())
    _, seqs, packs = demo_data(a.a, a.data)
    times = {(side, padded): [] for side in sides for padded in (False, True)}
    work = tempfile.mkdtemp(prefix="demo_step_ab.")
    try:
        for r in range(a.rounds):
            for side in sides:
                exe = os.path.join(getattr(a, side), "packbert")
                for padded in (False, True):
                    ms = step_ms(exe, seqs, packs, padded, a.steps, a.precision, a.preset,
                                 os.path.join(work, f"{side}{int(padded)}"),
                                 shlex.split(getattr(a, side + "_args")))
                    times[(side, padded)].append(ms)
                    print(f"  round {r + 1}: {side.upper()} {'padded' if padded else 'packed'} "
                          f"{ms:.1f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'build':<6} {'packed ms':>10} {'padded ms':>10} {'packed / padded':>16}")
    for side in sides:
        p = statistics.median(times[(side, False)])
        q = statistics.median(times[(side, True)])
        print(f"{side.upper():<6} {p:>10.1f} {q:>10.1f} {p / q:>16.3f}")


if __name__ == "__main__":
    main()
