#!/usr/bin/python3
"""Kernel goldens from the PyTorch peer: inputs, outputs and gradients of each kernel in fp32.

Run with Debian's torch:  /usr/bin/python3 tools/make_kernel_goldens.py > tests/golden/kernels.json
(GEMM outputs move in the last bit with the BLAS torch finds: kernels.json keeps the values it
was made with; a new kernel is added at the end of the stream and merged in.)
The kernel harness (tests/test_kernels.cpp, KernelHarness.*) runs packbert's float kernels on
the same inputs and compares. Every backward is driven by a fixed upstream gradient `dout`.
"""
import json
import math

import torch
import torch.nn.functional as F

torch.manual_seed(1234)


def t(x):
    return x.detach().reshape(-1).tolist()


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_()


def layernorm():
    N, C = 5, 12
    x, w, b = leaf(N, C), leaf(C), leaf(C)
    out = F.layer_norm(x, (C,), w, b, eps=1e-12)
    dout = torch.randn(N, C)
    out.backward(dout)
    return dict(N=N, C=C, inp=t(x), weight=t(w), bias=t(b), dout=t(dout), out=t(out),
                dinp=t(x.grad), dweight=t(w.grad), dbias=t(b.grad))


def gelu():
    x = leaf(64, scale=3.0)
    out = F.gelu(x)  # exact erf form
    dout = torch.randn(64)
    out.backward(dout)
    return dict(n=64, inp=t(x), dout=t(dout), out=t(out), dinp=t(x.grad))


def linear():
    N, C, OC = 6, 10, 7
    x, w, b = leaf(N, C), leaf(OC, C), leaf(OC)
    out = F.linear(x, w, b)
    dout = torch.randn(N, OC)
    out.backward(dout)
    return dict(N=N, C=C, OC=OC, inp=t(x), weight=t(w), bias=t(b), dout=t(dout), out=t(out),
                dinp=t(x.grad), dweight=t(w.grad), dbias=t(b.grad))


def cross_entropy():
    N, V = 6, 11
    z = leaf(N, V, scale=2.0)
    targets = torch.tensor([3, -100, 0, 10, 5, -100])
    losses = F.cross_entropy(z, targets, ignore_index=-100, reduction="none")
    dlosses = torch.randn(N)
    losses.backward(dlosses)
    return dict(N=N, V=V, logits=t(z), targets=targets.tolist(), dlosses=t(dlosses),
                losses=t(losses), dlogits=t(z.grad))


def attention():
    # Three sequences of uneven length packed back to back; each attends only to itself.
    C, NH = 12, 3
    hs = C // NH
    lengths = [5, 2, 6]
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    T = cu[-1]
    qkv = leaf(T, 3 * C)
    outs = []
    for s, L in enumerate(lengths):
        block = qkv[cu[s]:cu[s + 1]]
        q, k, v = block.split(C, dim=1)
        q = q.view(L, NH, hs).transpose(0, 1)
        k = k.view(L, NH, hs).transpose(0, 1)
        v = v.view(L, NH, hs).transpose(0, 1)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hs), dim=-1)
        outs.append((att @ v).transpose(0, 1).reshape(L, C))
    out = torch.cat(outs)
    dout = torch.randn(T, C)
    out.backward(dout)
    return dict(C=C, NH=NH, cu_seqlens=cu, qkv=t(qkv), dout=t(dout), out=t(out),
                dqkv=t(qkv.grad))


def embedding():
    V, P, Y, C = 9, 8, 2, 6
    word, pos, typ = leaf(V, C), leaf(P, C), leaf(Y, C)
    ids = torch.tensor([1, 8, 3, 3, 0, 5, 1])
    positions = torch.tensor([0, 1, 2, 0, 1, 2, 3])  # reset at each sequence start
    types = torch.tensor([0, 0, 1, 0, 0, 1, 1])
    out = F.embedding(ids, word) + F.embedding(positions, pos) + F.embedding(types, typ)
    dout = torch.randn(len(ids), C)
    out.backward(dout)
    return dict(V=V, P=P, Y=Y, C=C, ids=ids.tolist(), pos=positions.tolist(),
                types=types.tolist(), word=t(word), position=t(pos), token_type=t(typ),
                dout=t(dout), out=t(out), dword=t(word.grad), dposition=t(pos.grad),
                dtoken_type=t(typ.grad))


def tanh():
    x = leaf(40, scale=2.0)
    out = torch.tanh(x)
    dout = torch.randn(40)
    out.backward(dout)
    return dict(n=40, inp=t(x), dout=t(dout), out=t(out), dinp=t(x.grad))


def gather_rows():
    # Rows picked by index, repeats included (the MLM head's masked tokens, the pooler's [CLS]).
    N, C = 7, 5
    x = leaf(N, C)
    rows = torch.tensor([3, 0, 3, 6])
    out = x[rows]
    dout = torch.randn(len(rows), C)
    out.backward(dout)
    return dict(N=N, C=C, rows=rows.tolist(), inp=t(x), dout=t(dout), out=t(out),
                dinp=t(x.grad))


def span_cross_entropy():
    # Start and end logits per token; each sequence's softmax runs over its own tokens;
    # loss = (CE(start) + CE(end)) / 2, 0 for a sequence without an answer (targets -1).
    lengths = [4, 6, 3]
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    targets = [[1, 3], [-1, -1], [0, 2]]
    logits = leaf(cu[-1], 2, scale=2.0)
    losses = []
    for s, L in enumerate(lengths):
        if targets[s][0] < 0:
            losses.append(logits.sum() * 0)
            continue
        block = logits[cu[s]:cu[s + 1]]
        ce = sum(F.cross_entropy(block[:, e].unsqueeze(0), torch.tensor([targets[s][e]]))
                 for e in range(2))
        losses.append(ce / 2)
    losses = torch.stack(losses)
    dlosses = torch.randn(len(lengths))
    losses.backward(dlosses)
    return dict(cu_seqlens=cu, targets=[y for pair in targets for y in pair], logits=t(logits),
                dlosses=t(dlosses), losses=t(losses), dlogits=t(logits.grad))


def sparse_linear(B):
    # A block-sparse weight is a dense one with its other blocks zero: the peer is F.linear on
    # the masked dense weight; the value gradients are its gradient read at the kept blocks.
    N, C, OC = 7, 32, 48
    R, Cb = OC // B, C // B
    kept = max(1, round(0.3 * R * Cb))
    ids = torch.randperm(R * Cb)[:kept].tolist()
    slot_row, slot_col = [i // Cb for i in ids], [i % Cb for i in ids]
    values = leaf(kept, B, B, scale=0.5)
    x, b = leaf(N, C), leaf(OC)
    w = torch.zeros(OC, C)
    for s, (r, c) in enumerate(zip(slot_row, slot_col)):
        w = w.index_put((torch.arange(r * B, r * B + B).unsqueeze(1),
                         torch.arange(c * B, c * B + B).unsqueeze(0)), values[s])
    out = F.linear(x, w, b)
    dout = torch.randn(N, OC)
    out.backward(dout)
    return dict(N=N, C=C, OC=OC, block=B, slot_row=slot_row, slot_col=slot_col, inp=t(x),
                values=t(values), bias=t(b), dout=t(dout), out=t(out), dinp=t(x.grad),
                dvalues=t(values.grad), dbias=t(b.grad))


def squared_error():
    # The regression head's loss (BertForSequenceClassification with one label: MSELoss) per
    # row, before its mean; the gradient reaches both the predictions and the targets.
    N = 7
    pred, target = leaf(N, scale=2.0), leaf(N, scale=2.0)
    losses = F.mse_loss(pred, target, reduction="none")
    dlosses = torch.randn(N)
    losses.backward(dlosses)
    return dict(N=N, pred=t(pred), target=t(target), dlosses=t(dlosses), losses=t(losses),
                dpred=t(pred.grad), dtarget=t(target.grad))


def geglu():
    # ModernBERT's MLP activation (transformers' ModernBertMLP): input, gate = Wi(x).chunk(2, -1);
    # act(input) * gate, act the exact GELU.
    N, I = 5, 9
    x = leaf(N, 2 * I, scale=2.0)
    a, g = x.chunk(2, dim=-1)
    out = F.gelu(a) * g
    dout = torch.randn(N, I)
    out.backward(dout)
    return dict(N=N, I=I, inp=t(x), dout=t(dout), out=t(out), dinp=t(x.grad))


def rotary():
    # ModernBERT's rotary embedding as transformers computes it (ModernBertRotaryEmbedding,
    # rotate_half, apply_rotary_pos_emb) in float32, over the heads of a packed batch of two
    # sequences (positions restart) and a token far along a third.
    H, D, theta = 2, 8, 160000.0
    pos = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 300])
    N = len(pos)
    x = leaf(N, H * D)
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = (inv_freq[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    q = x.view(N, H, D)
    rotated = torch.cat((-q[..., D // 2:], q[..., :D // 2]), dim=-1)
    out = (q * cos + rotated * sin).reshape(N, H * D)
    dout = torch.randn(N, H * D)
    out.backward(dout)
    return dict(N=N, heads=H, D=D, theta=int(theta), pos=pos.tolist(), inp=t(x), dout=t(dout),
                out=t(out), dinp=t(x.grad))


def layernorm_nobias():
    # ModernBERT's LayerNorm: no bias (norm_bias false), eps 1e-5 (norm_eps).
    N, C = 5, 12
    x, w = leaf(N, C), leaf(C)
    out = F.layer_norm(x, (C,), w, None, eps=1e-5)
    dout = torch.randn(N, C)
    out.backward(dout)
    return dict(N=N, C=C, inp=t(x), weight=t(w), dout=t(dout), out=t(out), dinp=t(x.grad),
                dweight=t(w.grad))


def attention_local():
    # Sliding-window attention as transformers' ModernBERT masks its local layers: query i sees
    # key j of its own sequence when |i - j| <= local_attention // 2 (here window 8: 4 each
    # side), the others at -inf before the softmax. Sequences longer than packbert's band of 40
    # keys (70: three tiles, 45: two), one seen whole (5) and one a single masked tile (20).
    C, NH, window = 8, 2, 8
    hs = C // NH
    lengths = [70, 5, 20, 45]
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    T = cu[-1]
    qkv = leaf(T, 3 * C)
    outs = []
    for s, L in enumerate(lengths):
        block = qkv[cu[s]:cu[s + 1]]
        q, k, v = (x.view(L, NH, hs).transpose(0, 1) for x in block.split(C, dim=1))
        rows = torch.arange(L).unsqueeze(0)
        far = (rows - rows.T).abs() > window // 2
        scores = (q @ k.transpose(1, 2) / math.sqrt(hs)).masked_fill(far, float("-inf"))
        outs.append((torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(L, C))
    out = torch.cat(outs)
    dout = torch.randn(T, C)
    out.backward(dout)
    return dict(C=C, NH=NH, window=window, cu_seqlens=cu, qkv=t(qkv), dout=t(dout), out=t(out),
                dqkv=t(qkv.grad))


# (each kernel draws from the one seeded stream in this order: add new ones at the end)
goldens = dict(torch_version=torch.__version__, layernorm=layernorm(), gelu=gelu(),
               linear=linear(), cross_entropy=cross_entropy(), attention=attention(),
               embedding=embedding(), tanh=tanh(), gather_rows=gather_rows(),
               span_cross_entropy=span_cross_entropy(),
               **{f"sparse_linear_b{B}": sparse_linear(B) for B in (1, 4, 8, 16)},
               squared_error=squared_error(), geglu=geglu(),
               rotary=rotary(), layernorm_nobias=layernorm_nobias(),
               attention_local=attention_local())
print(json.dumps(goldens))
