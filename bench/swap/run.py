#!/usr/bin/env python3
"""Swap benchmark: tokens/s of swapped training at fractions of the training state, against
unswapped training of the same model, data and seeds, measured in the same run.

    /usr/bin/python3 bench/swap/run.py --starling build/starling                # gpt2-124m
    /usr/bin/python3 bench/swap/run.py --preset gpt2-mini --steps 4 --reps 1    # quick look

For every tier (--tiers, default disk and host) and budget (--fractions of the training state,
16 bytes per parameter; default 1.0 0.5 0.3 0.15) it runs `starling train` for --steps steps and
reports the median tokens/s of --reps runs (the first step, which profiles and warms up, is not
counted), the ratio to the unswapped median, peak RSS (GNU time), how much the page cache grew
(/proc/meminfo Cached, before and after the run: O_DIRECT keeps it flat), and the planner's
predicted step time against the measured one. A budget the planner refuses is reported as such,
with the smallest feasible budget it names. The data is a byte-level corpus made with
`starling data prepare` from --text (default data/brown/text, made by `make data`).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def cached_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1])
    return 0


def steady(metrics_path):
    """The median tokens/s of every step but the first (which profiles and warms up)."""
    rows = [json.loads(l) for l in open(metrics_path) if '"tokens_per_s"' in l]
    return statistics.median(r["tokens_per_s"] for r in rows if r["step"] > 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--starling", default="build/starling")
    ap.add_argument("--config", default="configs/demo.toml")
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tiers", nargs="+", default=["disk", "host"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.5, 0.3, 0.15])
    ap.add_argument("--text", default="data/brown/text")
    ap.add_argument("--data", default="")
    ap.add_argument("--swap-dir", default="")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="starling_swap_bench_", dir=os.getcwd())
    if not args.data:
        args.data = os.path.join(work, "data")
        subprocess.run([args.starling, "data", "prepare", args.text, "--out", args.data],
                       check=True, capture_output=True)
    swap_dir = args.swap_dir or work

    def measure(tag, sets):
        results = []
        for r in range(args.reps):
            out = os.path.join(work, f"{tag}_{r}")
            res = run_one(args, out, sets)
            if "refused" in res:
                return res
            results.append(res)
        return {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in results),
                "step_s": statistics.median(x["step_s"] for x in results),
                "rss_mb": statistics.median(x["rss_mb"] for x in results),
                "cache_mb": statistics.median(x["cache_mb"] for x in results),
                "predicted_s": results[0]["predicted_s"]}

    base = measure("plain", [])
    info = subprocess.run([args.starling, "model", "presets"], capture_output=True, text=True).stdout
    m = re.search(rf"^{re.escape(args.preset)}\s.*?([0-9.]+)M params", info, re.M)
    params = float(m.group(1)) * 1e6
    state = 16 * params
    print(f"swap benchmark: {args.preset} ({params / 1e6:.1f}M params, training state "
          f"{state / 1e9:.2f} GB), batch {args.batch} x {args.seq_len}, {args.steps} steps, "
          f"median of {args.reps}")
    print(f"unswapped: {base['tokens_per_s']:.0f} tokens/s, {base['step_s']:.2f} s/step, "
          f"peak RSS {base['rss_mb']:.0f} MB")
    print(f"{'tier':5} {'budget':>10} {'tokens/s':>9} {'ratio':>6} {'s/step':>7} "
          f"{'predicted':>9} {'RSS MB':>7} {'cache MB':>8}")
    for tier in args.tiers:
        for f in args.fractions:
            budget = int(state * f)
            res = measure(f"{tier}_{f}", [f"swap.budget={budget}", f"swap.tier={tier}",
                                           f"swap.dir={swap_dir}"])
            if "refused" in res:
                print(f"{tier:5} {f:>9.0%} refused: the smallest feasible budget is {res['refused']}")
                continue
            ratio = res["tokens_per_s"] / base["tokens_per_s"]
            pred = f"{res['predicted_s']:.2f}" if res["predicted_s"] else "-"
            print(f"{tier:5} {f:>9.0%} {res['tokens_per_s']:>9.0f} {ratio:>6.2f} "
                  f"{res['step_s']:>7.2f} {pred:>9} {res['rss_mb']:>7.0f} {res['cache_mb']:>8.0f}")
    subprocess.run(["rm", "-rf", work])


def run_one(args, out_dir, sets):
    cmd = ["/usr/bin/time", "-f", "maxrss_kb %M", args.starling, "train", "--config",
           args.config, "--set", f"model.preset={args.preset}", "--set", f"data.dir={args.data}",
           "--set", f"train.out_dir={out_dir}", "--set", f"train.steps={args.steps}",
           "--set", f"train.batch_size={args.batch}", "--set", f"model.seq_len={args.seq_len}",
           "--set", "train.grad_accum=1", "--set", "train.log_every=1", "--set",
           "train.eval_every=0", "--set", "train.eval_batches=1", "--set",
           "train.checkpoint_every=0", "--set", "train.sample_at_end=false",
           "--set", "train.threads=0"]
    for s in sets:
        cmd += ["--set", s]
    before = cached_kb()
    p = subprocess.run(cmd, capture_output=True, text=True)
    grown_mb = (cached_kb() - before) / 1024
    text = p.stdout + p.stderr
    if p.returncode != 0:
        m = re.search(r"smallest feasible budget is ([0-9.]+ [KMG]?B)", text)
        subprocess.run(["rm", "-rf", out_dir])
        if m:
            return {"refused": m.group(1)}
        sys.exit(f"starling train failed:\n{text}")
    tokens_per_s = steady(os.path.join(out_dir, "metrics.jsonl"))
    step_s = args.batch * args.seq_len / tokens_per_s
    subprocess.run(["rm", "-rf", out_dir])
    predicted = re.search(r"predicted ([0-9.]+) s", text)
    return {"tokens_per_s": tokens_per_s, "step_s": step_s,
            "rss_mb": int(re.search(r"maxrss_kb (\d+)", text).group(1)) / 1024,
            "cache_mb": grown_mb,
            "predicted_s": float(predicted.group(1)) if predicted else None}


if __name__ == "__main__":
    main()
