#!/usr/bin/python3
"""Whole-model goldens from a Hugging Face-layout BERT written in plain PyTorch.

Run with Debian's torch (no `transformers` needed):
    /usr/bin/python3 tools/make_model_golden.py tests/golden

For each config it builds a seeded BertForPreTraining-layout model (post-LN, exact erf GELU,
LayerNorm eps 1e-12, decoder tied to the word embeddings, dropout off), a packed batch in
Graphcore's convention, and runs every sequence ON ITS OWN through the model (the unpacked
reference), so packbert's packed forward/backward must reproduce per-sequence results. The
output is one safetensors file per config, the user-facing golden format of docs/FORMATS.md:
model tensors under their HF names, the batch (int32), expected.mlm_loss / expected.nsp_loss
and grad.<name> for every parameter, config JSON in the metadata under "config".
Reference arithmetic is float64 on the float32-rounded parameters.
"""
import json
import math
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, C, I):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(C, C)
        self.attention.self.key = nn.Linear(C, C)
        self.attention.self.value = nn.Linear(C, C)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(C, C)
        self.attention.output.LayerNorm = nn.LayerNorm(C, eps=1e-12)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(C, I)
        self.output = nn.Module()
        self.output.dense = nn.Linear(I, C)
        self.output.LayerNorm = nn.LayerNorm(C, eps=1e-12)


class BertForPreTraining(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.cfg = cfg
        self.bert = nn.Module()
        e = self.bert.embeddings = nn.Module()
        e.word_embeddings = nn.Embedding(cfg["vocab_size"], C)
        e.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], C)
        e.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], C)
        e.LayerNorm = nn.LayerNorm(C, eps=1e-12)
        self.bert.encoder = nn.Module()
        self.bert.encoder.layer = nn.ModuleList(Layer(C, I) for _ in range(cfg["num_hidden_layers"]))
        self.bert.pooler = nn.Module()
        self.bert.pooler.dense = nn.Linear(C, C)
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        self.cls.predictions.transform = nn.Module()
        self.cls.predictions.transform.dense = nn.Linear(C, C)
        self.cls.predictions.transform.LayerNorm = nn.LayerNorm(C, eps=1e-12)
        self.cls.predictions.bias = nn.Parameter(torch.zeros(cfg["vocab_size"]))
        self.cls.seq_relationship = nn.Linear(C, 2)

    def encode(self, ids, pos, types):
        """One sequence, no padding: [L] -> [L, C]."""
        e = self.bert.embeddings
        h = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(pos) + e.token_type_embeddings(types))
        NH = self.cfg["num_attention_heads"]
        L, C = h.shape
        hs = C // NH
        for layer in self.bert.encoder.layer:
            a = layer.attention
            q = a.self.query(h).view(L, NH, hs).transpose(0, 1)
            k = a.self.key(h).view(L, NH, hs).transpose(0, 1)
            v = a.self.value(h).view(L, NH, hs).transpose(0, 1)
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hs), dim=-1)
            ctx = (att @ v).transpose(0, 1).reshape(L, C)
            h = a.output.LayerNorm(a.output.dense(ctx) + h)
            inter = F.gelu(layer.intermediate.dense(h))
            h = layer.output.LayerNorm(layer.output.dense(inter) + h)
        return h

    def heads(self, h):
        pooled = torch.tanh(self.bert.pooler.dense(h[0]))
        nsp_logits = self.cls.seq_relationship(pooled)
        t = self.cls.predictions.transform
        x = t.LayerNorm(F.gelu(t.dense(h)))
        mlm_logits = x @ self.bert.embeddings.word_embeddings.weight.T + self.cls.predictions.bias
        return mlm_logits, nsp_logits


def make_batch(g, cfg, packs, S):
    """packs: list of lists of sequence lengths. Returns [B, S] / [B, K] int32 tensors."""
    B, K = len(packs), max(len(p) for p in packs)
    t = {n: torch.zeros(B, S, dtype=torch.int32) for n in
         ["input_ids", "token_type_ids", "position_ids", "sequence_ids"]}
    t["mlm_labels"] = torch.full((B, S), -100, dtype=torch.int32)
    t["nsp_labels"] = torch.full((B, K), -100, dtype=torch.int32)
    V = cfg["vocab_size"]
    for b, lengths in enumerate(packs):
        o = 0
        for k, L in enumerate(lengths):
            ids = torch.randint(1, V, (L,), generator=g)
            split = int(torch.randint(1, L, (1,), generator=g)) if L > 1 else L
            for i in range(L):
                t["input_ids"][b, o + i] = ids[i]
                t["token_type_ids"][b, o + i] = 0 if i < split else 1
                t["position_ids"][b, o + i] = i
                t["sequence_ids"][b, o + i] = k + 1
                if i > 0 and float(torch.rand(1, generator=g)) < 0.2:
                    t["mlm_labels"][b, o + i] = int(torch.randint(1, V, (1,), generator=g))
            t["nsp_labels"][b, k] = int(torch.randint(0, 2, (1,), generator=g))
            o += L
    return t


def reference(model, batch):
    """Runs each sequence alone; MLM mean over masked tokens, NSP mean over sequences."""
    mlm_sum, mlm_n, nsp_sum, nsp_n = 0.0, 0, 0.0, 0
    B, S = batch["input_ids"].shape
    for b in range(B):
        for k in range(1, int(batch["sequence_ids"][b].max()) + 1):
            idx = (batch["sequence_ids"][b] == k).nonzero().flatten()
            ids, pos, types = (batch[n][b, idx].long() for n in ["input_ids", "position_ids", "token_type_ids"])
            labels = batch["mlm_labels"][b, idx].long()
            h = model.encode(ids, pos, types)
            mlm_logits, nsp_logits = model.heads(h)
            masked = labels != -100
            if masked.any():
                mlm_sum = mlm_sum + F.cross_entropy(mlm_logits[masked], labels[masked], reduction="sum")
                mlm_n += int(masked.sum())
            y = int(batch["nsp_labels"][b, k - 1])
            if y != -100:
                nsp_sum = nsp_sum + F.cross_entropy(nsp_logits[None], torch.tensor([y]), reduction="sum")
                nsp_n += 1
    return mlm_sum / mlm_n, nsp_sum / nsp_n


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


def randomize(model):
    """Larger-than-default values so every gradient is well above noise: norm weights (BERT's
    LayerNorm, ModernBERT's norm) near 1, biases near 0, the rest N(0, 0.1^2)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm.weight" in pname.lower():
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))


def golden(name, cfg, packs, S, seed, out_dir):
    torch.manual_seed(seed)
    model = BertForPreTraining(cfg)
    randomize(model)
    params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    model = model.double()
    g = torch.Generator().manual_seed(seed + 1)
    batch = make_batch(g, cfg, packs, S)
    mlm, nsp = reference(model, batch)
    (mlm + nsp).backward()
    tensors = dict(params)
    tensors.update(batch)
    tensors["expected.mlm_loss"] = torch.tensor(float(mlm), dtype=torch.float32)
    tensors["expected.nsp_loss"] = torch.tensor(float(nsp), dtype=torch.float32)
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.float()
    path = f"{out_dir}/{name}.safetensors"
    save_safetensors(path, tensors, {"config": json.dumps(cfg), "source": "tools/make_model_golden.py",
                                     "torch": torch.__version__})
    print(f"{path}: mlm {float(mlm):.6f} nsp {float(nsp):.6f}")


def config(vocab, C, layers, heads, inter, max_pos):
    return dict(vocab_size=vocab, hidden_size=C, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=inter, max_position_embeddings=max_pos, type_vocab_size=2,
                layer_norm_eps=1e-12, hidden_act="gelu", hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, initializer_range=0.02)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    # Hidden 64 (a multiple of 64); a pack with 3 sequences of uneven length.
    golden("bert_h64", config(120, 64, 2, 4, 128, 40), [[7, 4, 10], [12, 9], [20]], 24, 1, out)
    # Hidden 40 (not a multiple of 64), 5 heads of 8, odd intermediate size.
    golden("bert_h40", config(73, 40, 3, 5, 72, 32), [[5, 11, 3], [1, 16], [2, 2, 2]], 20, 2, out)
