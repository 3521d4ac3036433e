#!/usr/bin/python3
"""Whole-model goldens from a ModernBertForMaskedLM written in plain PyTorch.

Run with Debian's torch (no `transformers` needed):
    /usr/bin/python3 tools/make_modernbert_golden.py tests/golden tests/data/modernbert/golden_mlm

The model is written from transformers' modeling_modernbert.py, eager attention path: embeddings
(tok_embeddings, norm), pre-LN layers (layer 0's attn_norm an Identity; Wqkv viewed as
[3, heads, head_dim]; rotary with rotate_half, theta global_rope_theta on every
global_attn_every_n_layers-th layer from layer 0 and local_rope_theta on the others; scores
scaled by head_dim ** -0.5; the local layers' sliding-window mask |i - j| <= local_attention // 2
added to the padding mask; softmax in float32 semantics; GeGLU MLP: Wi's output chunked in two,
gelu(first) * second), final_norm, the prediction head (dense, exact GELU, norm) and the decoder
tied to the token embeddings with its bias. LayerNorms without bias when norm_bias is false.

Unlike packbert, which packs several sequences into a row and restarts positions per sequence,
the reference runs the batch's sequences PADDED, one per row, as transformers' eager path does
(padding keys masked, positions 0..S-1 per row): packbert's packed forward/backward must reproduce
that. Written in the golden file format of docs/FORMATS.md (tools/make_model_golden.py): model
tensors under their Hugging Face names, the packed batch (int32), expected.mlm_loss,
expected.nsp_loss (0: ModernBERT has no NSP head) and grad.<name> for every parameter, config JSON
in the metadata under "config". Reference arithmetic is float64 on float32-rounded parameters.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_model_golden import make_batch, randomize, save_safetensors  # noqa: E402


class Norm(nn.Module):
    def __init__(self, C, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class Layer(nn.Module):
    def __init__(self, c, layer_id):
        super().__init__()
        C, I = c["hidden_size"], c["intermediate_size"]
        self.attn_norm = nn.Identity() if layer_id == 0 else Norm(C, c["norm_bias"], c["norm_eps"])
        self.attn = nn.Module()
        self.attn.Wqkv = nn.Linear(C, 3 * C, bias=c["attention_bias"])
        self.attn.Wo = nn.Linear(C, C, bias=c["attention_bias"])
        self.mlp_norm = Norm(C, c["norm_bias"], c["norm_eps"])
        self.mlp = nn.Module()
        self.mlp.Wi = nn.Linear(C, 2 * I, bias=c["mlp_bias"])
        self.mlp.Wo = nn.Linear(I, C, bias=c["mlp_bias"])
        self.is_global = layer_id % c["global_attn_every_n_layers"] == 0
        self.theta = c["global_rope_theta"] if self.is_global else c["local_rope_theta"]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(D, theta, S, dtype):
    # ModernBertRotaryEmbedding: inv_freq and the angles in float32, as transformers computes them
    inv_freq = 1.0 / (torch.tensor(float(theta), dtype=torch.float32) **
                      (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).double()
    return emb.cos().to(dtype), emb.sin().to(dtype)


class ModernBertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["hidden_size"]
        self.c = c
        self.model = nn.Module()
        self.model.embeddings = nn.Module()
        self.model.embeddings.tok_embeddings = nn.Embedding(c["vocab_size"], C)
        self.model.embeddings.norm = Norm(C, c["norm_bias"], c["norm_eps"])
        self.model.layers = nn.ModuleList(Layer(c, i) for i in range(c["num_hidden_layers"]))
        self.model.final_norm = Norm(C, c["norm_bias"], c["norm_eps"])
        self.head = nn.Module()
        self.head.dense = nn.Linear(C, C, bias=c["classifier_bias"])
        self.head.norm = Norm(C, c["norm_bias"], c["norm_eps"])
        self.decoder_bias = nn.Parameter(torch.zeros(c["vocab_size"]))

    def forward(self, ids, valid):
        """ids, valid: [n, S] (valid: a real token). Returns the MLM logits [n, S, V]."""
        h = self.encode(ids, valid)
        t = self.head.norm(F.gelu(self.head.dense(h)))
        return t @ self.model.embeddings.tok_embeddings.weight.T + self.decoder_bias

    def encode(self, ids, valid):
        """The final norm's output [n, S, C]."""
        c = self.c
        n, S = ids.shape
        NH = c["num_attention_heads"]
        C = c["hidden_size"]
        D = C // NH
        h = self.model.embeddings.norm(self.model.embeddings.tok_embeddings(ids))
        neg = torch.finfo(h.dtype).min
        pad_mask = torch.zeros(n, 1, 1, S, dtype=h.dtype).masked_fill(~valid[:, None, None, :], neg)
        dist = (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs()
        window = dist <= c["local_attention"] // 2
        local_mask = pad_mask.masked_fill(~window[None, None], neg)
        for layer in self.model.layers:
            qkv = layer.attn.Wqkv(layer.attn_norm(h)).view(n, S, 3, NH, D)
            q, k, v = qkv.transpose(3, 1).unbind(dim=2)  # [n, NH, S, D] each
            cos, sin = rotary_cos_sin(D, layer.theta, S, h.dtype)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            scores = q @ k.transpose(2, 3) * D ** -0.5
            scores = scores + (pad_mask if layer.is_global else local_mask)
            att = torch.softmax(scores, dim=-1) @ v
            h = h + layer.attn.Wo(att.transpose(1, 2).reshape(n, S, C))
            x, gate = layer.mlp.Wi(layer.mlp_norm(h)).chunk(2, dim=-1)
            h = h + layer.mlp.Wo(F.gelu(x) * gate)
        return self.model.final_norm(h)


class ModernBertForTask(ModernBertForMaskedLM):
    """ModernBertForSequenceClassification (outputs = num_labels) or ModernBertForQuestionAnswering
    (outputs = 2): the prediction head, then `classifier`; no decoder."""

    def __init__(self, c, outputs):
        super().__init__(c)
        del self.decoder_bias
        self.classifier = nn.Linear(c["hidden_size"], outputs)

    def sequence_logits(self, ids):
        """One sequence [L] alone: its pooled logits [outputs]."""
        h = self.encode(ids[None], torch.ones(1, len(ids), dtype=torch.bool))[0]
        pooled = h.mean(dim=0) if self.c["classifier_pooling"] == "mean" else h[0]
        return self.classifier(self.head.norm(F.gelu(self.head.dense(pooled))))

    def token_logits(self, ids):
        """One sequence [L] alone: start and end logits [L, 2]."""
        h = self.encode(ids[None], torch.ones(1, len(ids), dtype=torch.bool))[0]
        return self.classifier(self.head.norm(F.gelu(self.head.dense(h))))


def padded(batch):
    """The packed batch's sequences one per row, padded: ids, valid, labels [n, S]."""
    seqs = []
    B = batch["input_ids"].shape[0]
    for b in range(B):
        for k in range(1, int(batch["sequence_ids"][b].max()) + 1):
            idx = (batch["sequence_ids"][b] == k).nonzero().flatten()
            seqs.append((batch["input_ids"][b, idx].long(), batch["mlm_labels"][b, idx].long()))
    S = max(len(s[0]) for s in seqs)
    ids = torch.zeros(len(seqs), S, dtype=torch.long)
    labels = torch.full((len(seqs), S), -100, dtype=torch.long)
    valid = torch.zeros(len(seqs), S, dtype=torch.bool)
    for i, (x, y) in enumerate(seqs):
        ids[i, :len(x)], labels[i, :len(x)], valid[i, :len(x)] = x, y, True
    return ids, valid, labels


def golden(name, cfg, packs, S, seed, out_dir, model_dir=None):
    torch.manual_seed(seed)
    model = ModernBertForMaskedLM(cfg)
    randomize(model)
    params = {n.replace("decoder_bias", "decoder.bias"): p.detach().float().clone()
              for n, p in model.named_parameters()}
    model = model.double()
    g = torch.Generator().manual_seed(seed + 1)
    batch = make_batch(g, cfg, packs, S)
    batch["token_type_ids"].zero_()
    batch["nsp_labels"].fill_(-100)
    ids, valid, labels = padded(batch)
    logits = model(ids, valid)
    masked = labels != -100
    mlm = F.cross_entropy(logits[masked], labels[masked])
    mlm.backward()
    tensors = dict(params)
    tensors.update(batch)
    tensors["expected.mlm_loss"] = torch.tensor(float(mlm), dtype=torch.float32)
    tensors["expected.nsp_loss"] = torch.tensor(0.0, dtype=torch.float32)
    for n, p in model.named_parameters():
        tensors["grad." + n.replace("decoder_bias", "decoder.bias")] = p.grad.float()
    path = f"{out_dir}/{name}.safetensors"
    save_safetensors(path, tensors, {"config": json.dumps(cfg),
                                     "source": "tools/make_modernbert_golden.py",
                                     "torch": torch.__version__})
    print(f"{path}: mlm {float(mlm):.6f}")
    if model_dir:  # the same model as a transformers-layout directory (eval --model's input)
        os.makedirs(model_dir, exist_ok=True)
        save_safetensors(f"{model_dir}/model.safetensors", params, {"format": "pt"})
        with open(f"{model_dir}/config.json", "w") as f:
            json.dump(dict(cfg, transformers_version="4.48.0", torch_dtype="float32"), f, indent=2)
            f.write("\n")
        print(f"{model_dir}: config.json, model.safetensors")


def task_golden(name, cfg, packs, S, seed, out_dir, outputs):
    """A classifier (outputs = num_labels) or QA (outputs = 2) golden: the batch's class_labels
    or span_starts / span_ends [n_seq], expected.cls_loss or expected.span_loss (the mean over
    sequences; QA: of (start CE + end CE) / 2 over each sequence's own tokens), each sequence
    run alone."""
    torch.manual_seed(seed)
    model = ModernBertForTask(cfg, outputs)
    randomize(model)
    params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    model = model.double()
    g = torch.Generator().manual_seed(seed + 1)
    batch = make_batch(g, cfg, packs, S)
    batch["token_type_ids"].zero_()
    batch["nsp_labels"].fill_(-100)
    batch["mlm_labels"].fill_(-100)
    ids, valid, _ = padded(batch)
    lengths = valid.sum(dim=1).tolist()
    qa = outputs == 2 and cfg["architectures"][0] == "ModernBertForQuestionAnswering"
    losses, labels, starts, ends = [], [], [], []
    for i, L in enumerate(lengths):
        x = ids[i, :L]
        if qa:
            a = int(torch.randint(0, L, (1,), generator=g))
            b = min(L - 1, a + int(torch.randint(0, 4, (1,), generator=g)))
            z = model.token_logits(x)
            losses.append((F.cross_entropy(z[:, 0][None], torch.tensor([a])) +
                           F.cross_entropy(z[:, 1][None], torch.tensor([b]))) / 2)
            starts.append(a), ends.append(b)
        else:
            y = int(torch.randint(0, outputs, (1,), generator=g))
            losses.append(F.cross_entropy(model.sequence_logits(x)[None], torch.tensor([y])))
            labels.append(y)
    loss = torch.stack(losses).mean()
    loss.backward()
    tensors = dict(params)
    tensors.update(batch)
    if qa:
        tensors["span_starts"] = torch.tensor(starts, dtype=torch.int32)
        tensors["span_ends"] = torch.tensor(ends, dtype=torch.int32)
        tensors["expected.span_loss"] = torch.tensor(float(loss), dtype=torch.float32)
    else:
        tensors["class_labels"] = torch.tensor(labels, dtype=torch.int32)
        tensors["expected.cls_loss"] = torch.tensor(float(loss), dtype=torch.float32)
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.float()
    path = f"{out_dir}/{name}.safetensors"
    save_safetensors(path, tensors, {"config": json.dumps(cfg),
                                     "source": "tools/make_modernbert_golden.py",
                                     "torch": torch.__version__})
    print(f"{path}: {'span' if qa else 'cls'} {float(loss):.6f}")


def config(vocab, C, layers, heads, inter, every, window, **changes):
    c = dict(architectures=["ModernBertForMaskedLM"], model_type="modernbert", vocab_size=vocab,
             hidden_size=C, intermediate_size=inter, num_hidden_layers=layers,
             num_attention_heads=heads, hidden_activation="gelu", max_position_embeddings=512,
             norm_eps=1e-05, norm_bias=False, global_rope_theta=160000.0, attention_bias=False,
             attention_dropout=0.0, global_attn_every_n_layers=every, local_attention=window,
             local_rope_theta=10000.0, embedding_dropout=0.0, mlp_bias=False, mlp_dropout=0.0,
             decoder_bias=True, classifier_bias=False, tie_word_embeddings=True)
    c.update(changes)
    return c


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    # ModernBERT's defaults (no biases but the decoder's), 4 layers with global attention on
    # layers 0 and 3, window 8 (4 each side): sequences up to 4x the window, and some shorter.
    # Its model is also written as a ModernBertForMaskedLM directory, which
    # tests/test_modernbert.cpp evaluates (`eval --model`) on these sequences and masks.
    golden("modernbert_mlm", config(96, 32, 4, 2, 40, 3, 8),
           [[20, 13], [34], [5, 9, 11]], 36, 3, out,
           model_dir=sys.argv[2] if len(sys.argv) > 2 else "tests/data/modernbert/golden_mlm")
    # Every bias on, a global layer every 2nd, window 6 and other thetas, 3 heads of 8.
    golden("modernbert_bias", config(80, 24, 3, 3, 30, 2, 6, norm_bias=True, attention_bias=True,
                                     mlp_bias=True, classifier_bias=True, global_rope_theta=5000.0,
                                     local_rope_theta=500.0, norm_eps=1e-6),
           [[17, 2, 9], [25], [1, 12, 14]], 30, 4, out)
    # The task heads: mean pooling with every bias on, first-token pooling, and QA; sequences
    # longer than the window, packed three to a row.
    task_golden("modernbert_cls_mean",
                config(64, 24, 3, 3, 30, 2, 6, architectures=["ModernBertForSequenceClassification"],
                       classifier_pooling="mean", norm_bias=True, attention_bias=True,
                       mlp_bias=True, classifier_bias=True, num_labels=3),
                [[17, 2, 9], [25], [1, 12, 14]], 30, 5, out, 3)
    task_golden("modernbert_cls_first",
                config(64, 24, 3, 3, 30, 2, 6, architectures=["ModernBertForSequenceClassification"],
                       classifier_pooling="cls", num_labels=4),
                [[17, 2, 9], [25], [1, 12, 14]], 30, 6, out, 4)
    task_golden("modernbert_qa",
                config(64, 24, 3, 3, 30, 2, 6, architectures=["ModernBertForQuestionAnswering"]),
                [[17, 2, 9], [25], [1, 12, 14]], 30, 7, out, 2)
