#!/usr/bin/python3
"""An independent Python model of Hugging Face BertTokenizer (BasicTokenizer + WordPiece,
uncased), built on Python's own unicodedata and str.lower, which is what makes HF's results.
Used to write tests/golden/tokenizer.jsonl for cases beyond the hand-checked anchors:

    /usr/bin/python3 tools/bert_tokenizer_reference.py assets/bert-base-uncased-vocab.txt \
        > tests/golden/tokenizer.jsonl
"""
import json
import sys
import unicodedata

SPECIAL = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"]


def is_ws(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def is_punct(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return any(a <= cp <= b for a, b in [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
                                         (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
                                         (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])


def basic(text):
    out = []
    for c in text:
        if ord(c) == 0 or ord(c) == 0xFFFD or is_control(c):
            continue
        out.append(" " if is_ws(c) else (f" {c} " if is_cjk(ord(c)) else c))
    text = unicodedata.normalize("NFC", "".join(out))
    words = []
    for w in text.split():
        w = "".join(ch for ch in unicodedata.normalize("NFD", w.lower()) if unicodedata.category(ch) != "Mn")
        cur = ""
        for ch in w:
            if is_punct(ch):
                if cur:
                    words.append(cur)
                words.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            words.append(cur)
    return words


def wordpiece(word, vocab):
    if len(word) > 100:
        return ["[UNK]"]
    out, start = [], 0
    while start < len(word):
        end, found = len(word), None
        while end > start:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in vocab:
                found = sub
                break
            end -= 1
        if found is None:
            return ["[UNK]"]
        out.append(found)
        start = end
    return out


def tokenize(text, vocab):
    pieces, pos = [], 0
    while True:
        hits = [(text.find(s, pos), s) for s in SPECIAL if text.find(s, pos) >= 0]
        if not hits:
            chunk, special = text[pos:], None
        else:
            at, special = min(hits)
            chunk = text[pos:at]
        for w in basic(chunk):
            pieces += wordpiece(w, vocab)
        if special is None:
            return pieces
        pieces.append(special)
        pos = at + len(special)


CASES = [
    "Hello, world!", "unaffable", "Héllo naïve café",
    "The quick brown fox jumps over the lazy dog.",
    "北京是中国的首都。", "日本語のテキストと English mixed", "Ünïcödé ÀÉÎÕÜ façade Ångström",
    "tabs\tand\nnewlines\r\nand  spaces", "control\u0007chars\u200band\u00adsoft",
    "punctuation!!! ?!?! ... --- (brackets) [square] {curly} \"quotes\" 'single'",
    "a" * 120, "supercalifragilisticexpialidocious", "The [MASK] sat on the mat.",
    "[CLS] first [SEP] second [SEP]", "hello[MASK]world", "[mask] is lower case here",
    "ΣΊΣΥΦΟΣ Σίσυφος", "İstanbul", "1,234.56 and 3.14159 or 10%", "e-mail: someone@example.com",
    "emoji 😀 and symbols ©®™ §¶", "  leading and trailing  ", "", "don't won't it's",
    "C++ and C# are languages", "naïve résumé coöperate", "Straße groß", "ﬁ ligature ﬂ",
    "fullwidth ＡＢＣ１２３", "Москва Россия", "العربية", "हिन्दी", "한국어 텍스트", "\u00e9\u0301",
]

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        tokens = f.read().split("\n")[:-1]
    vocab = {t: i for i, t in enumerate(tokens)}
    for text in CASES:
        pieces = tokenize(text, vocab)
        print(json.dumps({"text": text, "ids": [vocab[p] for p in pieces], "pieces": pieces},
                         ensure_ascii=False))
