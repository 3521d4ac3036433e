#!/usr/bin/env node
// GPT-2's byte-level BPE as the npm package gpt-3-encoder implements it (OpenAI's encoder.py in
// JavaScript), one line of ids per input line: the reference for packbert's tokenizer.json
// reader. Usage: node gpt2_reference.js GPT3_ENCODER_PACKAGE_DIR < lines.txt
'use strict';
const {encode} = require(require('path').resolve(process.argv[2], 'Encoder.js'));
const lines = require('fs').readFileSync(0, 'utf8').split('\n');
if (lines[lines.length - 1] === '') lines.pop();
process.stdout.write(lines.map((l) => encode(l).join(' ')).join('\n') + '\n');
