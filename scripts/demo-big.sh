#!/usr/bin/env bash
# The `make demo-big` run: a model whose training state does not fit in this machine's RAM
# (gpt2-1558m, 25 GB) trains through a 3 GB budget with the rest on disk: five steps, a
# checkpoint, the process ends, and a second process resumes from that checkpoint for five more.
# Usage: scripts/demo-big.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
starling="${1:-build}/starling"
. scripts/demo-common.sh
if [ -d runs/demo-big ]; then
  echo "demo-big: removing the previous run (its checkpoints are 19 GB each)"
  rm -rf runs/demo-big
fi
demo_prepare runs/demo-big
mkdir -p runs/demo-big
free_gb=$(df -P --block-size=1G runs/demo-big | awk 'NR == 2 { print $4 }')
if [ "$free_gb" -lt 50 ]; then
  echo "demo-big: needs about 50 GB free under runs/ (swap file and a checkpoint); $free_gb GB free" >&2
  exit 1
fi
"$starling" train --config configs/demo-big.toml --stop-at 5
echo "demo-big: the first process stopped at step 5; a new one resumes from its checkpoint"
"$starling" train --config configs/demo-big.toml --resume
