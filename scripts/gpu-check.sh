#!/usr/bin/env bash
# Checks on a GPU what a CPU-only machine cannot: the CUDA build, every test that skips without a
# GPU (or without a libtorch of 2.1 or later, which autocasts to fp16 on a CPU), and the swap
# figures on the card. For a machine with an NVIDIA GPU and a CUDA libtorch (pip's torch), lent
# for a short while: each phase writes its log under OUT as it goes, so a run cut short still
# leaves what it did, and a second run rebuilds only what changed.
#
#   scripts/gpu-check.sh [OUT]                     # default OUT: gpu-check/ (ignored by git)
#   PHASES="build tests" scripts/gpu-check.sh      # a subset of: build tests swap big
#   TEST_TIMEOUT=300 (seconds a test may take), JOBS_TESTS=4, BUILD_DIR=build-cuda
#   DEPS_DEBS=build-debs scripts/gpu-check.sh      # no apt there: see below
#
# Phases (default "build tests swap"):
#   build  scripts/build-cuda.sh into BUILD_DIR (default build-cuda)
#   tests  the tests whose names say they need a GPU, NCCL or fp16 (GPU_TESTS, a ctest regex),
#          JOBS_TESTS at a time; a test that still skips is named in the summary
#   swap   bench/swap on the card (pinned host RAM below it): gpt2-124m, bf16, 32 x 1024 tokens
#          a step, budgets of 100/50/30/20% of the training state, each against an unswapped run
#   big    gpt2-1558m (25 GB of training state) through a 6 GB budget on a card capped at 12 GB
#
# A machine without apt or network: on a Debian 12 machine, fetch the packages and the data
# first, and bring both along (they are ignored by git):
#   scripts/download-debs.sh build-debs     # the Debian packages, about 11 MB
#   scripts/fetch-gpt2-bpe.sh && scripts/fetch-brown.sh   # data/: tokenizer and corpus, 8 MB
# The summary (OUT/summary.txt) ends with each phase's result; the full logs sit beside it. The
# exit status is 1 when a phase failed (a test, the bench, the big run), whatever the others did.
# Where one command may run only ten minutes, run "build tests" and then "swap": the second run
# finds the build in place.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
BUILD_DIR=${BUILD_DIR:-build-cuda}
PHASES=${PHASES:-build tests swap}
PYTHON=${PYTHON:-python3}
JOBS_TESTS=${JOBS_TESTS:-4}
GPU_TESTS=${GPU_TESTS:-Gpu|Cuda|Nccl|Fp16|bindings}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
summary="$OUT/summary.txt"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
# Appended to: a second run (say "swap" after "build tests") keeps the first one's lines.
say "$(date -u +%FT%TZ) phases: $PHASES"
for phase in $PHASES; do
  case "$phase" in build | tests | swap | big) ;; *)
    say "unknown phase '$phase' (build tests swap big)"
    exit 2
    ;;
  esac
done
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
if [ -n "${DEPS_DEBS:-}" ]; then
  compgen -G "$DEPS_DEBS/*.deb" >/dev/null || {
    say "DEPS_DEBS=$DEPS_DEBS holds no .deb files (scripts/download-debs.sh fetches them)"
    exit 1
  }
  DEPS_DEBS=$(cd "$DEPS_DEBS" && pwd)
  export DEPS_DEBS
fi
# A tree built from unpacked packages (DEPS_DEBS, now or in an earlier run) loads them from there;
# absolute, since ctest runs each test in its own directory.
if [ -n "${DEPS_DEBS:-}" ] || [ -d "$BUILD_DIR/deps" ]; then
  export LD_LIBRARY_PATH="$BUILD_DIR/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
failed=0  # the exit status: 1 when any phase failed
# Each phase's wall time, for sizing the next run.
phase_start=0
begin() {
  phase_start=$(date +%s)
  say "$1 ..."
}
took() { echo "$(($(date +%s) - phase_start)) s"; }

begin "machine"
{
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
                                    "GPUs", torch.cuda.device_count())' 2>&1
  nproc
} | tee -a "$summary"
# Without a GPU every test picked here skips, and ctest calls that a pass.
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)

for phase in $PHASES; do
  case "$phase" in
    build)
      begin "build into $BUILD_DIR"
      if ! scripts/build-cuda.sh "$BUILD_DIR" >"$OUT/build.log" 2>&1; then
        tail -40 "$OUT/build.log" | tee -a "$summary"
        say "build FAILED after $(took) (OUT/build.log); the later phases need it"
        exit 1
      fi
      say "build done in $(took): $("$BUILD_DIR/starling" --version 2>&1 | head -1)"
      ;;
    tests)
      begin "tests matching '$GPU_TESTS'"
      ctest --test-dir "$BUILD_DIR" -R "$GPU_TESTS" -j"$JOBS_TESTS" --output-on-failure \
        --timeout "${TEST_TIMEOUT:-300}" --no-tests=error >"$OUT/tests.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || failed=1
      if [ "$gpus" = 0 ]; then
        say "no GPU visible to $PYTHON's torch: the GPU tests skipped, which is no pass"
        failed=1
      fi
      grep -E "tests passed|Total Test time" "$OUT/tests.log" | tee -a "$summary"
      # Every test picked here should run on a GPU machine: one that skips says why in its log.
      grep -E "\((Failed|Timeout|Skipped|Not Run)\)|\*\*\*Exception" "$OUT/tests.log" |
        sed -e 's/^\s*/  /' -e 's/  # GetParam() = .* (/ (/' |
        tee -a "$summary"
      say "tests done in $(took), ctest exit status $rc (OUT/tests.log)"
      ;;
    swap)
      begin "bench/swap on the GPU"
      "$PYTHON" bench/swap/run.py --starling "$BUILD_DIR/starling" --device cuda --dtype bf16 \
        --preset gpt2-124m --batch 32 --seq-len 1024 --steps 8 --reps 1 \
        --fractions 1.0 0.5 0.3 0.2 >"$OUT/swap.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || failed=1
      tail -20 "$OUT/swap.log" | tee -a "$summary"
      say "swap done in $(took), exit status $rc (OUT/swap.log)"
      ;;
    big)
      begin "gpt2-1558m through a 6 GB budget, card capped at 12 GB"
      # Its checkpoints (19 GB each) go to a scratch directory, never into OUT.
      run="${TMPDIR:-/tmp}/starling-gpu-check-big"
      rm -rf "$run"
      [ -f data/brown/byte/meta.json ] ||
        "$BUILD_DIR/starling" data prepare data/brown/text --out data/brown/byte >"$OUT/big.log" 2>&1
      "$BUILD_DIR/starling" train --config configs/demo-big.toml --set train.device=cuda \
        --set train.device_memory=12GB --set swap.tier=host --set swap.budget=6GB \
        --set model.seq_len=1024 --set train.batch_size=2 --set train.steps=6 \
        --set train.checkpoint_every=6 --set "train.out_dir=\"$run\"" >>"$OUT/big.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || failed=1
      rm -rf "$run"
      tail -12 "$OUT/big.log" | tee -a "$summary"
      say "big done in $(took), exit status $rc (OUT/big.log)"
      ;;
  esac
done
say "exit status $failed"
exit $failed
