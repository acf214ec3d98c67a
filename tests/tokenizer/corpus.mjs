// SPDX-License-Identifier: MIT
// The tokenizer test corpus: a list of byte strings (Buffers), the same bytes for the reference
// (which sees them through a WHATWG UTF-8 decoder, invalid bytes becoming U+FFFD) and for
// lockstep. `specials` are the added-token literals of the tokenizer under test, so each
// tokenizer meets its own special tokens (and near misses of them) in running text.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";

const prose = [
  "Hello world",
  "The quick brown fox jumps over the lazy dog. It's 9 o'clock; we're late, aren't we? I'd say we'll make it.",
  "  Leading spaces, trailing spaces   ",
  "Mr. O'Neil said: \"Don't!\" -- and then (quietly) left... [citation needed]",
  "CAPITALS AND lowercase And MiXeD cAsE: I'M, YOU'RE, HE'S, THEY'VE, WE'LL, SHE'D",
  "e-mail: someone@example.com, URL: https://example.org/path?q=1&r=2#frag",
  "Tabs\tand\tnewlines\nand\r\nwindows line ends\rand a lone CR",
  "",
  " ",
  "a",
  "\n",
];
const code = [
  "int main(int argc, char **argv) {\n  for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n  return 0;\n}\n",
  "def f(x):\n    if x > 0:\n        return x ** 2  # square\n    return -x\n\n\nprint(f(3), f(-4))\n",
  "const re = /^[a-z_]+\\d{2,3}$/gu; let s = `template ${1 + 2}`; obj?.prop ?? 'default';\n",
  "    \t  mixed indentation\n\t\tline2\n        line3 \n",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
  "<div class=\"a\">&nbsp;&lt;tag&gt;</div>\n<!-- comment -->",
  "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"k\": \"v\"}}",
];
const cjk = [
  "你好，世界！今天天气很好。我们去公园散步吧。",
  "日本語のテキスト：ひらがな、カタカナ、漢字を含む文章です。",
  "한국어 문장도 포함합니다. 안녕하세요!",
  "中文和English混合mixed文本123个数字",
  "（全角括号）「引号」『书名号』《标题》——破折号……省略号",
  "𠀀𠀁𪚥 (CJK extension B) 龘",
];
const emoji = [
  "😀😃😄😁 smileys",
  "👨‍👩‍👧‍👦 family (ZWJ sequence) 👩🏽‍💻 technologist with skin tone",
  "🏳️‍🌈 flag with VS16 and ZWJ, 🇫🇷🇯🇵 regional indicators",
  "❤️ vs ❤ (VS16), #️⃣ keycap, 1️⃣2️⃣3️⃣",
  "emoji🤖inside👾words",
];
const marks = [
  "cafe\u0301 vs caf\u00e9 (combining acute vs precomposed)",
  "n\u0303 a\u0308 o\u0328\u0301 stacked: e\u0301\u0302\u0303\u0304",
  "Zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u036b\u0357\u0364\u036b\u0300\u0357\u0303\u0351\u0302\u0350\u0300\u0358\u0356\u034c\u033c\u034e",
  "Hangul jamo \u1100\u1161\u11a8 vs \uac01",
  "Devanagari: \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
  "Arabic: \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 and Hebrew: \u05e9\u05dc\u05d5\u05dd",
  "Greek \u1f00\u0345 and \u212b (Angstrom sign) \u2126 (Ohm) \ufb01 (fi ligature) \u00bd",
  "Thai: \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
];
const spaces = [
  " ".repeat(1),
  " ".repeat(2) + "x",
  " ".repeat(7) + "word" + " ".repeat(9),
  " ".repeat(100),
  " ".repeat(1000) + "end",
  "\n".repeat(50),
  "line\n\n\n\nline",
  " \n \n\t\n  \r\n ",
  "a" + " ".repeat(16) + "b" + "\n".repeat(16) + "c" + "\t".repeat(16),
  "\u00a0\u00a0non-breaking\u2003em\u2009thin\u3000ideographic\u202fnarrow\u205fmath\ufeffBOM\u0085NEL\u2028LS\u2029PS",
  "\ufeffleading BOM",
];
const digits = [
  "0", "12", "123", "1234", "12345", "1234567890123456789",
  "3.14159265358979 2.71828 -42 +7 1e-10 0x1F 0b1010 1,000,000",
  "phone: +1 (555) 123-4567, date 2024-02-29T12:34:56Z",
  "Arabic-Indic ٠١٢٣٤٥٦٧٨٩ Devanagari ०१२ full-width １２３ roman Ⅻ superscript ²³ fractions ½",
];
const lone = [
  "a'b 'S 'T 'RE 'Ve 'M 'Ll 'D 'x '' ''' ' s",
  "#$%&*+-/<=>@^_`|~ !!! ??? ... ,,, ;;; ::: (((( ))))",
  "\u0000 NUL, \u0001 SOH, \u007f DEL, \u001b[31m ANSI",
  "\ud83d\ude00".repeat(20),
];
// Invalid UTF-8: each Buffer is given as raw bytes.
const invalid = [
  [0xff], [0xfe, 0xff], [0x80], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80],
  [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x9f, 0x98], [0xe4, 0xbd], [0x61, 0xe4, 0xbd, 0x62],
  [0x68, 0x69, 0xc3, 0x28, 0x20, 0x77, 0xa1, 0x21], [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0xc2], [0x41, 0xc2, 0x42, 0xc2], [0xef, 0xbf, 0xbd, 0xef, 0xbf],
];

function seeded(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Source files of this repository: real code in volume.
function sources(root) {
  const out = [];
  for (const dir of ["model", "core", "cli"]) {
    let names = [];
    try {
      names = readdirSync(join(root, dir)).filter((n) => n.endsWith(".c") || n.endsWith(".h")).sort();
    } catch {
      continue;
    }
    for (const n of names.slice(0, 6)) out.push(readFileSync(join(root, dir, n)).subarray(0, 6000));
  }
  return out;
}

export function corpus(specials, root) {
  const items = [];
  const text = (s) => items.push(Buffer.from(s, "utf8"));
  for (const group of [prose, code, cjk, emoji, marks, spaces, digits, lone]) group.forEach(text);
  for (const b of invalid) items.push(Buffer.from(b));
  // Invalid bytes inside running text.
  items.push(Buffer.concat([Buffer.from("valid "), Buffer.from([0xff, 0xc3]), Buffer.from(" text 你"), Buffer.from([0xe5, 0xa5]), Buffer.from(" end")]));
  // Special-token literals in text, glued and spaced, and near misses.
  const sp = specials.slice(0, 40);
  for (const s of sp) {
    text(s);
    text(`before${s}after`);
    text(` ${s} spaced `);
    text(`${s}${s}\n${s}`);
    if (s.length > 2) text(`${s.slice(0, -1)} near miss ${s.slice(1)}`);
  }
  if (sp.length >= 3) text(`${sp[0]}${sp[1]}\nuser text\n${sp[2]}assistant${sp[0]}`);
  // Random mixtures of everything above, long enough to exercise BPE at length.
  const pool = [...prose, ...code, ...cjk, ...emoji, ...marks, ...digits, ...lone, ...sp];
  const rnd = seeded(20240229);
  for (let k = 0; k < 40; k++) {
    let s = "";
    const parts = 3 + Math.floor(rnd() * 12);
    for (let j = 0; j < parts; j++) {
      const p = pool[Math.floor(rnd() * pool.length)];
      const cut = Math.floor(rnd() * p.length);
      s += rnd() < 0.5 ? p : p.slice(cut);
      s += [" ", "\n", "", "  ", "\t", "\n\n"][Math.floor(rnd() * 6)];
    }
    text(s);
  }
  for (const b of sources(root)) items.push(b);
  return items;
}
