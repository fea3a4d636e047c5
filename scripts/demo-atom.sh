#!/usr/bin/env bash
# The `make demo-atom` run: two local peers train with atom, each holding the whole model through
# a memory budget smaller than its training state (layer groups swapped to disk); then each peer's
# swap report (peak resident set against the budget, bytes moved), a sample and the loss plot.
# Usage: scripts/demo-atom.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
starling="${1:-build}/starling"
. scripts/demo-common.sh
demo_prepare runs/demo-atom
"$starling" train --config configs/demo-atom.toml --peers 2
echo
grep -m1 '^swap plan' runs/demo-atom/peer-0.log
for log in runs/demo-atom/peer-*.log; do
  echo "$(basename "$log" .log): $(grep -m1 '^swap: peak resident' "$log")"
done
/usr/bin/python3 scripts/plot_loss.py runs/demo-atom runs/demo-atom/loss.png
echo
echo "demo-atom: done. Try: $starling sample --checkpoint runs/demo-atom/peer-0 --prompt \"The jury said \""
