// Text for petrel's tokenizer fixtures and benchmark: multilingual training
// paragraphs, a hostile test corpus (every case is a separate string) and a
// deterministic generator of a few MB of mixed-language text.
// All characters are within Unicode 14 (the tables of Debian 12's PCRE2).
'use strict';

const PARAGRAPHS = [
  // English
  `The quick brown fox jumps over the lazy dog. It's a well-known pangram, and they'll keep using it. We've seen it, you'd agree, I'm sure. The weather in London was 12 degrees on Monday, 15 on Tuesday and 3.5 on Wednesday; prices rose by 1,234.56 dollars (about 7%).`,
  `In the beginning was the word, and the word was with the engine. Tokenizers split text into pieces: words, numbers, punctuation and whitespace. A model reads the pieces as ids, one after another, and writes new ones back.`,
  `def tokenize(text):\n    ids = []\n    for word in text.split():\n        ids.append(vocab.get(word, UNK))\n    return ids\n\nint main(int argc, char **argv) { printf("%d\\n", argc); return 0; }\n`,
  `Visit https://example.com/path?query=1&lang=en#section or write to someone@example.org. Version 2.10.3 was released on 2024-03-14 at 15:09:26 UTC.`,
  // French, German, Spanish, Portuguese, Italian, Polish, Turkish, Vietnamese
  `Le cœur a ses raisons que la raison ne connaît point. L'été dernier, nous sommes allés à la mer ; c'était très agréable, n'est-ce pas ? Où est la bibliothèque ?`,
  `Die Straße ist lang und die Bäume sind grün. Größere Häuser kosten mehr; Übermorgen fahren wir nach München. Fußgänger müssen aufpassen.`,
  `El niño comió una manzana y después bebió agua. ¿Dónde está la estación? ¡Qué día tan bonito! Mañana será otro día.`,
  `A ação do coração não é explicação. Você já viu o pôr do sol em São Paulo? Ninguém sabe.`,
  `Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura, ché la diritta via era smarrita.`,
  `Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig. Źdźbło trawy.`,
  `İstanbul'da ılık bir gün. Işık, ışık; İİ ii ıı. Türkçe karakterler: ç ğ ö ş ü.`,
  `Tiếng Việt có nhiều dấu thanh: à á ả ã ạ, ầ ấ ẩ ẫ ậ. Người Việt Nam rất thân thiện.`,
  // Cyrillic, Greek, Armenian, Georgian
  `Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России. Ёлка, ёж, объём.`,
  `Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο. ΟΔΥΣΣΕΥΣ ΟΔΥΣΣΕΑΣ σοφός λόγος. Ἀρχὴ ἥμισυ παντός.`,
  `Բարեւ ձեզ, ինչպե՞ս եք։ Հայերենը հին լեզու է։`,
  `ქართული ენა ძალიან ლამაზია. გამარჯობა, მეგობარო!`,
  // RTL: Arabic, Hebrew, Persian
  `مرحبا بالعالم. اللغة العربية جميلة جداً، وهي لغة القرآن. الأرقام: ٠١٢٣٤٥٦٧٨٩ و ١٢٣.`,
  `שלום עולם! עברית נכתבת מימין לשמאל. מה שלומך היום?`,
  `سلام دنیا. زبان فارسی شیرین است. ۱۲۳۴۵۶۷۸۹۰`,
  // Indic, Southeast Asian
  `नमस्ते दुनिया। हिन्दी भाषा बहुत सुन्दर है। क्षत्रिय, ज्ञान, श्रम। १२३४५`,
  `বাংলা ভাষা খুব মিষ্টি। আমি তোমাকে ভালোবাসি।`,
  `தமிழ் மொழி மிகவும் பழமையானது. வணக்கம்!`,
  `ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ ยินดีที่ได้รู้จัก`,
  `ພາສາລາວ ສະບາຍດີ. ខ្ញុំស្រឡាញ់ភាសាខ្មែរ។ မြန်မာဘာသာ`,
  // CJK
  `我们是中国人，我们爱和平。今天天气很好，我们去公园散步吧！人工智能正在改变世界。`,
  `日本語の文章はひらがな、カタカナ、漢字を混ぜて書きます。東京は大きな都市です。ｶﾀｶﾅ（半角）もあります。`,
  `한국어는 한글로 씁니다. 안녕하세요, 만나서 반갑습니다! 서울은 아름다운 도시입니다.`,
  // Ethiopic, Cherokee, Mongolian, Tibetan
  `ሰላም ለዓለም። አማርኛ ቋንቋ ነው።`,
  `ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ. ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ. བོད་ཡིག་ནི་སྐད་ཡིག་ཅིག་རེད།`,
  // Emoji and symbols
  `I ❤️ tokenizers 😀😃😄! Family: 👨‍👩‍👧‍👦, flags: 🇯🇵🇺🇸🇫🇷🇩🇪, skin tones: 👍🏽👋🏿, keycaps: 1️⃣#️⃣. ©®™ ∑∫√∞ ≠ ≤ ≥ → ⇒ ★☆ ♠♣♥♦.`,
  // Math, fullwidth, ligatures, compatibility
  `ﬁﬂ ligatures, ①②③ circled, ＡＢＣ１２３ fullwidth, ㍻ ㌔ squared, ½ ¼ fractions, x² + y³ = z⁴, ℌℑℜ, Ⅻ, ＂ｑｕｏｔｅ＂.`,
];

const CASES = [
  '', ' ', '  ', '\n', '\n\n', '\r\n', '\t', ' \t \n ', 'a', 'A', '.', '\u00a0', '\u3000',
  'Hello world', 'Hello  world', 'Hello   world   ', '  leading spaces', 'trailing spaces   ',
  'line one\nline two\r\nline three\rline four', 'tabs\tand\t\tmore\ttabs', 'a\n\n\n\nb', ' \n \n ',
  'CRLF\r\n\r\nrun\r\n', 'x\u0085y', 'x\u2028y\u2029z', 'non\u00a0breaking\u202fspaces\u2009thin',
  "it's they're we've I'm you'll he'd IT'S THEY'RE We'Ve", "don't 's 't 're 've 'm 'll 'd", "’s ’t curly", "a'sb'ss'tt",
  'ſ long s: \'ſ \'ſt', 'Kelvin K sign', 'İstanbul İI ıi', 'ΣΊΣΥΦΟΣ σοφός', 'ß ẞ ﬀ',
  '0', '12', '123', '1234', '12345678901234567890', '3.14159 2,718 1e10 -42 +7', '٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३ ১২৩ ๑๒๓', '１２３４５',
  'abc123def456', 'x1y22z333w4444', '2024-03-14T15:09:26Z', '$100.00 €50 £20 ¥1000 ₹500',
  'e\u0301 e\u0301\u0301 a\u0308\u0304 o\u0328\u0301', 'Z\u0351\u0308\u036b\u0337a\u0350\u0352l\u0353g\u0359o\u0322', 'n\u0303 vs ñ', 'Å vs A\u030a vs \u212b',
  '한국어 \u1112\u1161\u11ab\u1100\u1173\u11af jamo', 'ひらがな カタカナ ｶﾀｶﾅ 漢字', '中文，标点。符号！', 'ไทยไม่มีช่องว่าง',
  'नमस्ते क्षत्रिय', 'مرحبا بالعالم', 'שלום', 'עברית עם ניקוד: שָׁלוֹם', 'mixed English العربية עברית 中文',
  '😀', '😀😀😀', '👨‍👩‍👧‍👦', '👩🏽‍💻', '🇯🇵🇺🇸', '🏴‍☠️', '❤️\ufe0f', '1️⃣', 'a😀b', ' 😀 ', 'emoji👍🏽in👋🏿words',
  '\ufeffBOM at start', 'zero\u200bwidth\u200cnon\u200djoiner', '\u200e\u200fmarks', 'soft\u00adhyphen',
  'control\u0001chars\u001f\u007f', 'private\ue000use\uf8ff', 'supplementary 𝒜𝓑𝔠 𝟘𝟙 𐍈 𠀀',
  'ﬁ ① ＡＢＣ ㍻ ½ x² ℌ Ⅻ', '™®©', '…—–‐', '«quotes» “double” ‘single’ „low“', '()[]{}<>', '!!!???...,,,;;;:::',
  '---___===+++***', '@#$%^&|\\/~`', 'a-b_c.d/e\\f', 'snake_case camelCase PascalCase kebab-case SCREAMING_CASE',
  'https://example.com/a/b?c=d&e=f#g', 'user@example.org', 'C:\\Windows\\System32', '/usr/local/bin',
  'def f(x):\n    return x ** 2\n', '    indented\n        more\n\tand tab', 'if (a && b || !c) { x += 1; }',
  '<html><body class="x">Hi</body></html>', '{"key": [1, 2, {"n": null}]}', 'SELECT * FROM t WHERE id = 1;',
  'a'.repeat(300), 'ab'.repeat(400), 'x'.repeat(1000) + ' ' + 'y'.repeat(200), 'supercalifragilisticexpialidocious'.repeat(20),
  '1'.repeat(500), ' '.repeat(200), '\n'.repeat(100), '\t \n'.repeat(50), '😀'.repeat(100), '中'.repeat(300), 'é'.repeat(200),
  'Ünïcödé wörds everywhere: naïve café résumé coöperate façade jalapeño',
];

// Cases containing added tokens are built per tokenizer from its token list.
function specialCases(tokens) {
  const out = [];
  for (const t of tokens) {
    out.push(t, `${t}${t}`, `hello${t}world`, `hello ${t} world`, `hello  ${t}  world`, `${t}\nline`,
             `line\n${t}`, ` ${t}`, `${t} `, `x${t.slice(0, Math.max(1, t.length - 1))}y`, `a ${t}b ${t} c${t}d`,
             `_${t}_`, `${t}\u00b2`, `\u0301${t}`, `${t}\u0903`, `\u216b${t}`, `.${t},`, `\t${t}\u3000`);
  }
  if (tokens.length >= 2) out.push(tokens.join(''), tokens.join(' '), tokens.join('\n'), `Q: ${tokens[0]}hi${tokens[1]} A:`);
  return out;
}

// Deterministic pseudo-random generator (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Random mixtures of words drawn from the paragraphs: hostile joins included.
function mixedCases(n, seed) {
  const r = rng(seed);
  const words = PARAGRAPHS.join(' ').split(/\s+/).filter(Boolean);
  const seps = [' ', ' ', ' ', '  ', '\n', '\t', '\r\n', '', '\u3000', '\u00a0', ' \n '];
  const out = [];
  for (let i = 0; i < n; i++) {
    const k = 1 + Math.floor(r() * 12);
    let s = '';
    for (let j = 0; j < k; j++) s += words[Math.floor(r() * words.length)] + seps[Math.floor(r() * seps.length)];
    out.push(s);
  }
  return out;
}

// A few MB of mixed-language text for the throughput benchmark.
function benchText(bytes, seed) {
  const r = rng(seed);
  const parts = [];
  let n = 0;
  while (n < bytes) {
    const p = PARAGRAPHS[Math.floor(r() * PARAGRAPHS.length)];
    // shuffle the words of the paragraph so the text is not a pure repetition
    const w = p.split(' ');
    for (let i = w.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [w[i], w[j]] = [w[j], w[i]];
    }
    const s = w.join(' ') + '\n';
    parts.push(s);
    n += Buffer.byteLength(s);
  }
  return parts.join('');
}

module.exports = { PARAGRAPHS, CASES, specialCases, mixedCases, benchText, rng };
