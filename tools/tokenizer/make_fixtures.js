#!/usr/bin/env node
// Trains small BPE tokenizers for every pipeline petrel's model families use,
// writes them as tokenizer.json, and records the reference library's
// encodings and decodings of a hostile corpus as goldens.
//
//   cd tools/tokenizer && npm ci && node make_fixtures.js ../../tests/fixtures/tokenizers
//
// The reference is the npm package `tokenizers` (Hugging Face's native
// bindings). The BPE trainer here is a plain most-frequent-pair trainer over
// words split by each tokenizer's own (reference) normalizer and
// pre-tokenizer; the tokenizers only need to be realistic, the goldens come
// from the reference. Output is deterministic.
'use strict';

const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');
const C = require('./corpus');

const OUT = process.argv[2] || path.join(__dirname, '../../tests/fixtures/tokenizers');

const REGEX = {
  llama3: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  qwen2: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  qwen35: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

// GPT-2 bytes_to_unicode, in byte order.
function byteAlphabet() {
  const out = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const same = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out.push(String.fromCodePoint(same ? b : 256 + n++));
  }
  return out;
}

// ---- trainer ------------------------------------------------------------------
function train(wordCounts, { merges: numMerges, prefix = '', suffix = '', known = null }) {
  const words = [];
  for (const [w, c] of wordCounts) {
    const ch = Array.from(w);
    words.push({ s: ch.map((x, i) => (i > 0 ? prefix : '') + x + (i === ch.length - 1 ? suffix : '')), c });
  }
  const ok = (sym) => !known || known.has(sym);
  const key = (a, b) => a + '\u0000' + b;
  const counts = new Map(), where = new Map();
  const addWord = (wi, sign) => {
    const w = words[wi];
    for (let i = 0; i + 1 < w.s.length; i++) {
      if (!ok(w.s[i]) || !ok(w.s[i + 1])) continue;
      const k = key(w.s[i], w.s[i + 1]);
      counts.set(k, (counts.get(k) || 0) + sign * w.c);
      if (sign > 0) {
        if (!where.has(k)) where.set(k, new Set());
        where.get(k).add(wi);
      }
    }
  };
  words.forEach((_, i) => addWord(i, 1));
  const out = [];
  const produced = new Set();
  for (let m = 0; m < numMerges; m++) {
    let best = null, bc = 1;
    for (const [k, c] of counts) if (c > bc || (c === bc && best !== null && k < best)) { best = k; bc = c; }
    if (best === null) break;
    const [a, b] = best.split('\u0000');
    const merged = a + b.slice(prefix.length && b.startsWith(prefix) ? prefix.length : 0);
    out.push([a, b, merged]);
    produced.add(merged);
    for (const wi of where.get(best) || []) {
      addWord(wi, -1);
      const s = words[wi].s, n = [];
      for (let i = 0; i < s.length; i++) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) { n.push(merged); i++; } else n.push(s[i]);
      }
      words[wi].s = n;
      addWord(wi, 1);
    }
    counts.delete(best);
    if (known) known.add(merged);
  }
  return out;
}

function countWords(pieces) {
  const m = new Map();
  for (const p of pieces) m.set(p, (m.get(p) || 0) + 1);
  return m;
}

function trainingText() {
  // paragraphs repeated with small variations so frequent pairs stand out
  const r = C.rng(7);
  const out = [];
  for (let k = 0; k < 6; k++) for (const p of C.PARAGRAPHS) out.push(r() < 0.5 ? p : p.toLowerCase());
  return out;
}

function emptyModel(extra = {}) {
  return Object.assign({ type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] }, extra);
}

function piecesOf(json, texts) {
  const tok = Tokenizer.fromString(JSON.stringify(Object.assign({}, json, { model: emptyModel(), added_tokens: [] })));
  const norm = tok.getNormalizer(), pre = tok.getPreTokenizer();
  const out = [];
  for (const t of texts) {
    const n = norm ? norm.normalizeString(t) : t;
    if (pre) for (const [p] of pre.preTokenizeString(n)) out.push(p);
    else out.push(n);
  }
  return out;
}

function added(id, content, o = {}) {
  return Object.assign({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }, o);
}

function template(bosName, bosId, eos) {
  const single = [{ SpecialToken: { id: bosName, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }];
  const pair = [{ SpecialToken: { id: bosName, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                { SpecialToken: { id: bosName, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }];
  const special_tokens = { [bosName]: { id: bosName, ids: [bosId], tokens: [bosName] } };
  if (eos) {
    single.push({ SpecialToken: { id: eos[0], type_id: 0 } });
    pair.push({ SpecialToken: { id: eos[0], type_id: 1 } });
    special_tokens[eos[0]] = { id: eos[0], ids: [eos[1]], tokens: [eos[0]] };
  }
  return { type: 'TemplateProcessing', single, pair, special_tokens };
}

// ---- tokenizer families ----------------------------------------------------------
function byteLevelVocab(pipeline, nMerges, extraWords) {
  const alpha = byteAlphabet();
  const pieces = piecesOf(pipeline, trainingText());
  const merges = train(countWords(pieces), { merges: nMerges });
  const vocab = {};
  alpha.forEach((c, i) => { vocab[c] = i; });
  let id = 256;
  for (const [, , m] of merges) if (!(m in vocab)) vocab[m] = id++;
  if (extraWords) {
    // whole words that merges do not build: exercised by ignore_merges
    const freq = [...countWords(pieces)].filter(([w]) => Array.from(w).length >= 4 && !(w in vocab))
      .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, extraWords);
    for (const [w] of freq) vocab[w] = id++;
  }
  return { vocab, merges: merges.map(([a, b]) => [a, b]), next: id };
}

function spmVocab(nChars, nMerges) {
  const specials = ['<pad>', '<eos>', '<bos>', '<unk>'];
  const vocab = {};
  specials.forEach((s, i) => { vocab[s] = i; });
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = 4 + b;
  let id = 260;
  const text = trainingText().map((t) => t.replace(/ /g, '\u2581'));
  const chars = new Map();
  for (const t of text) for (const ch of t) chars.set(ch, (chars.get(ch) || 0) + 1);
  // only the most frequent characters: the rest fall back to bytes
  const kept = [...chars].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, nChars).map(([c]) => c);
  for (const c of kept) vocab[c] = id++;
  const words = [];
  for (const t of text) for (const w of t.split(/(?=\u2581)/)) words.push(w);
  const merges = train(countWords(words), { merges: nMerges, known: new Set(kept) });
  for (const [, , m] of merges) if (!(m in vocab)) vocab[m] = id++;
  return { vocab, merges: merges.map(([a, b]) => [a, b]), next: id };
}

function miscVocab(pipeline, opts, nMerges) {
  const pieces = piecesOf(pipeline, trainingText());
  const wc = countWords(pieces);
  const vocab = { '[UNK]': 0, '[CLS]': 1, '[SEP]': 2 };
  let id = 3;
  // characters of Latin, Greek and Cyrillic words only: everything else is unknown
  const okWord = (w) => /^[\p{Script=Latin}\p{Script=Greek}\p{Script=Cyrillic}\p{N}\p{P}\p{M}]+$/u.test(w);
  const words = new Map([...wc].filter(([w]) => okWord(w)));
  const syms = new Set();
  for (const [w] of words) Array.from(w).forEach((ch, i, a) => {
    syms.add((i > 0 ? opts.prefix || '' : '') + ch + (i === a.length - 1 ? opts.suffix || '' : ''));
  });
  for (const s of [...syms].sort()) vocab[s] = id++;
  const merges = train(words, Object.assign({ merges: nMerges }, opts));
  for (const [, , m] of merges) if (!(m in vocab)) vocab[m] = id++;
  return { vocab, merges: merges.map(([a, b]) => [a, b]), next: id };
}

function build() {
  const defs = [];
  const bl = (add_prefix_space, use_regex) => ({ type: 'ByteLevel', add_prefix_space, trim_offsets: true, use_regex });
  const split = (re, behavior = 'Isolated', invert = false) => ({ type: 'Split', pattern: { Regex: re }, behavior, invert });

  // GPT-2: ByteLevel with its own regex; merges written in the "a b" form.
  {
    const pipe = { normalizer: null, pre_tokenizer: bl(false, true), post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true }, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true } };
    const v = byteLevelVocab(pipe, 1200);
    const toks = [added(v.next, '<|endoftext|>'), added(v.next + 1, '<mask>', { lstrip: true }),
                  added(v.next + 2, '[SEP]', { rstrip: true }), added(v.next + 3, 'foo', { single_word: true, special: false, normalized: true }),
                  added(v.next + 4, 'bar baz', { special: false, normalized: true })];
    defs.push({ name: 'gpt2', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges.map(([a, b]) => `${a} ${b}`) }), added: toks });
    const pipe2 = Object.assign({}, pipe, { pre_tokenizer: bl(true, true) });
    defs.push({ name: 'gpt2_prefix_space', pipe: pipe2, model: emptyModel({ vocab: v.vocab, merges: v.merges }), added: toks });
  }
  // Llama 3: Split(regex) + ByteLevel(no regex), ignore_merges, BOS template.
  {
    const pipe = { normalizer: null, pre_tokenizer: { type: 'Sequence', pretokenizers: [split(REGEX.llama3), bl(false, false)] },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true } };
    const v = byteLevelVocab(pipe, 1200, 150);
    const names = ['<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eom_id|>', '<|eot_id|>'];
    const toks = names.map((n, i) => added(v.next + i, n));
    pipe.post_processor = { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true }, template('<|begin_of_text|>', v.next)] };
    defs.push({ name: 'llama3', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges, ignore_merges: true }), added: toks });
  }
  // Qwen2 (NFC, single digits) and Qwen3.5 (marks in words) share a vocabulary.
  {
    const pipe = { normalizer: { type: 'NFC' }, pre_tokenizer: { type: 'Sequence', pretokenizers: [split(REGEX.qwen2), bl(false, false)] },
      post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
      decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false } };
    const v = byteLevelVocab(pipe, 1200);
    const toks = [added(v.next, '<|endoftext|>'), added(v.next + 1, '<|im_start|>'), added(v.next + 2, '<|im_end|>'),
                  added(v.next + 3, '<think>', { special: false }), added(v.next + 4, '</think>', { special: false })];
    defs.push({ name: 'qwen2', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges }), added: toks });
    const pipe35 = Object.assign({}, pipe, { pre_tokenizer: { type: 'Sequence', pretokenizers: [split(REGEX.qwen35), bl(false, false)] } });
    defs.push({ name: 'qwen35', pipe: pipe35, model: emptyModel({ vocab: v.vocab, merges: v.merges }), added: toks });
  }
  // SentencePiece-style BPE with byte fallback: Gemma, Llama-2 legacy, Metaspace.
  {
    const v = spmVocab(700, 1500);
    const model = emptyModel({ vocab: v.vocab, merges: v.merges, byte_fallback: true, unk_token: '<unk>', fuse_unk: true });
    const base = [added(0, '<pad>'), added(1, '<eos>'), added(2, '<bos>'), added(3, '<unk>')];
    const turns = [added(v.next, '<start_of_turn>'), added(v.next + 1, '<end_of_turn>'),
                   added(v.next + 2, '<unused0>', { special: false }), added(v.next + 3, '<unused1>', { special: false })];
    const dec = (extra) => ({ type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '\u2581' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }].concat(extra) });
    defs.push({ name: 'gemma', model, added: base.concat(turns), pipe: {
      normalizer: { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' },
      pre_tokenizer: { type: 'Split', pattern: { String: ' ' }, behavior: 'MergedWithPrevious', invert: false },
      post_processor: template('<bos>', 2), decoder: dec([]) } });
    defs.push({ name: 'spm_llama2', model, added: base.concat(turns), pipe: {
      normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
      pre_tokenizer: null, post_processor: template('<bos>', 2, ['<eos>', 1]),
      decoder: dec([{ type: 'Strip', content: ' ', start: 1, stop: 0 }]) } });
    defs.push({ name: 'spm_metaspace_always', model, added: base.concat(turns), pipe: {
      normalizer: { type: 'NFKD' },
      pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: false },
      post_processor: null,
      decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { Regex: '\u2581' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] } } });
    defs.push({ name: 'spm_metaspace', model, added: base.concat(turns), pipe: {
      normalizer: { type: 'NFKC' },
      pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: true },
      post_processor: template('<bos>', 2),
      decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: true }] } } });
  }
  // Other components: prefix/suffix models, unk, Lowercase/NFKC/NFD/StripAccents/Strip,
  // Whitespace, Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit, every Split behaviour, invert.
  {
    const pipe = { normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' }, { type: 'Strip', strip_left: true, strip_right: true }] },
      pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Whitespace' }, { type: 'Digits', individual_digits: true }, { type: 'Punctuation', behavior: 'Isolated' }] },
      post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '[SEP]', type_id: 0 } }],
        pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '[CLS]': { id: '[CLS]', ids: [1], tokens: ['[CLS]'] }, '[SEP]': { id: '[SEP]', ids: [2], tokens: ['[SEP]'] } } },
      decoder: null };
    const v = miscVocab(pipe, { prefix: '##' }, 600);
    const toks = [added(0, '[UNK]'), added(1, '[CLS]'), added(2, '[SEP]'), added(v.next, '[MASK]', { lstrip: true, rstrip: true }),
                  added(v.next + 1, 'MiXeD Case', { special: false, normalized: true })];
    defs.push({ name: 'misc_prefix', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges, unk_token: '[UNK]', fuse_unk: true, continuing_subword_prefix: '##' }), added: toks });
  }
  {
    const pipe = { normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'StripAccents' }, { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }, { type: 'Strip', strip_left: false, strip_right: true }] },
      pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' }, { type: 'CharDelimiterSplit', delimiter: '/' },
        split('[aeiou]+', 'MergedWithPrevious'), { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithNext', invert: false },
        split('\\p{P}', 'Contiguous'), { type: 'Digits', individual_digits: false }] },
      post_processor: null, decoder: null };
    const v = miscVocab(pipe, { suffix: '</w>' }, 600);
    defs.push({ name: 'misc_suffix', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges, unk_token: '[UNK]', end_of_word_suffix: '</w>' }),
      added: [added(v.next, '<sep>', { single_word: true })] });
  }
  {
    const pipe = { normalizer: { type: 'Lowercase' },
      pre_tokenizer: { type: 'Sequence', pretokenizers: [split('\\p{L}+|\\p{N}+', 'Removed', true), split('\\s', 'Removed'), { type: 'Punctuation', behavior: 'MergedWithNext' }] },
      post_processor: null, decoder: null };
    const v = miscVocab(pipe, {}, 500);
    defs.push({ name: 'misc_invert', pipe, model: emptyModel({ vocab: v.vocab, merges: v.merges, unk_token: '[UNK]' }), added: [] });
    const bert = { normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKD' }, { type: 'Lowercase' }] },
      pre_tokenizer: { type: 'BertPreTokenizer' }, post_processor: { type: 'BertProcessing', sep: ['[SEP]', 2], cls: ['[CLS]', 1] },
      decoder: { type: 'Strip', content: '#', start: 2, stop: 0 } };
    defs.push({ name: 'misc_bert', pipe: bert, model: emptyModel({ vocab: v.vocab, merges: v.merges, unk_token: '[UNK]', fuse_unk: true }),
      added: [added(0, '[UNK]'), added(1, '[CLS]'), added(2, '[SEP]')] });
  }
  return defs;
}

const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

async function main() {
  fs.mkdirSync(OUT, { recursive: true });
  const common = C.CASES.concat(C.PARAGRAPHS, C.mixedCases(120, 42));
  fs.writeFileSync(path.join(OUT, 'corpus.json'), JSON.stringify({ note: 'hex-encoded UTF-8 test texts', cases: common.map(hex) }) + '\n');
  for (const d of build()) {
    const json = Object.assign({ version: '1.0', truncation: null, padding: null, added_tokens: d.added }, d.pipe, { model: d.model });
    const file = path.join(OUT, `${d.name}.json`);
    const tok = Tokenizer.fromString(JSON.stringify(json));
    if (d.name === 'gpt2') fs.writeFileSync(file, JSON.stringify(json)); // keeps the "a b" merge form
    else tok.save(file, false);
    const back = Tokenizer.fromFile(file);
    const specials = d.added.map((a) => a.content);
    const extra = C.specialCases(specials);
    const cases = [];
    const texts = common.map((t, i) => ({ t, c: i })).concat(extra.map((t) => ({ t, x: hex(t) })));
    for (const { t, c, x } of texts) {
      const e0 = await back.encode(t, null, { addSpecialTokens: false });
      const e1 = await back.encode(t, null, { addSpecialTokens: true });
      const ids = e0.getIds(), ids1 = e1.getIds();
      const dec = await back.decode(ids, false), decs = await back.decode(ids1, true);
      const row = c !== undefined ? { c } : { x };
      row.ids = ids;
      if (ids1.join() !== ids.join()) row.ids_special = ids1;
      row.decoded = dec === t ? null : hex(dec);
      row.decoded_skip = decs === dec ? null : hex(decs);
      cases.push(row);
    }
    fs.writeFileSync(path.join(OUT, `${d.name}.golden.json`),
      '{"tokenizer":' + JSON.stringify(`${d.name}.json`) + ',"cases":[\n' + cases.map((r) => JSON.stringify(r)).join(',\n') + '\n]}\n');
    console.log(`${d.name}: vocab ${back.getVocabSize(true)}, ${cases.length} cases`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
