#!/usr/bin/python3
"""Time to train, the MLPerf way, on the demo corpus: packed and padded pre-training runs, several
seeds each, every run trained until its held-out MLM accuracy reaches a target; per-run time to
target, the median and spread per layout, the ratio of medians, and a plot of accuracy against
training time for every run.

    /usr/bin/python3 bench/experiments/time_to_train.py [--seeds 3] [--target 0.30] [--adjust ga,beta]
        [--precision fp32|bf16|fp16] [--master-weights fp32|bf16]

Layouts: `packed` trains on the demo's optimal packs, --packs-per-step packs a step; `padded` trains
on the same packs' sequences one per row with the padding computed as frameworks do
(`--one-per-row --compute-padding`), so for one seed the two see the same sequences in the same
order with the same dropout draws and differ in the cost of a step. `--adjust X` adds one packed
run (seed 1) configured the way a framework user would size it, as many packs a step as the
padded run has rows (split into --adjust-accumulation micro-batches), with Graphcore's
`--packing-adjust X` compensating for the larger batch. Runs are interleaved (packed seed 1,
padded seed 1, packed seed 2, ...) so drift on a shared machine hits both layouts alike. Time is
training time (the runs' own clock, evaluation excluded). Needs build/packbert and the demo data
(made with `packbert demo --max-steps 0` when absent).

The default bert-mini gives about 0.57x on 2 AMD EPYC vCPUs: its MLM head and LAMB's update cost
both layouts the same and weigh on a 4-layer step. Issue #13's row asks for 0.55x or less; it
was met with 12 layers, 0.50x: `--layers 12 --warmup 400 --adjust '' --precision bf16
--eval-every 200`, about 2.5 hours there (docs/BENCHMARKS.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, demo_data, write_atomic  # noqa: E402

COLORS = {"packed": "#1f77b4", "padded": "#d62728", "ga": "#2ca02c", "beta": "#9467bd"}


def evals_of(run_dir):
    """[(step, training seconds, held-out MLM accuracy)] from a run's metrics.jsonl."""
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "eval":
                out.append((r["step"], r["elapsed"], r["mlm_acc"]))
    return out


def svg(runs, target, path, x_field=1, x_label="training time (s)", title=None):
    """Accuracy against training time (x_field 1) or steps (x_field 0), one polyline a run, the
    target as a dashed line."""
    W, H, L, R, T, B = 760, 440, 60, 200, 30, 50
    xmax = max(e[x_field] for r in runs for e in r["evals"]) or 1.0
    ymax = max(max(e[2] for r in runs for e in r["evals"]), target) * 1.05
    X = lambda x: L + (W - L - R) * x / xmax  # noqa: E731
    Y = lambda y: H - B - (H - T - B) * y / ymax  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{L}" y="18" font-size="14">' +
             (title or f'Time to {target:.2f} held-out MLM accuracy (demo corpus)') + '</text>',
             f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
             f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
             f'<line x1="{L}" y1="{Y(target):.1f}" x2="{W - R}" y2="{Y(target):.1f}" '
             f'stroke="gray" stroke-dasharray="4,4"/>',
             f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">{x_label}</text>',
             f'<text x="14" y="{(T + H - B) / 2:.0f}" transform="rotate(-90 14 '
             f'{(T + H - B) / 2:.0f})" text-anchor="middle">masked-LM accuracy</text>']
    for i in range(5):
        x, y = xmax * i / 4, ymax * i / 4
        parts.append(f'<text x="{X(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
        parts.append(f'<text x="{L - 6}" y="{Y(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    for k, r in enumerate(runs):
        pts = " ".join(f"{X(e[x_field]):.1f},{Y(e[2]):.1f}" for e in r["evals"])
        color = COLORS.get(r["kind"], "black")
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        parts.append(f'<text x="{W - R + 10}" y="{T + 16 * k + 10}" fill="{color}">{r["name"]}'
                     f'</text>')
    parts.append("</svg>")
    write_atomic(path, "\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.30)
    ap.add_argument("--adjust", default="ga,beta", help="packing adjustments to run once each, "
                    "comma list of ga, beta ('' for none)")
    ap.add_argument("--adjust-accumulation", type=int, default=2)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--layers", type=int, default=0,
                    help="encoder layers (0 = the preset's): packing shrinks the per-token work, "
                    "so a deeper model shows more of its gain past the shared per-step costs")
    ap.add_argument("--packs-per-step", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="every run's --precision (bf16 needs AVX512-BF16 or AMX-BF16)")
    ap.add_argument("--master-weights", default="fp32", choices=["fp32", "bf16"],
                    help="every run's --master-weights (bf16: weights and moments in bf16, "
                    "stochastic rounding; needs --precision bf16)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--data", default=os.path.join(ROOT, "out", "demo"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "out", "time_to_train"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    exe, seqs, packs = demo_data(a.build, a.data)
    os.makedirs(a.workdir, exist_ok=True)
    model, isa = cpu()
    masters = "" if a.master_weights == "fp32" else f" (masters {a.master_weights})"
    shape = f"bert-{a.preset}" + (f" ({a.layers} layers)" if a.layers else "")
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; {shape}, {a.precision}"
          f"{masters}, "
          f"LAMB lr {a.lr}, {a.packs_per_step} packs a step, target {a.target} held-out MLM "
          f"accuracy (evaluated every {a.eval_every} steps), cap {a.max_steps} steps", flush=True)

    common = ["--data", seqs, "--packs", packs, "--preset", a.preset, "--steps",
              str(a.max_steps), "--lr", str(a.lr), "--warmup", str(a.warmup), "--optimizer",
              "lamb", "--eval-every", str(a.eval_every), "--eval-fraction", "0.005",
              "--target-accuracy", str(a.target), "--precision", a.precision,
              "--master-weights", a.master_weights, "--overwrite"]
    if a.layers:
        common += ["--layers", str(a.layers)]
    plan = []
    for seed in range(1, a.seeds + 1):
        plan.append(("packed", seed, ["--batch-rows", str(a.packs_per_step)]))
        plan.append(("padded", seed, ["--batch-rows", str(a.packs_per_step), "--one-per-row",
                                      "--compute-padding"]))
    runs = []

    def run(kind, seed, extra):
        name = f"{kind} seed {seed}"
        out = os.path.join(a.workdir, f"{kind}_{seed}")
        cmd = [exe, "pretrain", *common, "--seed", str(seed), "--out", out, *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ev = evals_of(out)
        hit = next((e for e in ev if e[2] >= a.target), None)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(x) for x in f if '"type":"step"' in x.replace(" ", "")]
        seqs_per_step = statistics.mean(s["sequences"] for s in steps) if steps else 0
        r = {"name": name, "kind": kind, "seed": seed, "evals": ev,
             "steps": hit[0] if hit else None, "seconds": hit[1] if hit else None,
             "sequences_per_step": seqs_per_step,
             "seconds_per_step": steps[-1]["elapsed"] / len(steps) if steps else 0}
        runs.append(r)
        print(f"  {name}: " + (f"{hit[0]} steps, {hit[1]:.1f} s to target" if hit else
                               f"not reached in {ev[-1][0] if ev else 0} steps"), flush=True)
        return r

    for kind, seed, extra in plan:
        run(kind, seed, extra)
    padded_rows = statistics.mean(r["sequences_per_step"] for r in runs if r["kind"] == "padded")
    for adj in [x for x in a.adjust.split(",") if x]:
        acc = a.adjust_accumulation
        rows = max(1, round(padded_rows / acc))
        run(adj, 1, ["--batch-rows", str(rows), "--accumulation", str(acc), "--packing-adjust",
                     adj])

    print(f"\n| run | sequences/step | s/step | steps to target | s to target |")
    print("|---|---:|---:|---:|---:|")
    for r in runs:
        reached = (f"{r['steps']} | {r['seconds']:.1f}" if r["seconds"] is not None
                   else "not reached | -")
        print(f"| {r['name']} | {r['sequences_per_step']:.1f} | {r['seconds_per_step']:.3f} | "
              f"{reached} |")
    summary = {"target_accuracy": a.target, "cpu": model, "model": shape, "lr": a.lr,
               "warmup": a.warmup, "packs_per_step": a.packs_per_step, "precision": a.precision,
               "master_weights": a.master_weights, "runs": [
        {k: r[k] for k in ("name", "kind", "seed", "steps", "seconds", "sequences_per_step")}
        for r in runs]}
    print(f"\n| layout | runs reaching target | median s | spread (min-max) s |")
    print("|---|---:|---:|---:|")
    med = {}
    for kind in ["packed", "padded"]:
        t = [r["seconds"] for r in runs if r["kind"] == kind and r["seconds"]]
        n = sum(1 for r in runs if r["kind"] == kind)
        if t:
            med[kind] = statistics.median(t)
            print(f"| {kind} | {len(t)} of {n} | {med[kind]:.1f} | {min(t):.1f}-{max(t):.1f} |")
        else:
            print(f"| {kind} | 0 of {n} | - | - |")
    if len(med) == 2 and len([r for r in runs if r["seconds"] is None]) == 0:
        ratio = med["packed"] / med["padded"]
        summary["ratio_of_medians"] = ratio
        print(f"\npacked / padded median time to target: {ratio:.2f}x")
    else:
        summary["ratio_of_medians"] = None
        print("\npacked / padded: not every run reached the target (raise --max-steps)")
    svg(runs, a.target, os.path.join(a.workdir, "time_to_train.svg"))
    write_atomic(os.path.join(a.workdir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    print(f"plot: {os.path.join(a.workdir, 'time_to_train.svg')}; summary: "
          f"{os.path.join(a.workdir, 'summary.json')}")


if __name__ == "__main__":
    main()
