#!/usr/bin/python3
"""Learning parity of the precisions: bert-mini pre-trained on the demo corpus once per setting
with the same seed, data order and dropout draws, differing only in precision and master
weights; held-out MLM accuracy every --eval-every steps, the largest gap, and the curves in one
SVG.

    /usr/bin/python3 bench/experiments/precision_parity.py [--steps 1000] [--packs-per-step 32]
        [--runs fp32,bf16,bf16/bf16,bf16/bf16-rn] [--parallel 2] [--seeds 1,2,3]

A run is PRECISION or PRECISION/MASTERS (--precision, --master-weights). --parallel N trains N
runs at a time, each on cores/N threads (the runs do not depend on the thread count). With
--seeds, every run is made once per seed and a last table gives each comparison's gap per seed
and its mean over the seeds.

Needs build/packbert and the demo data (made with `packbert demo --max-steps 0` when absent).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, demo_data  # noqa: E402
from time_to_train import COLORS, evals_of, svg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="fp32,bf16,bf16/bf16,bf16/bf16-rn")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0,
                    help="OpenMP threads a run (default: the cores / --parallel)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep a run whose workdir already holds its final evaluation")
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--packs-per-step", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", default="",
                    help="comma list of seeds: every run once per seed, into WORKDIR/seedN, and "
                    "a table across the seeds (default: --seed alone, into WORKDIR)")
    ap.add_argument("--data", default=os.path.join(ROOT, "out", "demo"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "out", "precision_parity"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "precision_parity.svg"))
    a = ap.parse_args()
    exe, seqs, packs = demo_data(a.build, a.data)
    model, isa = cpu()
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [a.seed]
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; bert-{a.preset}, LAMB lr {a.lr}, "
          f"warmup {a.warmup}, {a.packs_per_step} packs a step, {a.steps} steps, seed "
          f"{', '.join(map(str, seeds))}; held-out MLM accuracy every {a.eval_every} steps",
          flush=True)
    specs = a.runs.split(",")
    threads = a.threads or max(1, (os.cpu_count() or 1) // a.parallel)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))

    def done(out):
        path = os.path.join(out, "metrics.jsonl")
        return os.path.exists(path) and any(e[0] == a.steps for e in evals_of(out))

    def start(seed, spec):
        precision, _, masters = spec.partition("/")
        out = os.path.join(a.workdir, f"seed{seed}" if a.seeds else "",
                           spec.replace("/", "_masters_"))
        if a.reuse and done(out):
            return out, None
        cmd = [exe, "pretrain", "--data", seqs, "--packs", packs, "--preset", a.preset,
               "--steps", str(a.steps), "--lr", str(a.lr), "--warmup", str(a.warmup),
               "--batch-rows", str(a.packs_per_step), "--eval-every", str(a.eval_every),
               "--eval-fraction", "0.005", "--seed", str(seed), "--precision", precision,
               "--master-weights", masters or "fp32", "--out", out, "--overwrite"]
        return out, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    jobs = [(seed, spec) for seed in seeds for spec in specs]
    by_seed = {seed: [] for seed in seeds}
    for i in range(0, len(jobs), a.parallel):
        batch = [(seed, spec, *start(seed, spec)) for seed, spec in jobs[i:i + a.parallel]]
        for seed, spec, out, proc in batch:
            if proc and proc.wait() != 0:
                sys.exit(f"{spec}, seed {seed}: packbert pretrain failed (exit "
                         f"{proc.returncode}); see {out}")
            ev = evals_of(out)
            name = spec if "/" not in spec else spec.replace("/", ", masters ")
            by_seed[seed].append({"name": name, "kind": spec, "seed": seed, "evals": ev})
            print(f"  {name}, seed {seed}: final accuracy {ev[-1][2]:.4f} after {ev[-1][0]} "
                  f"steps, {ev[-1][1]:.0f} s training", flush=True)
    for seed, runs in by_seed.items():
        if len(seeds) > 1:
            print(f"\n### seed {seed}")
        report(runs)
    if len(seeds) > 1:
        across(by_seed, specs)
    palette = {"fp32": "#1f77b4", "bf16": "#d62728", "bf16/bf16": "#2ca02c",
               "bf16/bf16-rn": "#ff7f0e", "fp16": "#9467bd"}
    plotted = []
    for seed, runs in by_seed.items():
        for r in runs:
            COLORS.setdefault(r["kind"], palette.get(r["kind"], "black"))
            plotted.append(dict(r, name=r["name"] + (f", seed {seed}" if len(seeds) > 1 else "")))
    svg(plotted, 0.25, a.plot, x_field=0, x_label="optimizer steps",
        title=f"Held-out MLM accuracy, bert-{a.preset} on the demo corpus, by precision")
    print(json.dumps(plotted))


def report(runs):
    """One seed: accuracy at every evaluation, the largest gap to the first run, final gaps."""
    base = runs[0]["evals"]
    print("\n| step | " + " | ".join(r["name"] for r in runs) + " | largest gap to " +
          runs[0]["name"] + " |")
    print("|---:|" + "---:|" * len(runs) + "---:|")
    for i, e in enumerate(base):
        accs = [r["evals"][i][2] for r in runs]
        print(f"| {e[0]} | " + " | ".join(f"{x:.4f}" for x in accs) +
              f" | {max(abs(x - accs[0]) for x in accs):.4f} |")
    print("\n| run | final accuracy | gap to " + runs[0]["name"] + " | training s |")
    print("|---|---:|---:|---:|")
    for r in runs:
        print(f"| {r['name']} | {r['evals'][-1][2]:.4f} | "
              f"{r['evals'][-1][2] - base[-1][2]:+.4f} | {r['evals'][-1][1]:.0f} |")


def across(by_seed, specs):
    """Final accuracies across seeds, each run's gap to the first run and, for bf16 masters, to
    the same precision with fp32 masters (the comparisons issue #10 asks for), per seed and as
    the mean over the seeds."""
    seeds = list(by_seed)
    final = {(seed, r["kind"]): r["evals"][-1][2] for seed, runs in by_seed.items() for r in runs}
    print("\n### across seeds: final held-out MLM accuracy\n")
    print("| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
    print("|---|" + "---:|" * (len(seeds) + 1))
    for spec in specs:
        xs = [final[(s, spec)] for s in seeds]
        print(f"| {spec} | " + " | ".join(f"{x:.4f}" for x in xs) +
              f" | {statistics.mean(xs):.4f} |")
    pairs = [(spec, specs[0]) for spec in specs[1:]]
    pairs += [(spec, spec.partition("/")[0]) for spec in specs
              if "/" in spec and spec.partition("/")[0] in specs and
              spec.partition("/")[0] != specs[0]]
    print("\n| gap | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | largest |")
    print("|---|" + "---:|" * (len(seeds) + 2))
    for spec, ref in pairs:
        gaps = [final[(s, spec)] - final[(s, ref)] for s in seeds]
        print(f"| {spec} - {ref} | " + " | ".join(f"{g:+.4f}" for g in gaps) +
              f" | {statistics.mean(gaps):+.4f} | {max(gaps, key=abs):+.4f} |")


if __name__ == "__main__":
    main()
