#!/usr/bin/env node
// Inputs for bench/tokenizer.sh: a few MB of mixed-language text and a
// byte-level BPE tokenizer trained on it by the reference library's own
// trainer (default BPE trainer settings).
//   node bench_prep.js OUT_DIR [MB]
'use strict';
const fs = require('fs');
const path = require('path');
const t = require('tokenizers');
const C = require('./corpus');

const dir = process.argv[2] || '/tmp/petrel-tokbench';
const mb = parseFloat(process.argv[3] || '4');
fs.mkdirSync(dir, { recursive: true });
const textFile = path.join(dir, 'text.txt');
fs.writeFileSync(textFile, C.benchText(Math.round(mb * 1048576), 1));
const tok = new t.Tokenizer(t.BPE.empty());
tok.setPreTokenizer(t.byteLevelPreTokenizer(false, true));
tok.train([textFile]);
tok.save(path.join(dir, 'trained.json'));
console.log(`${textFile}: ${fs.statSync(textFile).size} bytes; trained.json: vocab ${tok.getVocabSize(true)}`);
