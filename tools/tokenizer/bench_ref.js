#!/usr/bin/env node
// Reference side of bench/tokenizer.sh: encode throughput of the npm
// `tokenizers` package (one sequence, one thread) on the same text and
// tokenizer.json as petrel's harness.
//   node bench_ref.js TOKENIZER.json TEXT [REPS]
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [file, textFile, repsArg, mode] = process.argv.slice(2);
  const lines = mode === 'lines'; // encode each line (with its \n) separately, one call at a time
  const reps = Math.max(1, Math.min(100, parseInt(repsArg || '5', 10)));
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
  const text = fs.readFileSync(textFile, 'utf8');
  const bytes = Buffer.byteLength(text);
  const parts = text.split(/(?<=\n)/);
  const secs = [];
  let n = 0;
  for (let r = 0; r < reps; r++) {
    t0 = process.hrtime.bigint();
    n = 0;
    if (lines) {
      for (const l of parts) n += (await tok.encode(l, null, { addSpecialTokens: false })).getLength();
    } else {
      n = (await tok.encode(text, null, { addSpecialTokens: false })).getLength();
    }
    secs.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  secs.sort((a, b) => a - b);
  const mbs = (s) => (bytes / s / 1e6).toFixed(2);
  console.log(`reference  ${(lines ? 'lines' : 'whole').padEnd(5)} load ${loadS.toFixed(3)} s  tokens ${n}  best ${mbs(secs[0])} MB/s  median ${mbs(secs[Math.floor(reps / 2)])} MB/s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
