#!/usr/bin/python3
"""bf16 vs fp32, one BERT-base training step (forward + backward), and PyTorch's bf16 autocast.

    /usr/bin/python3 bench/ab/precision_bench.py [--rounds 3] [--cases wiki,full] [--torch] [--fp16]

Cases as bench/ab/train_step_bench.py: `wiki` draws 8 sequence lengths from
data/wikipedia_512.hist (packbert packs them into rows of 512; PyTorch pads each to 512), `full`
is 4 x 512 tokens. Each round runs packbert fp32, packbert bf16 and (with --torch) PyTorch
under torch.autocast('cpu', bfloat16), each a fresh process with a warm-up step, interleaved;
the tables report medians. The bf16 process also measures oneDNN's bf16 matmul rate at
2048 x 3072 x 768 through packbert's GEMM seam, the yardstick of the "share" column.
Activation bytes are the engine's own count of what the forward kept for backward. --fp16 also
runs packbert fp16 (fp16 activations, GEMM operands widened to fp32) in each round, for a second
table: what fp16 costs in speed and saves in memory against fp32.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, wiki_lengths  # noqa: E402


def run(cmd, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--cases", default="wiki,full")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--torch", action="store_true", help="also PyTorch bf16 autocast (wiki case)")
    ap.add_argument("--fp16", action="store_true", help="also packbert --precision fp16")
    ap.add_argument("--markdown", default="")
    a = ap.parse_args()
    model, isa = cpu()
    head = (f"CPU: {model} ({a.threads} threads), ISA {isa}. BERT-base (12 layers, 768 hidden, "
            f"dropout 0.1), forward + backward, median of {a.rounds} interleaved rounds x "
            f"{a.steps} steps.\n\n")
    print(head, end="")
    common = ["--steps", str(a.steps), "--warmup", "1"]
    rows, torch_rows, fp16_rows = [], [], []
    for case in a.cases.split(","):
        lengths = wiki_lengths(8, 11) if case == "wiki" else [512] * 4
        arg = ["--lengths", ",".join(map(str, lengths))]
        ours = os.path.join(a.build, "train_step_bench")
        torch_cmd = (["/usr/bin/python3", os.path.join(ROOT, "bench", "ab", "torch_bert_step.py")] + arg +
                     common + ["--threads", str(a.threads), "--autocast", "bf16"])
        runs = {"fp32": [], "bf16": [], "fp16": [], "torch": []}
        for r in range(a.rounds):
            for p in ("fp32", "bf16") + (("fp16",) if a.fp16 else ()):
                runs[p].append(run([ours] + arg + common + ["--precision", p], a.threads))
            if a.torch and case == "wiki":
                runs["torch"].append(run(torch_cmd, a.threads))
            print(f"{case} round {r}: " + ", ".join(
                f"{k} {v[-1]['real_tokens_per_s']:.0f} tok/s" for k, v in runs.items() if v),
                file=sys.stderr)
        med = lambda p, k: statistics.median(x[k] for x in runs[p])
        f32, b16 = med("fp32", "real_tokens_per_s"), med("bf16", "real_tokens_per_s")
        row = dict(case=case, real_tokens=runs["fp32"][0]["real_tokens"], fp32=f32, bf16=b16,
                   speedup=b16 / f32, bf16_gflops=med("bf16", "model_gflops"),
                   matmul_gflops=med("bf16", "bf16_matmul_gflops"),
                   act_fp32=runs["fp32"][0]["activation_mib"],
                   act_bf16=runs["bf16"][0]["activation_mib"])
        rows.append(row)
        if runs["fp16"]:
            h16 = med("fp16", "real_tokens_per_s")
            fp16_rows.append(dict(case=case, fp32=f32, fp16=h16, speed=h16 / f32,
                                  act_fp32=row["act_fp32"],
                                  act_fp16=runs["fp16"][0]["activation_mib"]))
        if runs["torch"]:
            t = med("torch", "real_tokens_per_s")
            torch_rows.append(dict(case=case, torch=t, bf16=b16, ratio=b16 / t,
                                   version=runs["torch"][0]["torch"]))
    table = ["| case | real tokens | fp32 tok/s | bf16 tok/s | bf16 / fp32 | bf16 model GFLOP/s | "
             "bf16 matmul GFLOP/s | share | activations fp32 / bf16 MiB | bytes bf16 / fp32 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['case']} | {r['real_tokens']} | {r['fp32']:.0f} | {r['bf16']:.0f} | "
                     f"{r['speedup']:.2f}x | {r['bf16_gflops']:.0f} | {r['matmul_gflops']:.0f} | "
                     f"{100 * r['bf16_gflops'] / r['matmul_gflops']:.0f}% | "
                     f"{r['act_fp32']:.0f} / {r['act_bf16']:.0f} | "
                     f"{r['act_bf16'] / r['act_fp32']:.2f}x |")
    if torch_rows:
        table += ["", "| case | PyTorch bf16 autocast tok/s (padded) | packbert bf16 tok/s (packed) | "
                  "ratio |", "|---|---:|---:|---:|"]
        for r in torch_rows:
            table.append(f"| {r['case']} | {r['torch']:.0f} (torch {r['version']}) | "
                         f"{r['bf16']:.0f} | {r['ratio']:.1f}x |")
    if fp16_rows:
        table += ["", "| case | fp32 tok/s | fp16 tok/s | fp16 / fp32 | "
                  "activations fp32 / fp16 MiB | bytes fp16 / fp32 |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in fp16_rows:
            table.append(f"| {r['case']} | {r['fp32']:.0f} | {r['fp16']:.0f} | {r['speed']:.2f}x | "
                         f"{r['act_fp32']:.0f} / {r['act_fp16']:.0f} | "
                         f"{r['act_fp16'] / r['act_fp32']:.2f}x |")
    text = head + "\n".join(table) + "\n"
    print("\n".join(table))
    print(json.dumps(dict(rows=rows, torch=torch_rows, fp16=fp16_rows)))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
