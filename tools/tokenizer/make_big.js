#!/usr/bin/env node
// Writes a synthetic byte-level BPE tokenizer.json with a large vocabulary
// (default 262144 entries, Gemma-3 sized) for load-time benchmarks:
//   node make_big.js OUT.json [VOCAB]
// Merges combine existing tokens (deterministic pseudo-random choice), so the
// file is internally consistent; the reference library loads it too.
'use strict';
const fs = require('fs');
const { rng } = require('./corpus');

const out = process.argv[2] || '/tmp/big-tokenizer.json';
const size = parseInt(process.argv[3] || '262144', 10);
const r = rng(3);
const alpha = [];
let n = 0;
for (let b = 0; b < 256; b++) {
  const same = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  alpha.push(String.fromCodePoint(same ? b : 256 + n++));
}
const vocab = new Map(alpha.map((c, i) => [c, i]));
const toks = alpha.slice();
const merges = [];
// favour letters so that real text finds merges
const letters = 'etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZĠ'.split('');
while (vocab.size < size) {
  const pick = () => (r() < 0.35 ? letters[Math.floor(r() * letters.length)] : toks[Math.floor(Math.pow(r(), 2) * toks.length)]);
  const a = pick(), b = pick();
  const m = a + b;
  if (m.length > 16 || vocab.has(m)) continue;
  vocab.set(m, vocab.size);
  toks.push(m);
  merges.push([a, b]);
}
const json = {
  version: '1.0', truncation: null, padding: null,
  added_tokens: [{ id: size, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: null,
  decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: Object.fromEntries(vocab), merges },
};
fs.writeFileSync(out, JSON.stringify(json));
console.log(`${out}: vocab ${vocab.size}, merges ${merges.length}`);
