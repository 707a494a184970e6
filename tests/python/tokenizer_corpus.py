"""Deterministic corpus of varied strings for the tokenizer parity test.

Mixes scripts (Latin, CJK, Cyrillic, Arabic, Devanagari, Korean), emoji (ZWJ sequences, skin
tones, flags), combining marks, code, numbers of many lengths, whitespace runs (spaces, tabs,
\\r\\n, Unicode spaces), mixed-case contractions and special-token strings embedded in text.
"""

import random

SPECIAL_STRINGS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<think>", "</think>", "<tool_call>", "<|reserved_special_token_5|>",
    "<|endoftext", "<s", "</ s>",  # near misses must not match
]

WORDS = [
    "Hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
    "naïve", "café", "Straße", "ﬁnance", "œuvre", "Ångström", "façade", "jalapeño",
    "Привет", "мир", "Москва", "ёлка", "你好", "世界", "中华人民共和国", "東京", "ひらがな",
    "カタカナ", "مرحبا", "بالعالم", "السلام", "नमस्ते", "दुनिया", "हिन्दी", "안녕하세요", "세계",
    "한국어", "Ελληνικά", "שלום", "ไทย", "Tiếng Việt", "ſtraſſe", "İstanbul", "ǅemal",
]

EMOJI = [
    "😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "❤️", "✨", "🫠",
    "🧑🏿‍🚀", "☕", "1️⃣", "©", "™",
]

COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0301", "ก\u0e31",
             "क\u094d\u0937", "Å", "A\u030a", "\u1100\u1161\u11a8", "x\u0338"]

CODE = [
    "def f(x):\n    return x**2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "if x != None and y >= 3:\n\tprint(f\"{x!r}\")\r\n",
    "#include <vector>\nint main() { return 0; }\n",
    "SELECT * FROM users WHERE id = 42;",
    "{\"key\": [1, 2.5, -3e10, null, true]}",
    "x = a->b ?: c; // ok?!",
    "    indented\n        more\n\n\n",
    "https://example.com/path?q=1&r=two#frag",
    "<html><body class=\"x\">Text</body></html>",
]

CONTRACTIONS = ["don't", "DON'T", "Don'T", "I'm", "I'M", "we'll", "WE'LL", "they're",
                "THEY'RE", "you've", "YOU'VE", "he'd", "HE'D", "it's", "IT'S", "can't",
                "'s", "'S", "'re", "'ll", "'LL", "'ſ", "''s", "rock'n'roll", "'x"]

NUMBERS = ["0", "7", "42", "123", "1234", "12345", "123456789", "3.14159", "1,000,000",
           "-17", "2024-11-22", "0x1F", "١٢٣", "१२३", "½", "²", "Ⅻ", "①"]

SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\n \n",
          "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\u2009", " \t \n", "\r", "\x0b"]

PUNCT = [".", ",", "!", "?", "...", "—", "–", "«", "»", "“", "”", "‘", "’", "(", ")", "[",
         "]", "{", "}", "@", "#", "$", "%", "^", "&", "*", "-", "_", "=", "+", "/", "\\", "|",
         "~", "`", "'", "\"", ";", ":", "…", "•", "¿", "¡", "。", "、", "，", "！"]

HANDCRAFTED = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "'", "''", " '", "Hello world",
    " Hello world ", "  leading and trailing  ", "\n\nnewlines\n\n", "Hello\r\nworld\r\n",
    "I'm", "I'M", "i'M here", "don't DON'T Don'T", "The year 2024 had 366 days.",
    "12345678901234567890", "3.14 and 2.71", "a  b   c    d", "a\t\tb\n\n\tc",
    "<|endoftext|>", "a<|endoftext|>b", "<|im_start|>user\nHi<|im_end|>",
    "<s>Hello</s>", " <s> spaced </s> ", "<|begin_of_text|>Hi<|eot_id|>",
    "<|begin_of_text|><|begin_of_text|>", "<<|endoftext|>>", "<|im_start|><|im_start|>",
    "👩‍💻👨‍👩‍👧‍👦🏳️‍🌈", "👍🏻👍🏼👍🏽👍🏾👍🏿", "e\u0301", "\u0301start", "Å vs Å",
    "你好，世界！", "Привет, мир!", "مرحبا بالعالم", "नमस्ते दुनिया", "안녕하세요 세계",
    "ſ's 'ſ", "\u00a0nbsp\u00a0", "x\u3000y", "tab\there", "\x00nul\x00", "\x7f\x01\x1f",
    "     ", "\n\n\n\n", " \n", "\n ", "a\n", "end.   ", "   start", "!!!???", "...\n\n",
    "$100.00 (50%)", "😀😀😀", "\U0010ffff", "\ue000private", "\ufeffbom", "ﬁ ﬂ ﬀ",
]


def _fragment(rng: random.Random) -> str:
    pool = rng.choice([WORDS, WORDS, EMOJI, COMBINING, CODE, CONTRACTIONS, NUMBERS, SPACES,
                       SPACES, PUNCT, SPECIAL_STRINGS])
    return rng.choice(pool)


def _random_chars(rng: random.Random, n: int) -> str:
    ranges = [(0x20, 0x7E), (0x20, 0x7E), (0x00, 0x20), (0xA0, 0x24F), (0x300, 0x36F),
              (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
              (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x4FFF),
              (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def build_corpus(n_random: int = 3000, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    corpus = list(HANDCRAFTED)
    for group in (WORDS, EMOJI, COMBINING, CODE, CONTRACTIONS, NUMBERS, SPACES, PUNCT,
                  SPECIAL_STRINGS):
        corpus.extend(group)
    for i in range(n_random):
        if i % 5 == 4:
            corpus.append(_random_chars(rng, rng.randint(1, 40)))
            continue
        parts = []
        for _ in range(rng.randint(1, 12)):
            frag = _fragment(rng)
            if rng.random() < 0.1:
                frag = frag.upper() if rng.random() < 0.5 else frag.lower()
            parts.append(frag)
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", " ", "", "\n", "  ", "\t"]))
        corpus.append("".join(parts))
    # Surrogates cannot be sent as UTF-8; drop any that the random ranges could produce.
    return [s for s in corpus if not any(0xD800 <= ord(c) <= 0xDFFF for c in s)]
