#!/usr/bin/python3
"""Small ModernBERT model directories as transformers' save_pretrained writes them, made with torch.

Run with Debian's torch:  /usr/bin/python3 tools/make_modernbert_fixture.py tests/data/modernbert
(transformers and the safetensors package are not Debian packages, so neither is used: the module
tree below is written from transformers' modeling_modernbert.py (ModernBertEmbeddings,
ModernBertAttention, ModernBertMLP, ModernBertEncoderLayer with layer 0's attn_norm an Identity,
ModernBertPredictionHead, the tied decoder) and the state dict is saved in the safetensors layout
by hand: an 8-byte header length, the JSON header sorted by name, the little-endian bytes. As
save_pretrained does, the decoder's weight, tied to the token embeddings, is left out.)

Writes <out>/mlm (ModernBertForMaskedLM), <out>/classifier (ModernBertForSequenceClassification,
3 labels, mean pooling, biases in the norms and linears) and <out>/qa
(ModernBertForQuestionAnswering), each with config.json (every field ModernBertConfig writes, in
transformers 4.48's keys) and model.safetensors. Weights are random (not an initialisation): a
round trip must keep every bit.
"""
import json
import os
import struct
import sys

import torch
from torch import nn

torch.manual_seed(61)


class Norm(nn.Module):  # nn.LayerNorm with bias=norm_bias (torch 1.13's LayerNorm has no `bias`)
    def __init__(self, C, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        if bias:
            self.bias = nn.Parameter(torch.zeros(C))


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"],
                                           padding_idx=c["pad_token_id"])
        self.norm = Norm(c["hidden_size"], c["norm_bias"])


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["hidden_size"]
        self.Wqkv = nn.Linear(C, 3 * C, bias=c["attention_bias"])
        self.Wo = nn.Linear(C, C, bias=c["attention_bias"])


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, I = c["hidden_size"], c["intermediate_size"]
        self.Wi = nn.Linear(C, 2 * I, bias=c["mlp_bias"])
        self.Wo = nn.Linear(I, C, bias=c["mlp_bias"])


class Layer(nn.Module):
    def __init__(self, c, layer_id):
        super().__init__()
        C = c["hidden_size"]
        self.attn_norm = (nn.Identity() if layer_id == 0 else
                          Norm(C, c["norm_bias"]))
        self.attn = Attention(c)
        self.mlp_norm = Norm(C, c["norm_bias"])
        self.mlp = MLP(c)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.layers = nn.ModuleList(Layer(c, i) for i in range(c["num_hidden_layers"]))
        self.final_norm = Norm(c["hidden_size"], c["norm_bias"])


class PredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["hidden_size"]
        self.dense = nn.Linear(C, C, bias=c["classifier_bias"])
        self.norm = Norm(C, c["norm_bias"])


class ForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = Model(c)
        self.head = PredictionHead(c)
        self.decoder = nn.Linear(c["hidden_size"], c["vocab_size"], bias=c["decoder_bias"])
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight  # tied


class ForTask(nn.Module):  # ForSequenceClassification and ForQuestionAnswering alike
    def __init__(self, c, outputs):
        super().__init__()
        self.model = Model(c)
        self.head = PredictionHead(c)
        self.classifier = nn.Linear(c["hidden_size"], outputs)


def config(architecture, **changes):
    c = dict(architectures=[architecture], model_type="modernbert", vocab_size=64,
             hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=2,
             hidden_activation="gelu", max_position_embeddings=512, initializer_range=0.02,
             initializer_cutoff_factor=2.0, norm_eps=1e-05, norm_bias=False, pad_token_id=60,
             eos_token_id=62, bos_token_id=61, cls_token_id=61, sep_token_id=62,
             global_rope_theta=160000.0, attention_bias=False, attention_dropout=0.0,
             global_attn_every_n_layers=3, local_attention=8, local_rope_theta=10000.0,
             embedding_dropout=0.0, mlp_bias=False, mlp_dropout=0.0, decoder_bias=True,
             classifier_pooling="cls", classifier_dropout=0.0, classifier_bias=False,
             classifier_activation="gelu", deterministic_flash_attn=False,
             sparse_prediction=False, sparse_pred_ignore_index=-100, tie_word_embeddings=True,
             torch_dtype="float32", transformers_version="4.48.0")
    c.update(changes)
    return c


def save(module, c, directory, skip=()):
    os.makedirs(directory, exist_ok=True)
    state = {k: v for k, v in module.state_dict().items() if k not in skip}
    for v in state.values():  # random values everywhere, norms and biases included
        with torch.no_grad():
            v.copy_(torch.randn(v.shape))
    header, blobs, at = {}, [], 0
    for name in sorted(state):
        data = state[name].contiguous().numpy().astype("<f4").tobytes()
        header[name] = dict(dtype="F32", shape=list(state[name].shape),
                            data_offsets=[at, at + len(data)])
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")


out = sys.argv[1]
mlm = config("ModernBertForMaskedLM")
save(ForMaskedLM(mlm), mlm, os.path.join(out, "mlm"), skip=("decoder.weight",))
labels = {"0": "negative", "1": "neutral", "2": "positive"}
cls = config("ModernBertForSequenceClassification", classifier_pooling="mean", norm_bias=True,
             attention_bias=True, mlp_bias=True, classifier_bias=True, id2label=labels,
             label2id={v: int(k) for k, v in labels.items()})
save(ForTask(cls, 3), cls, os.path.join(out, "classifier"))
qa = config("ModernBertForQuestionAnswering")
save(ForTask(qa, 2), qa, os.path.join(out, "qa"))
