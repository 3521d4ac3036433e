#!/usr/bin/python3
"""Data parallelism on one machine: processes against threads, ZeRO-1, and the all-reduce's cost.

    /usr/bin/python3 bench/ab/dist_bench.py [--rounds 3] [--parts dp,memory,allreduce]

dp: BERT-base training steps of packbert's one loop (forward, backward, gradient reduction,
clipping, LAMB) on --sequences (16) lengths drawn from data/wikipedia_512.hist, packed into rows of
512, as 1 process x 2 threads, 2 processes x 1 thread (mpirun, all-reduce overlapped with
backward) and 2 processes x 1 thread with --zero 1; interleaved rounds, medians. "exposed comm"
is the time a step waits on collectives after backward (bench/step/dist_step_bench.cpp).
memory: the optimizer state (LAMB's two moments) each process holds, with and without --zero 1,
at 2 and 4 processes (BERT-base).
allreduce: the gradient all-reduce of 4 B to 256 MiB between 2 processes over shared memory
(Open MPI's vader) and over loopback TCP; the alpha-beta fit docs/SCALING.md uses.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, wiki_lengths  # noqa: E402

MPI = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def run(cmd, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]


def mpirun(np, threads, args, mca=()):
    return MPI + list(mca) + ["-x", f"OMP_NUM_THREADS={threads}", "-np", str(np)] + args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--parts", default="dp,memory,allreduce")
    ap.add_argument("--sequences", type=int, default=16, help="Wikipedia lengths in a step")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layers", type=int, default=0, help="encoder layers (0: BERT-base's 12)")
    a = ap.parse_args()
    bench = os.path.join(a.build, "dist_step_bench")
    model, isa = cpu()
    layers = ["--layers", str(a.layers)] if a.layers else []
    print(f"CPU: {model}, {os.cpu_count()} cores, ISA {isa}. BERT-base"
          f"{f' with {a.layers} layers' if a.layers else ''}, fp32.\n")
    parts = a.parts.split(",")

    if "dp" in parts:
        lengths = ",".join(map(str, wiki_lengths(a.sequences, 5)))
        step = [bench, "--lengths", lengths, "--steps", str(a.steps), "--warmup", "1"] + layers
        configs = {"1 process x 2 threads": lambda: run(step, 2)[0],
                   "2 processes x 1 thread": lambda: run(mpirun(2, 1, step), 1)[0],
                   "2 processes x 1 thread, --zero 1": lambda: run(
                       mpirun(2, 1, step + ["--zero", "1"]), 1)[0]}
        runs = {k: [] for k in configs}
        for r in range(a.rounds):
            for k, f in configs.items():
                runs[k].append(f())
            print(f"round {r}: " + ", ".join(
                f"{k}: {v[-1]['real_tokens_per_s']:.0f} tok/s" for k, v in runs.items()),
                file=sys.stderr)
        med = lambda k, f: statistics.median(x[f] for x in runs[k])
        base = med("1 process x 2 threads", "real_tokens_per_s")
        dp = med("2 processes x 1 thread", "real_tokens_per_s")
        print(f"Whole step: {runs['2 processes x 1 thread'][0]['real_tokens']} real tokens in "
              f"{runs['2 processes x 1 thread'][0]['rows']} rows; medians of {a.rounds} "
              f"interleaved rounds x {a.steps} steps.\n")
        print("| configuration | tokens/s | vs 1 x 2 threads | vs plain 2 processes | step s | "
              "exposed comm s | comm share | imbalance |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for k in configs:
            t = med(k, "real_tokens_per_s")
            print(f"| {k} | {t:.0f} | {t / base:.3f}x | "
                  f"{'' if k.startswith('1') else f'{t / dp:.3f}x'} | {med(k, 'step_seconds'):.2f} | "
                  f"{med(k, 'comm_seconds'):.3f} | {100 * med(k, 'comm_share'):.1f}% | "
                  f"{med(k, 'imbalance'):.3f} |")
        print()

    if "memory" in parts:
        step = [bench, "--lengths", "128,128,128,128", "--steps", "1", "--warmup", "0"]
        print("| processes | optimizer state per process, plain | with --zero 1 | share of "
              "unsharded | bound 1/N + 5% |")
        print("|---:|---:|---:|---:|---:|")
        for n in (2, 4):
            plain = run(mpirun(n, 1, step), 1)[0]
            zero = run(mpirun(n, 1, step + ["--zero", "1"]), 1)[0]
            share = zero["optimizer_state_mib"] / plain["optimizer_state_unsharded_mib"]
            print(f"| {n} | {plain['optimizer_state_mib']:.1f} MiB | "
                  f"{zero['optimizer_state_mib']:.1f} MiB | {share:.4f} | {1 / n + 0.05:.4f} |")
        print()

    if "allreduce" in parts:
        sizes = [1, 256, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
        arg = [bench, "--allreduce", ",".join(map(str, sizes))]
        transports = {"shared memory": ["--mca", "btl", "vader,self"],
                      "loopback TCP": ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include",
                                       "lo"]}
        res = {k: run(mpirun(2, 1, arg, mca), 1) for k, mca in transports.items()}
        print("| bytes | " + " | ".join(f"{k} s" for k in transports) + " |")
        print("|---:|" + "---:|" * len(transports))
        for i, s in enumerate(sizes):
            print(f"| {4 * s} | " + " | ".join(f"{res[k][i]['seconds']:.6f}" for k in transports)
                  + " |")
        # Ring all-reduce on p = 2: t = 2 alpha + n beta (n bytes): alpha from the smallest
        # message, beta from the largest two.
        for k in transports:
            r = res[k]
            alpha = r[0]["seconds"] / 2
            beta = (r[-1]["seconds"] - r[-2]["seconds"]) / (r[-1]["bytes"] - r[-2]["bytes"])
            print(f"\n{k}: alpha = {alpha * 1e6:.1f} us, beta = {beta * 1e9:.3f} ns/byte "
                  f"({1 / beta / 1e9:.2f} GB/s of all-reduce bandwidth)")


if __name__ == "__main__":
    main()
