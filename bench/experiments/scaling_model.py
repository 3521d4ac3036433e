#!/usr/bin/python3
"""The alpha-beta model of packbert's data parallelism (docs/SCALING.md), from measured inputs.

    /usr/bin/python3 bench/experiments/scaling_model.py --alpha-us A --tokens-per-s-per-core R \
        [--cores-per-node 32] [--overlap 0.5]

A step of N nodes: each node computes its share of the step (T_c = tokens per node / node rate)
and the gradients (4 bytes a parameter) are summed by a ring all-reduce,
    T_ar = 2 (N - 1) alpha + 2 (N - 1) / N * G * beta,   beta = 8 / link bits per second,
of which a fraction `overlap` of backward (2/3 of T_c) hides part; the rest is exposed:
    efficiency = T_c / (T_c + max(0, T_ar - overlap * 2/3 * T_c)).
alpha: per-message latency, measured over loopback TCP by bench/ab/dist_bench.py (a real network
adds its own; the larger of the measurement and 25 us is used). The node rate: the measured
BERT-base fp32 tokens/s per core times the cores of a node (linear in cores: optimistic);
BERT-large's rate is BERT-base's times the ratio of their parameter counts (the step's FLOPs
scale with it at equal tokens). Prints the efficiency at 16,384 tokens per node per step (32
sequences of 512) and the tokens per node per step (and global batch in sequences of 512) that
reach 90% without overlap (the conservative figure).
"""
import argparse

MODELS = {"bert-base": 110.1e6, "bert-large": 335.2e6}
NETWORKS = {"10 Gb/s": 10e9, "25 Gb/s": 25e9, "100 Gb/s": 100e9}
NODES = (8, 64, 256)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha-us", type=float, required=True)
    ap.add_argument("--tokens-per-s-per-core", type=float, required=True)
    ap.add_argument("--cores-per-node", type=int, default=32)
    ap.add_argument("--overlap", type=float, default=0.5,
                    help="share of backward the all-reduce hides behind (0 = none)")
    ap.add_argument("--tokens-per-node", type=int, default=32 * 512)
    a = ap.parse_args()
    alpha = max(a.alpha_us, 25.0) * 1e-6
    base_rate = a.tokens_per_s_per_core * a.cores_per_node
    print(f"alpha {alpha * 1e6:.0f} us; BERT-base node rate {base_rate:.0f} tokens/s "
          f"({a.cores_per_node} cores x {a.tokens_per_s_per_core:.0f}); overlap {a.overlap:.0%} "
          f"of backward\n")
    print("| model | network | nodes | all-reduce s | compute s (16k tokens/node) | "
          "efficiency, no overlap | with overlap | tokens/node/step for 90%, no overlap | "
          "global batch (sequences of 512) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for model, params in MODELS.items():
        rate = base_rate * MODELS["bert-base"] / params
        grad_bytes = 4 * params
        for net, bits in NETWORKS.items():
            beta = 8 / bits
            for n in NODES:
                t_ar = 2 * (n - 1) * alpha + 2 * (n - 1) / n * grad_bytes * beta

                def efficiency(tokens, overlap=0.0):
                    t_c = tokens / rate
                    return t_c / (t_c + max(0.0, t_ar - overlap * 2 / 3 * t_c))

                t_c = a.tokens_per_node / rate
                need = 512
                while efficiency(need) < 0.9:
                    need *= 2
                lo = need // 2
                while need - lo > 512:  # bisect to a whole sequence of 512
                    mid = (lo + need) // 2
                    if efficiency(mid) >= 0.9:
                        need = mid
                    else:
                        lo = mid
                need = -(-need // 512) * 512
                print(f"| {model} | {net} | {n} | {t_ar:.2f} | {t_c:.1f} | "
                      f"{efficiency(a.tokens_per_node):.1%} | "
                      f"{efficiency(a.tokens_per_node, a.overlap):.1%} | {need:,} | "
                      f"{n * need // 512:,} |")


if __name__ == "__main__":
    main()
