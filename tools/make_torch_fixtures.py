#!/usr/bin/python3
"""Writes tests/data/torch/: small BERT state_dicts saved by torch.save in the forms
`packbert convert` and `--init` read, and the tensors they must come out as.

Run with Debian's python3-torch:  /usr/bin/python3 tools/make_torch_fixtures.py
(CI needs no torch: the outputs are committed.)

  tied/            config.json, vocab.txt, pytorch_model.bin: fp32 BertForPreTraining with the
                   decoder tied to the word embeddings (one shared storage), q/k/v cut from one
                   fused buffer (views at storage offsets), a transposed (strided) FFN weight and
                   the int64 position_ids buffer (an expanded view)
  sharded/         the same tensors in two shards + pytorch_model.bin.index.json
  half/, bfloat16/ the same model stored as fp16 / bf16 (config.json beside)
  old_names.bin    a bare BertModel (no "bert." prefix) with LayerNorm gamma/beta, no config
  evil.bin         the tied state_dict plus an object whose pickle calls os.system
  legacy.bin       the tied state_dict in the pre-1.6 (non-zip) format
  expected*.safetensors  every tensor as convert must write it (names, dtype, bytes)
"""
import json
import os
import struct
from collections import OrderedDict

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "torch")
C, I, L, V, P = 16, 32, 2, 40, 24
CONFIG = {
    "architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": V,
    "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": 2, "intermediate_size": I,
    "max_position_embeddings": P, "type_vocab_size": 2, "hidden_act": "gelu",
    "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
}


def state_dict():
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)
    sd = OrderedDict()
    sd["bert.embeddings.position_ids"] = torch.arange(P).expand((1, -1))
    sd["bert.embeddings.word_embeddings.weight"] = r(V, C)
    sd["bert.embeddings.position_embeddings.weight"] = r(P, C)
    sd["bert.embeddings.token_type_embeddings.weight"] = r(2, C)
    sd["bert.embeddings.LayerNorm.weight"] = 1 + 0.1 * r(C)
    sd["bert.embeddings.LayerNorm.bias"] = 0.1 * r(C)
    for l in range(L):
        p = f"bert.encoder.layer.{l}."
        qkv = r(3 * C, C)  # one buffer: q, k and v are views into it at offsets 0, C*C, 2*C*C
        for k, name in enumerate(["query", "key", "value"]):
            sd[p + f"attention.self.{name}.weight"] = qkv[k * C:(k + 1) * C]
            sd[p + f"attention.self.{name}.bias"] = r(C)
        sd[p + "attention.output.dense.weight"] = r(C, C)
        sd[p + "attention.output.dense.bias"] = r(C)
        sd[p + "attention.output.LayerNorm.weight"] = 1 + 0.1 * r(C)
        sd[p + "attention.output.LayerNorm.bias"] = 0.1 * r(C)
        sd[p + "intermediate.dense.weight"] = r(C, I).t()  # [I, C] with strides (1, I)
        sd[p + "intermediate.dense.bias"] = r(I)
        sd[p + "output.dense.weight"] = r(C, I)
        sd[p + "output.dense.bias"] = r(C)
        sd[p + "output.LayerNorm.weight"] = 1 + 0.1 * r(C)
        sd[p + "output.LayerNorm.bias"] = 0.1 * r(C)
    sd["bert.pooler.dense.weight"] = r(C, C)
    sd["bert.pooler.dense.bias"] = r(C)
    sd["cls.predictions.bias"] = r(V)
    sd["cls.predictions.transform.dense.weight"] = r(C, C)
    sd["cls.predictions.transform.dense.bias"] = r(C)
    sd["cls.predictions.transform.LayerNorm.weight"] = 1 + 0.1 * r(C)
    sd["cls.predictions.transform.LayerNorm.bias"] = 0.1 * r(C)
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]  # tied
    sd["cls.predictions.decoder.bias"] = sd["cls.predictions.bias"]
    sd["cls.seq_relationship.weight"] = r(2, C)
    sd["cls.seq_relationship.bias"] = r(2)
    return sd


def cast(sd, dtype):
    """The same model in `dtype`, keeping the shared storages and views (cast the bases)."""
    out, done = OrderedDict(), {}
    for k, t in sd.items():
        if not t.is_floating_point():
            out[k] = t
            continue
        base = t._base if t._base is not None else t
        if id(base) not in done:
            done[id(base)] = base.to(dtype)
        nb = done[id(base)]
        out[k] = nb.as_strided(t.shape, t.stride(), t.storage_offset())
    return out


def write_safetensors(path, tensors):
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64"}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        b = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def save_dir(name, sd):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    return d


class Evil:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def main():
    os.makedirs(OUT, exist_ok=True)
    sd = state_dict()
    d = save_dir("tied", sd)
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                          [f"tok{i}" for i in range(V - 5)]) + "\n")
    write_safetensors(os.path.join(OUT, "expected.safetensors"), sd)

    d = save_dir("sharded", sd)
    keys = list(sd)
    shards = [keys[:len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save(OrderedDict((k, sd[k]) for k in part), os.path.join(d, fname))
        weight_map.update({k: fname for k in part})
    with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)

    for name, dtype in [("half", torch.float16), ("bfloat16", torch.bfloat16)]:
        low = cast(sd, dtype)
        assert low["cls.predictions.decoder.weight"].storage().data_ptr() == \
            low["bert.embeddings.word_embeddings.weight"].storage().data_ptr()
        d = save_dir(name, low)
        torch.save(low, os.path.join(d, "pytorch_model.bin"))
        write_safetensors(os.path.join(OUT, f"expected_{name}.safetensors"), low)

    old = OrderedDict()
    for k, t in sd.items():
        if k.startswith("bert."):
            k = k[len("bert."):].replace("LayerNorm.weight", "LayerNorm.gamma")
            old[k.replace("LayerNorm.bias", "LayerNorm.beta")] = t
    torch.save(old, os.path.join(OUT, "old_names.bin"))

    evil = OrderedDict(sd)
    evil["zz"] = Evil()
    torch.save(evil, os.path.join(OUT, "evil.bin"))
    torch.save(sd, os.path.join(OUT, "legacy.bin"), _use_new_zipfile_serialization=False)


if __name__ == "__main__":
    main()
