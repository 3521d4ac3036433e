#!/usr/bin/env node
// An independent reader of a Hugging Face BERT directory, as transformers' from_pretrained reads
// it (written from the transformers layout, sharing no code with packbert): config.json,
// model.safetensors (8-byte header length, JSON header, tensor data), vocab.txt,
// tokenizer_config.json and special_tokens_map.json. Checks that every tensor a BertModel of
// that config needs is there with its shape and a dtype and byte range that agree, that the
// head's tensors match config.json's architectures and labels, and that the vocabulary has
// vocab_size entries. Prints one JSON summary line; any disagreement exits 1 naming it.
// Usage: node read_hf_dir.js DIR
'use strict';
const fs = require('fs');
const path = require('path');

function fail(what) { console.error('read_hf_dir: ' + what); process.exit(1); }
const dir = process.argv[2];
const json = (name) => {
  const p = path.join(dir, name);
  if (!fs.existsSync(p)) fail(`${name} is missing`);
  return JSON.parse(fs.readFileSync(p, 'utf8'));
};
const config = json('config.json');
if (config.model_type !== 'bert') fail(`model_type is ${config.model_type}`);
const H = config.hidden_size, L = config.num_hidden_layers, I = config.intermediate_size;
const V = config.vocab_size, P = config.max_position_embeddings, T = config.type_vocab_size;
for (const [k, v] of Object.entries({hidden_size: H, num_hidden_layers: L, intermediate_size: I,
  vocab_size: V, max_position_embeddings: P, type_vocab_size: T, num_attention_heads: config.num_attention_heads}))
  if (!Number.isInteger(v) || v <= 0) fail(`config.json ${k} is ${v}`);
if (H % config.num_attention_heads) fail('hidden_size is not a multiple of num_attention_heads');

// model.safetensors
const buf = fs.readFileSync(path.join(dir, 'model.safetensors'));
const n = Number(buf.readBigUInt64LE(0));
const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
const dataLen = buf.length - 8 - n;
const sizes = {F32: 4, F16: 2, BF16: 2, F64: 8, I64: 8, I32: 4};
const tensors = {};
for (const [name, t] of Object.entries(header)) {
  if (name === '__metadata__') continue;
  const [b, e] = t.data_offsets;
  const count = t.shape.reduce((a, x) => a * x, 1);
  if (!(t.dtype in sizes)) fail(`${name}: dtype ${t.dtype}`);
  if (e - b !== count * sizes[t.dtype] || e > dataLen || b < 0) fail(`${name}: byte range ${b}..${e}`);
  tensors[name] = t;
}
const expect = {};
const want = (name, shape) => { expect[name] = shape; };
want('bert.embeddings.word_embeddings.weight', [V, H]);
want('bert.embeddings.position_embeddings.weight', [P, H]);
want('bert.embeddings.token_type_embeddings.weight', [T, H]);
want('bert.embeddings.LayerNorm.weight', [H]);
want('bert.embeddings.LayerNorm.bias', [H]);
for (let l = 0; l < L; l++) {
  const p = `bert.encoder.layer.${l}.`;
  for (const m of ['attention.self.query', 'attention.self.key', 'attention.self.value', 'attention.output.dense']) {
    want(p + m + '.weight', [H, H]); want(p + m + '.bias', [H]);
  }
  want(p + 'attention.output.LayerNorm.weight', [H]); want(p + 'attention.output.LayerNorm.bias', [H]);
  want(p + 'intermediate.dense.weight', [I, H]); want(p + 'intermediate.dense.bias', [I]);
  want(p + 'output.dense.weight', [H, I]); want(p + 'output.dense.bias', [H]);
  want(p + 'output.LayerNorm.weight', [H]); want(p + 'output.LayerNorm.bias', [H]);
}
const arch = (config.architectures || [])[0];
let labels = null;
if (arch === 'BertForSequenceClassification') {
  labels = Object.keys(config.id2label || {}).length;
  if (!labels) fail('a classifier without id2label');
  want('bert.pooler.dense.weight', [H, H]); want('bert.pooler.dense.bias', [H]);
  want('classifier.weight', [labels, H]); want('classifier.bias', [labels]);
} else if (arch === 'BertForQuestionAnswering') {
  want('qa_outputs.weight', [2, H]); want('qa_outputs.bias', [2]);
} else if (!arch) {
  fail('config.json has no architectures');
}
for (const [name, shape] of Object.entries(expect)) {
  if (!tensors[name]) fail(`model.safetensors lacks ${name}`);
  if (JSON.stringify(tensors[name].shape) !== JSON.stringify(shape))
    fail(`${name} is ${JSON.stringify(tensors[name].shape)}, config.json says ${JSON.stringify(shape)}`);
}

// The tokenizer files
const vocab = fs.readFileSync(path.join(dir, 'vocab.txt'), 'utf8').split('\n');
if (vocab[vocab.length - 1] === '') vocab.pop();
if (vocab.length !== V) fail(`vocab.txt has ${vocab.length} entries, vocab_size is ${V}`);
const tok = json('tokenizer_config.json');
if (typeof tok.do_lower_case !== 'boolean') fail('tokenizer_config.json has no do_lower_case');
const special = json('special_tokens_map.json');
for (const k of ['cls_token', 'sep_token', 'pad_token', 'unk_token', 'mask_token']) {
  const t = typeof special[k] === 'string' ? special[k] : (special[k] || {}).content;
  if (!vocab.includes(t)) fail(`special_tokens_map.json ${k} ${t} is not in vocab.txt`);
}
console.log(JSON.stringify({architecture: arch, layers: L, hidden: H, vocab: vocab.length,
  tensors: Object.keys(tensors).length, labels, do_lower_case: tok.do_lower_case,
  id2label: config.id2label || null}));
