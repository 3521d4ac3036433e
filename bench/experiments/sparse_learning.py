#!/usr/bin/python3
"""Learning at equal FLOPs: dense bert-mini against block-sparse bert-medium (s = 0.9) on the
demo corpus, the same data and seed, each run given the same non-embedding training FLOPs (the
encoder's linear layers, 6 x kept weights per real token, as Graphcore counts them): the sparse
model's steps are the dense run's scaled by the ratio of FLOPs per token. Held-out MLM loss every
--eval-every steps; the tables give each run's final loss and wall-clock, each configuration's
mean over the seeds, and when each sparse run first reached its seed's dense final loss (the
end-to-end measure); the SVG the loss against FLOPs and against training seconds.

    /usr/bin/python3 bench/experiments/sparse_learning.py [--dense-steps 600] [--blocks 1,16] [--seeds 1]
                                              [--precision fp32|bf16] [--sparse-lr-scale auto]
                                              [--sparse-init dense|fan-in] [--prune-ratio P]
                                              [--sparse-updates N] [--reuse] [--workdir DIR]

Issue #12's comparison (two seeds, 20-32 minutes a sparse run on 2 vCPUs; Graphcore's auto
learning-rate scale stalled there, see docs/BENCHMARKS.md):
    /usr/bin/python3 bench/experiments/sparse_learning.py --dense-steps 1200 --blocks 1,16 --seeds 2 \
        --precision bf16 --sparse-lr-scale 1

--sparse-init fan-in starts the sparse weights with the dense layer's output variance; on 16 x 16
seed 1 it ended 0.21 nats lower than the default (docs/BENCHMARKS.md, session 27).

--precision applies to every run (dense and sparse); under bf16 the block-sparse kernels read
the 16-bit activations and compute in fp32.

Needs build/packbert and the demo data (made with `packbert demo --max-steps 0` when absent).
"""
import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, demo_data, write_atomic  # noqa: E402

PRESETS = {"mini": (4, 256), "medium": (8, 512)}  # layers, hidden (intermediate = 4 x hidden)


def kept(rows, cols, block, sparsity):
    """kernels::blocks_kept: round((1 - s) x blocks), at least 1."""
    blocks = (rows // block) * (cols // block)
    return max(1, min(blocks, int(math.floor((1 - sparsity) * blocks + 0.5)))) * block * block


def flops_per_token(preset, block=0, sparsity=0.0):
    """train::nonembedding_flops_per_token: 6 x the encoder's linear weights as held."""
    layers, c = PRESETS[preset]
    shapes = [(c, c)] * 4 + [(4 * c, c), (c, 4 * c)]
    per_layer = sum(kept(r, k, block, sparsity) if block else r * k for r, k in shapes)
    return 6.0 * layers * per_layer


def records(run_dir, kind):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type", "step") == kind:
                out.append(r)
    return out


def curves(run_dir):
    """[(step, training seconds, train FLOPs so far, held-out MLM loss)] per evaluation."""
    flops = {r["step"]: r.get("train_flops", 0.0) for r in records(run_dir, "step")}
    return [(e["step"], e["elapsed"], flops.get(e["step"], 0.0), e["mlm_loss"])
            for e in records(run_dir, "eval")]


COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def svg(runs, path, title):
    """Two panels: held-out MLM loss against training FLOPs and against training seconds."""
    W, H, L, R, T, B, GAP = 1060, 420, 60, 230, 40, 50, 60
    pw = (W - L - R - GAP) / 2
    ymin = min(e[3] for r in runs for e in r["curve"])
    ymax = max(e[3] for r in runs for e in r["curve"])
    ymin, ymax = ymin - 0.05 * (ymax - ymin), ymax + 0.05 * (ymax - ymin)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" '
             'fill="white"/>', f'<text x="{L}" y="20" font-size="14">{title}</text>']
    Y = lambda y: H - B - (H - T - B) * (y - ymin) / (ymax - ymin)  # noqa: E731
    for p, (field, label, scale) in enumerate([(2, "non-embedding training PFLOP", 1e-15),
                                               (1, "training seconds", 1.0)]):
        x0 = L + p * (pw + GAP)
        xmax = max(e[field] for r in runs for e in r["curve"]) * scale or 1.0
        X = lambda x: x0 + pw * x * scale / xmax  # noqa: E731
        parts += [f'<line x1="{x0}" y1="{H - B}" x2="{x0 + pw}" y2="{H - B}" stroke="black"/>',
                  f'<line x1="{x0}" y1="{T}" x2="{x0}" y2="{H - B}" stroke="black"/>',
                  f'<text x="{x0 + pw / 2:.0f}" y="{H - 12}" text-anchor="middle">{label}</text>']
        for i in range(5):
            xv, yv = xmax * i / 4, ymin + (ymax - ymin) * i / 4
            parts.append(f'<text x="{x0 + pw * i / 4:.1f}" y="{H - B + 16}" '
                         f'text-anchor="middle">{xv:.3g}</text>')
            parts.append(f'<text x="{x0 - 6}" y="{Y(yv) + 4:.1f}" text-anchor="end">'
                         f'{yv:.2f}</text>')
        for k, r in enumerate(runs):
            pts = " ".join(f"{X(e[field]):.1f},{Y(e[3]):.1f}" for e in r["curve"])
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[k % 6]}" '
                         'stroke-width="1.5"/>')
    for k, r in enumerate(runs):
        parts.append(f'<text x="{W - R + 10}" y="{T + 16 * k + 10}" fill="{COLORS[k % 6]}">'
                     f'{r["name"]}</text>')
    parts.append(f'<text x="14" y="{(T + H - B) / 2:.0f}" transform="rotate(-90 14 '
                 f'{(T + H - B) / 2:.0f})" text-anchor="middle">held-out MLM loss</text>')
    parts.append("</svg>")
    write_atomic(path, "\n".join(parts) + "\n")


def summary(runs, names, seeds):
    """Per configuration: the seeds' final losses, their mean, and the mean training seconds
    against dense bert-mini's (runs in main's order: seed-major, configs[0] dense). Then, per
    sparse run, when its held-out loss first reached its seed's dense final loss (the end-to-end
    row's measure; the first evaluation at or below it, so it can be late by up to one interval)."""
    n = len(names)
    final = [[runs[s * n + k]["curve"][-1] for s in range(seeds)] for k in range(n)]
    dense_s = sum(e[1] for e in final[0]) / seeds
    print("\n| configuration | held-out MLM loss per seed | mean | training s, mean | vs dense |")
    print("|---|---|---:|---:|---:|")
    for k, name in enumerate(names):
        losses = [e[3] for e in final[k]]
        secs = sum(e[1] for e in final[k]) / seeds
        print(f"| {name} | {', '.join(f'{x:.4f}' for x in losses)} | "
              f"{sum(losses) / seeds:.4f} | {secs:.0f} | {secs / dense_s:.2f}x |")
    print("\n| sparse run | dense's final loss | reached at step | training s | vs dense's s |")
    print("|---|---:|---:|---:|---:|")
    for s in range(seeds):
        target, dense_secs = final[0][s][3], final[0][s][1]
        for k in range(1, n):
            r = runs[s * n + k]
            hit = next((e for e in r["curve"] if e[3] <= target), None)
            where = (f"{hit[0]} | {hit[1]:.0f} | {hit[1] / dense_secs:.2f}x" if hit
                     else "not reached | - | -")
            print(f"| {r['name']} | {target:.4f} | {where} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dense-steps", type=int, default=600)
    ap.add_argument("--blocks", default="1,16", help="sparse block sizes to run")
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--packs-per-step", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-3, help="dense LAMB learning rate; the sparse "
                    "runs scale it by --sparse-lr-scale")
    ap.add_argument("--sparse-lr-scale", default="auto", help="the sparse runs' "
                    "--sparse-lr-scale (auto: Graphcore's exp(1.969 s^2 + 0.2905 s), 6.4x at "
                    "s = 0.9)")
    ap.add_argument("--sparse-init", default="dense", choices=["dense", "fan-in"],
                    help="the sparse runs' --sparse-init (fan-in: the sparse weights start with "
                    "the dense layer's output variance)")
    ap.add_argument("--prune-ratio", default="", help="the sparse runs' --prune-ratio (default: "
                    "pretrain's, Graphcore's 0.5; 0 keeps each run's random pattern fixed)")
    ap.add_argument("--sparse-updates", default="", help="the sparse runs' --sparse-updates "
                    "(default: pretrain's, Graphcore's 160 for 1 x 1 blocks, 80 otherwise)")
    ap.add_argument("--warmup-fraction", type=float, default=0.04)
    ap.add_argument("--evals", type=int, default=10)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="every run's --precision")
    ap.add_argument("--reuse", action="store_true",
                    help="keep a run whose workdir already holds its final evaluation")
    ap.add_argument("--data", default=os.path.join(ROOT, "out", "demo"))
    ap.add_argument("--workdir", default="", help="the runs' directories (default "
                    "out/sparse_learning, with _<precision> added unless fp32)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "sparse_learning.svg"))
    a = ap.parse_args()
    if not a.workdir:
        a.workdir = os.path.join(
            ROOT, "out", "sparse_learning" + ("" if a.precision == "fp32" else "_" + a.precision))
    exe, seqs, packs = demo_data(a.build, a.data)
    model, isa = cpu()
    dense_fpt = flops_per_token("mini")
    configs = [("dense bert-mini", "mini", 0, a.dense_steps)]
    for b in [int(x) for x in a.blocks.split(",") if x]:
        fpt = flops_per_token("medium", b, a.sparsity)
        configs.append((f"bert-medium s={a.sparsity} {b}x{b}", "medium", b,
                        int(round(a.dense_steps * dense_fpt / fpt))))
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}; demo corpus, {a.precision}, LAMB, "
          f"{a.packs_per_step} packs a step; equal non-embedding FLOPs: "
          + ", ".join(f"{n} {s} steps" for n, _, _, s in configs), flush=True)
    runs = []
    for seed in range(1, a.seeds + 1):
        for name, preset, block, steps in configs:
            out = os.path.join(a.workdir, f"{preset}_b{block}_seed{seed}")
            done = os.path.exists(os.path.join(out, "metrics.jsonl")) and any(
                e[0] == steps for e in curves(out))
            if not (a.reuse and done):
                cmd = [exe, "pretrain", "--data", seqs, "--packs", packs, "--preset", preset,
                       "--steps", str(steps), "--lr", str(a.lr),
                       "--warmup", str(max(1, int(a.warmup_fraction * steps))),
                       "--batch-rows", str(a.packs_per_step),
                       "--eval-every", str(max(1, steps // a.evals)), "--eval-fraction", "0.005",
                       "--seed", str(seed), "--out", out, "--overwrite",
                       "--precision", a.precision]
                if block:
                    cmd += ["--sparsity", str(a.sparsity), "--block", str(block),
                            "--sparse-lr-scale", a.sparse_lr_scale, "--sparse-init", a.sparse_init]
                    cmd += ["--prune-ratio", a.prune_ratio] if a.prune_ratio else []
                    cmd += ["--sparse-updates", a.sparse_updates] if a.sparse_updates else []
                if subprocess.run(cmd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode != 0:
                    sys.exit(f"{name}: packbert pretrain failed; see {out}")
            c = curves(out)
            runs.append({"name": f"{name}, seed {seed}", "curve": c})
            print(f"  {name}, seed {seed}: {steps} steps, held-out MLM loss {c[-1][3]:.4f}, "
                  f"{c[-1][2] * 1e-15:.3f} PFLOP, {c[-1][1]:.0f} s training", flush=True)
    print("\n| run | steps | non-embedding PFLOP | held-out MLM loss | training s |")
    print("|---|---:|---:|---:|---:|")
    for r in runs:
        e = r["curve"][-1]
        print(f"| {r['name']} | {e[0]} | {e[2] * 1e-15:.3f} | {e[3]:.4f} | {e[1]:.0f} |")
    summary(runs, [n for n, _, _, _ in configs], a.seeds)
    svg(runs, a.plot, "Held-out MLM loss at equal non-embedding FLOPs (demo corpus)")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
