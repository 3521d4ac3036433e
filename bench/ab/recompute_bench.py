#!/usr/bin/python3
"""Recompute policies on one BERT training step (forward + backward): kept activation bytes and
step time against `none`, same binary, same batch, runs interleaved, medians.

    /usr/bin/python3 bench/ab/recompute_bench.py [--rounds 3] [--policies none,gelu,ln,...]

Cases: `wiki` draws sequence lengths from data/wikipedia_512.hist (seeded) and packs them into
rows of 512; `full` is 4 sequences of exactly 512 tokens. Each run is a fresh
build/train_step_bench process (one warm-up step, then --steps timed ones; its median). Rounds
go policy by policy (none, gelu,ln, ..., none, gelu,ln, ...) so drift on a shared machine hits
every policy alike. `activations` are the records kept from forward to backward; `+ scratch`
adds the step's working memory (gradient buffers and the re-run layers' records).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, wiki_lengths  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="override BERT-base's 12 layers")
    ap.add_argument("--policies", default="none;gelu,ln;attention;layer;every:4")
    ap.add_argument("--cases", default="wiki,full")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    model, isa = cpu()
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; BERT-base, fp32")
    policies = a.policies.split(";")
    for case in a.cases.split(","):
        lengths = wiki_lengths(8, 11) if case == "wiki" else [512] * 4
        cmd = [os.path.join(a.build, "train_step_bench"), "--lengths", ",".join(map(str, lengths)),
               "--steps", str(a.steps), "--warmup", "1"]
        if a.layers:
            cmd += ["--layers", str(a.layers)]
        runs = {p: [] for p in policies}
        for _ in range(a.rounds):
            for p in policies:
                out = subprocess.run(cmd + ["--recompute", p], check=True, capture_output=True,
                                     text=True).stdout
                runs[p].append(json.loads(out.strip().splitlines()[-1]))
        base = runs[policies[0]]
        t0 = statistics.median(r["step_seconds"] for r in base)
        a0 = base[0]["activation_mib"]
        s0 = a0 + base[0]["scratch_mib"]
        print(f"\ncase {case}: {sum(lengths)} tokens in {len(lengths)} sequences "
              f"({base[0]['rows']} rows of 512), {a.rounds} interleaved runs, median")
        print("| policy | activations MiB | vs none | + scratch MiB | vs none | step s | vs none |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for p in policies:
            r = runs[p]
            t = statistics.median(x["step_seconds"] for x in r)
            act = r[0]["activation_mib"]
            tot = act + r[0]["scratch_mib"]
            print(f"| `{p}` | {act:.0f} | {act / a0:.2f}x | {tot:.0f} | {tot / s0:.2f}x | "
                  f"{t:.2f} | {t / t0:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
