#!/usr/bin/python3
"""The PyTorch peer for bench/ab/train_step_bench.py: one BERT training step (forward + backward,
no optimizer), written the standard way (nn.Linear, F.layer_norm, F.gelu, matmul attention with
an additive padding mask, F.cross_entropy), every sequence padded to --max-seq-len, dropout 0.1.
MLM logits are computed on the masked positions only and NSP on [CLS], as packbert does, so the
comparison is about layout (padding) and kernels, not about wasted head work.
Prints one JSON line like the packbert side.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8), "medium": (8, 512, 8),
           "base": (12, 768, 12), "large": (24, 1024, 16)}


def norm(ln, x):
    # PyTorch 1.13's CPU autocast leaves LayerNorm to its inputs' dtype, and its bf16 LayerNorm
    # kernel is missing: normalise in fp32, as autocast does on GPUs.
    return ln(x.float())


class Layer(nn.Module):
    def __init__(self, C, I, NH, p):
        super().__init__()
        self.NH, self.p = NH, p
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.attn_out, self.ln1 = nn.Linear(C, C), nn.LayerNorm(C, eps=1e-12)
        self.inter, self.out, self.ln2 = nn.Linear(C, I), nn.Linear(I, C), nn.LayerNorm(C, eps=1e-12)

    def forward(self, h, mask):
        B, S, C = h.shape
        hs = C // self.NH
        q = self.query(h).view(B, S, self.NH, hs).transpose(1, 2)
        k = self.key(h).view(B, S, self.NH, hs).transpose(1, 2)
        v = self.value(h).view(B, S, self.NH, hs).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hs) + mask
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
        ctx = (probs @ v).transpose(1, 2).reshape(B, S, C)
        h = norm(self.ln1, F.dropout(self.attn_out(ctx), self.p, self.training) + h)
        return norm(self.ln2, F.dropout(self.out(F.gelu(self.inter(h))), self.p, self.training) + h)


class Bert(nn.Module):
    def __init__(self, layers, C, NH, V=30522, P=512, p=0.1):
        super().__init__()
        self.word, self.pos, self.typ = nn.Embedding(V, C), nn.Embedding(P, C), nn.Embedding(2, C)
        self.ln = nn.LayerNorm(C, eps=1e-12)
        self.layers = nn.ModuleList(Layer(C, 4 * C, NH, p) for _ in range(layers))
        self.pool, self.nsp = nn.Linear(C, C), nn.Linear(C, 2)
        self.transform, self.tln = nn.Linear(C, C), nn.LayerNorm(C, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(V))
        self.p = p

    def forward(self, ids, types, attn, mlm_pos, mlm_labels, nsp_labels):
        B, S = ids.shape
        pos = torch.arange(S).expand(B, S)
        h = F.dropout(norm(self.ln, self.word(ids) + self.pos(pos) + self.typ(types)), self.p, self.training)
        mask = (1.0 - attn[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            h = layer(h, mask)
        flat = h.reshape(B * S, -1)[mlm_pos]
        x = norm(self.tln, F.gelu(self.transform(flat)))
        mlm = F.cross_entropy(x @ self.word.weight.T + self.mlm_bias, mlm_labels)
        pooled = torch.tanh(self.pool(h[:, 0]))
        return mlm + F.cross_entropy(self.nsp(pooled), nsp_labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--preset", default="base")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--autocast", default="", help="bf16: torch.autocast('cpu', torch.bfloat16)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    lengths = [int(x) for x in a.lengths.split(",")]
    L, C, NH = PRESETS[a.preset]
    if a.layers:
        L = a.layers
    torch.manual_seed(0)
    model = Bert(L, C, NH, P=max(512, a.max_seq_len))
    model.train()
    B, S = len(lengths), a.max_seq_len
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1000, 30000, (B, S), generator=g)
    types = torch.zeros(B, S, dtype=torch.long)
    attn = torch.zeros(B, S, dtype=torch.long)
    mlm_pos = []
    for b, l in enumerate(lengths):
        attn[b, :l] = 1
        types[b, l // 2:l] = 1
        n_mask = max(1, int(0.15 * l + 0.5))
        mlm_pos += [b * S + i for i in range(1, min(n_mask, l - 1) + 1)]
    mlm_pos = torch.tensor(mlm_pos)
    mlm_labels = torch.randint(1000, 30000, (len(mlm_pos),), generator=g)
    nsp_labels = torch.randint(0, 2, (B,), generator=g)
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = model(ids, types, attn, mlm_pos, mlm_labels, nsp_labels)
        loss.float().backward()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    times.sort()
    t = times[len(times) // 2]
    real = sum(lengths)
    print(json.dumps({"impl": "pytorch", "layout": "padded", "threads": torch.get_num_threads(),
                      "sequences": B, "rows": B, "real_tokens": real, "slots": B * S,
                      "step_seconds": t, "real_tokens_per_s": real / t, "torch": torch.__version__,
                      "autocast": a.autocast or "off"}))


if __name__ == "__main__":
    main()
