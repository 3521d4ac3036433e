#!/usr/bin/env node
// An independent reader of TensorBoard event files (written here from the TFRecord and
// tensorflow.Event formats, sharing no code with packbert's writer): checks every record's two
// masked CRC-32C sums, decodes the protocol buffers and prints one JSON line per scalar,
// {"file", "step", "tag", "value"}, plus {"file", "step", "session_log": status} and
// {"file", "file_version"} lines. Usage: node read_tfevents.js DIR_OR_FILE...
'use strict';
const fs = require('fs');
const path = require('path');

const TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (0x82f63b78 ^ (c >>> 1)) >>> 0 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();
function crc32c(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = (TABLE[(c ^ b) & 0xff] ^ (c >>> 8)) >>> 0;
  return (c ^ 0xffffffff) >>> 0;
}
function masked(buf) {
  const c = crc32c(buf);
  return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

// Protocol buffer fields: [{field, wire, value}] with value a BigInt (varint), Buffer
// (length-delimited, fixed64, fixed32).
function fields(buf) {
  const out = [];
  let at = 0;
  const varint = () => {
    let v = 0n, shift = 0n;
    for (;;) {
      if (at >= buf.length) throw new Error('varint runs past the message');
      const b = buf[at++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  };
  while (at < buf.length) {
    const key = Number(varint());
    const field = key >>> 3, wire = key & 7;
    let value;
    if (wire === 0) value = varint();
    else if (wire === 1) { value = buf.subarray(at, at + 8); at += 8; }
    else if (wire === 5) { value = buf.subarray(at, at + 4); at += 4; }
    else if (wire === 2) { const n = Number(varint()); value = buf.subarray(at, at + n); at += n; }
    else throw new Error('unknown wire type ' + wire);
    if (at > buf.length) throw new Error('field runs past the message');
    out.push({field, wire, value});
  }
  return out;
}

function readFile(file) {
  const data = fs.readFileSync(file);
  const name = path.basename(file);
  let at = 0;
  while (at < data.length) {
    if (at + 12 > data.length) throw new Error(`${file}: a record's header is cut short`);
    const lenBytes = data.subarray(at, at + 8);
    if (data.readUInt32LE(at + 8) !== masked(lenBytes)) throw new Error(`${file}: bad length CRC at ${at}`);
    const n = Number(data.readBigUInt64LE(at));
    const body = data.subarray(at + 12, at + 12 + n);
    if (at + 16 + n > data.length) throw new Error(`${file}: a record is cut short`);
    if (data.readUInt32LE(at + 12 + n) !== masked(body)) throw new Error(`${file}: bad data CRC at ${at}`);
    at += 16 + n;
    let step = 0;
    for (const f of fields(body)) {
      if (f.field === 2 && f.wire === 0) step = Number(f.value);
    }
    for (const f of fields(body)) {
      if (f.field === 3 && f.wire === 2) console.log(JSON.stringify({file: name, file_version: f.value.toString()}));
      if (f.field === 6 && f.wire === 2) {
        let status = 0;
        for (const g of fields(f.value)) if (g.field === 1) status = Number(g.value);
        console.log(JSON.stringify({file: name, step, session_log: status}));
      }
      if (f.field === 5 && f.wire === 2) {
        for (const v of fields(f.value)) {
          if (v.field !== 1) continue;
          let tag = null, value = null;
          for (const g of fields(v.value)) {
            if (g.field === 1 && g.wire === 2) tag = g.value.toString();
            if (g.field === 2 && g.wire === 5) value = g.value.readFloatLE(0);
          }
          console.log(JSON.stringify({file: name, step, tag, value}));
        }
      }
    }
  }
}

for (const arg of process.argv.slice(2)) {
  const files = fs.statSync(arg).isDirectory()
    ? fs.readdirSync(arg).filter((f) => f.startsWith('events.out.tfevents.')).sort().map((f) => path.join(arg, f))
    : [arg];
  for (const f of files) readFile(f);
}
