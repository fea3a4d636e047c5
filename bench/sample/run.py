#!/usr/bin/env python3
"""Sampling speed: Starling's KV cache against rerunning the context for every token, and against
PyTorch eager decoding with a cache, on the same weights.

    python3 bench/sample/run.py                                   # gpt2-mini, 256 tokens, 3 reps
    python3 bench/sample/run.py --preset gpt2-124m --tokens 128 --reps 3
    python3 bench/sample/run.py --tokens 256 --seq-len 512          # the whole context cached

It trains the preset one step on the byte-level Brown corpus (data/brown/text; scripts/fetch-brown.sh)
to get a checkpoint, exports it for Hugging Face (`starling export --format hf`), and then, R times
and alternating the order, times greedy decoding of --tokens tokens after a short prompt:
  starling sample --timing              (the KV cache: the prompt once, then one token at a time)
  starling sample --timing --no-cache   (the last model.seq_len tokens again for every token)
  bench/sample/torch_decode.py          (PyTorch eager with a KV cache, the same threads)
each in its own process. It prints the median tokens/s of each and the ratios of Starling's cached
decoding against the other two (> 1: Starling's cache is faster), and whether the three chose the
same tokens. The prompt and --tokens must fit in model.seq_len (--seq-len) for the cache to hold
the whole context.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON = "/usr/bin/python3"


def run(cmd, env=None):
    """stdout as bytes (a byte-level model's sample need not be UTF-8), stderr as text."""
    r = subprocess.run(cmd, capture_output=True, env=env)
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout!r}\n{err}")
    return r.stdout, err


def starling_sample(args, run_dir, prompt, cache, env):
    cmd = [args.starling, "sample", "--checkpoint", run_dir, "--prompt", prompt, "--max-tokens",
           str(args.tokens), "--temperature", "0", "--timing"] + ([] if cache else ["--no-cache"])
    out, err = run(cmd, env)
    m = re.search(r"sample: (\d+) tokens in ([0-9.]+) s", err)
    if not m:
        sys.exit(f"no timing line from {' '.join(cmd)}:\n{err}")
    return int(m.group(1)) / float(m.group(2)), out[:-1] if out.endswith(b"\n") else out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build/starling"))
    ap.add_argument("--text", default=os.path.join(ROOT, "data/brown/text"))
    ap.add_argument("--preset", default="gpt2-mini")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=0,
                    help="model.seq_len (0: the preset's); prompt + tokens must fit for the cache "
                         "to hold the whole context")
    ap.add_argument("--prompt", default="The jury said")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(ROOT, "build/bench/sample-results.json"))
    args = ap.parse_args()
    if not os.path.isdir(args.text):
        sys.exit(f"no corpus at {args.text}: run scripts/fetch-brown.sh")

    work = tempfile.mkdtemp(prefix="starling_bench_sample_")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    data, run_dir, hf = (os.path.join(work, x) for x in ("data", "run", "hf"))
    run([args.starling, "data", "prepare", args.text, "--out", data])
    cfg = os.path.join(work, "run.toml")
    with open(cfg, "w") as f:
        seq_len = f"seq_len = {args.seq_len}\n" if args.seq_len > 0 else ""
        f.write(f'[model]\npreset = "{args.preset}"\nvocab_size = 256\n{seq_len}'
                f'[data]\ndir = "{data}"\n'
                f'[train]\nsteps = 1\nbatch_size = 1\nthreads = {args.threads}\neval_every = 0\n'
                f'checkpoint_every = 1\nsample_at_end = false\nout_dir = "{run_dir}"\n')
    run([args.starling, "train", "-q", "--config", cfg], env)
    run([args.starling, "export", "--checkpoint", run_dir, "--out", hf, "--format", "hf"], env)
    prompt_ids = ",".join(str(b) for b in args.prompt.encode())

    rates = {"cache": [], "no-cache": [], "torch": []}
    texts = {}
    for rep in range(args.reps):
        order = ["cache", "no-cache", "torch"]
        if rep % 2:
            order.reverse()
        for side in order:
            if side == "torch":
                out, _ = run([PYTHON, os.path.join(HERE, "torch_decode.py"), "--model-dir", hf,
                              "--prompt-ids", prompt_ids, "--max-tokens", str(args.tokens),
                              "--threads", str(args.threads)], env)
                result = json.loads(out.decode().strip().splitlines()[-1])
                rate, text = result["tokens_per_s"], args.prompt.encode() + bytes(result["ids"])
            else:
                rate, text = starling_sample(args, run_dir, args.prompt, side == "cache", env)
            rates[side].append(rate)
            texts[side] = text
            print(f"rep {rep + 1} {side:9}: {rate:8.1f} tokens/s", flush=True)

    med = {k: statistics.median(v) for k, v in rates.items()}
    # Byte-level tokens: the samples' bytes are the ids.
    same = texts["cache"] == texts["no-cache"]
    same_torch = texts["cache"] == texts["torch"]
    print(f"\n{args.preset}, {args.tokens} tokens after a {len(args.prompt.encode())}-token prompt, "
          f"{args.threads} threads, medians of {args.reps}:")
    for k in ("cache", "no-cache", "torch"):
        print(f"  {k:9} {med[k]:8.1f} tokens/s")
    print(f"  Starling with its cache: {med['cache'] / med['no-cache']:.2f}x without it, "
          f"{med['cache'] / med['torch']:.2f}x PyTorch eager with a cache")
    print(f"  same tokens with and without the cache: {'yes' if same else 'no'}; "
          f"as PyTorch's: {'yes' if same_torch else 'no'}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"preset": args.preset, "tokens": args.tokens, "threads": args.threads,
                   "runs": rates, "medians": med, "same_tokens": same,
                   "same_as_torch": same_torch}, f, indent=2)
    print("results in", args.json)


if __name__ == "__main__":
    main()
