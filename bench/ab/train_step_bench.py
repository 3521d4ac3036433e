#!/usr/bin/python3
"""packbert vs PyTorch, one BERT training step (forward + backward), side by side.

    /usr/bin/python3 bench/ab/train_step_bench.py [--sequences 8] [--rounds 3] [--layers 0]
        [--cases wiki,full,173,251,512,181] [--cap avx2]

Cases: `wiki` draws the step's sequence lengths from data/wikipedia_512.hist (seeded; the same
sequences for both sides): packbert packs them into rows of 512, PyTorch pads each to 512.
`full` uses sequences of exactly 512 tokens (no padding anywhere); a case of numbers is those
lengths. `--cap avx2` measures both sides on their AVX2 code: packbert under PACKBERT_MAX_ISA=avx2
(its kernels' AVX2 build and oneDNN capped at AVX2) and PyTorch's OpenBLAS on its Haswell (AVX2)
kernels. Runs are interleaved
(packbert, PyTorch, packbert, ...), each a fresh process with a warm-up step; the table reports
medians. PyTorch's thread count is probed (1 and 2 threads, OMP_NUM_THREADS = OPENBLAS_NUM_THREADS =
torch.set_num_threads) and the faster one is used.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchlib import ROOT, cpu, wiki_lengths  # noqa: E402


def run(cmd, env_threads, coretype="", extra=None):
    # Debian's torch takes GEMMs from OpenBLAS (pthread build): pin both pools to the same count.
    # OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to SSE3 kernels; the probe
    # also tries forcing its AVX-512 kernels (OPENBLAS_CORETYPE=SkylakeX) for PyTorch.
    env = dict(os.environ, OMP_NUM_THREADS=str(env_threads), OPENBLAS_NUM_THREADS=str(env_threads))
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    env.update(extra or {})
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=0, help="override BERT-base's 12 layers")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--cases", default="wiki,full")
    ap.add_argument("--markdown", default="")
    ap.add_argument("--cap", default="", choices=["", "avx2"],
                    help="both sides on their AVX2 code (see above)")
    a = ap.parse_args()
    model, isa = cpu()
    print(f"CPU: {model} ({os.cpu_count()} threads), ISA {isa}")
    common = ["--steps", str(a.steps), "--warmup", "1"] + (["--layers", str(a.layers)] if a.layers else [])
    rows = []
    ours_env = {"PACKBERT_MAX_ISA": "avx2"} if a.cap == "avx2" else {}
    cases = a.cases.split(",")
    if all(c.isdigit() for c in cases):  # one case of these lengths
        cases = [",".join(cases)]
    for case in cases:
        lengths = (wiki_lengths(a.sequences, 11) if case == "wiki" else [512] * a.sequences
                   if case == "full" else [int(x) for x in case.split(",")])
        arg = ["--lengths", ",".join(map(str, lengths))]
        ours_cmd = [os.path.join(a.build, "train_step_bench")] + arg + common
        torch_cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench", "ab", "torch_bert_step.py")] + arg + common
        # Probe PyTorch's thread settings once; keep the faster.
        # (OpenBLAS's AVX-512 kernels forced on a CPU without AVX-512 die of SIGILL: tried only
        # where the CPU has it.)
        with open("/proc/cpuinfo") as f:
            avx512 = " avx512f" in f.read()
        settings = ([(t, "Haswell") for t in sorted({1, a.threads})] if a.cap == "avx2" else
                    [(t, "") for t in sorted({1, a.threads})] +
                    ([(a.threads, "SkylakeX")] if avx512 else []))
        probe = {f"{t}{'+' + c if c else ''}": run(torch_cmd + ["--threads", str(t)], t, c)["real_tokens_per_s"]
                 for t, c in settings}
        best = max(probe, key=probe.get)
        torch_threads, torch_core = (int(best.split("+")[0]), best.split("+")[1] if "+" in best else "")
        ours, theirs = [], []
        for r in range(a.rounds):
            ours.append(run(ours_cmd, a.threads, extra=ours_env))
            theirs.append(run(torch_cmd + ["--threads", str(torch_threads)], torch_threads, torch_core))
            print(f"{case} round {r}: packbert {ours[-1]['real_tokens_per_s']:.0f} tok/s, "
                  f"pytorch {theirs[-1]['real_tokens_per_s']:.0f} tok/s", file=sys.stderr)
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        p_rate, t_rate = med(ours, "real_tokens_per_s"), med(theirs, "real_tokens_per_s")
        rows.append(dict(case=case, sequences=len(lengths), real_tokens=ours[0]["real_tokens"],
                         kernel_isa=ours[0].get("kernel_isa", ""),
                         packbert_rows=ours[0]["rows"], torch_rows=theirs[0]["rows"],
                         packbert=p_rate, pytorch=t_rate, ratio=p_rate / t_rate,
                         torch_threads=best, probe=probe,
                         gemm_share=med(ours, "gemm_share"), model_gflops=med(ours, "model_gflops"),
                         sgemm_gflops=med(ours, "sgemm_gflops"),
                         activation_mib=ours[0]["activation_mib"]))
    layers = a.layers or 12
    head = (f"BERT-base shapes ({layers} layers, 768 hidden, 12 heads, fp32, dropout 0.1), "
            f"forward + backward, median of {a.rounds} interleaved rounds x {a.steps} steps, "
            f"{a.threads} packbert threads; packbert's kernels {rows[0]['kernel_isa']}"
            f"{', PyTorch on OpenBLAS Haswell (AVX2)' if a.cap else ''}.\n\n")
    table = ["| case | real tokens | rows packbert / PyTorch | packbert tok/s | PyTorch tok/s (threads) | ratio | packbert GEMM share | model GFLOP/s | sgemm GFLOP/s | FLOP/s vs sgemm |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['case']} | {r['real_tokens']} | {r['packbert_rows']} / {r['torch_rows']} | "
                     f"{r['packbert']:.0f} | {r['pytorch']:.0f} ({r['torch_threads']}) | {r['ratio']:.2f}x | "
                     f"{100 * r['gemm_share']:.0f}% | {r['model_gflops']:.1f} | {r['sgemm_gflops']:.1f} | "
                     f"{100 * r['model_gflops'] / r['sgemm_gflops']:.0f}% |")
    text = head + "\n".join(table) + "\n"
    print(text)
    print(json.dumps(rows))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
