#!/usr/bin/env bash
# Installs what packbert needs to build and run, idempotently: Debian packages only when one
# is missing (apt-get update at most once). Safe to run any number of times.
set -euo pipefail

packages=(
  cmake make g++ ninja-build pkg-config
  libopenblas-dev libopenblas0-openmp   # fp32 GEMM; the OpenMP build shares our thread pool
  nlohmann-json3-dev libcli11-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present"
