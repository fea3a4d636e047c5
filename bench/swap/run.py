#!/usr/bin/env python3
"""Swap benchmark: tokens/s of swapped training at fractions of the training state, against
unswapped training of the same model, data and seeds, measured in the same run.

    /usr/bin/python3 bench/swap/run.py --starling build/starling                # gpt2-124m
    /usr/bin/python3 bench/swap/run.py --preset gpt2-mini --steps 4 --reps 1    # quick look
    /usr/bin/python3 bench/swap/run.py --set optim.grad_clip=0   # updates inside the backward
    python3 bench/swap/run.py --starling build-cuda/starling --device cuda --batch 8 --seq-len 1024

On a GPU (--device cuda) the budget is GPU memory and the tier is pinned host RAM ("host"); the
table also reports each run's device memory peak (activations included).

For every tier (--tiers, default disk and host) and budget (--fractions of the training state,
16 bytes per parameter; default 1.0 0.5 0.3 0.15) it runs `starling train` for --steps steps and
reports the median tokens/s of --reps runs (the first step, which profiles and warms up, is not
counted), the ratio to unswapped runs interleaved with the swapped ones (each swapped run
follows one of its own; the median of the pairs' ratios), the peak RSS over the steady steps (sampled from
/proc every 0.1 s between the first and the last step's record) beside the whole run's peak (GNU
time; it includes building the model in RAM and profiling it, with all weights resident), how much the page cache grew over those steps (/proc/meminfo Cached: O_DIRECT keeps it
flat), and the planner's predicted step time against the measured one (with clipping and the update
begun inside the backward as a guess, the mean of the plan's predictions for a guess kept, a guess
redone and no guess, weighted by the run's own counts). A budget the planner refuses is reported as such,
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
import time


def cached_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1])
    return 0


def disk_bandwidth(directory):
    """Sustained O_DIRECT write and read bandwidth of `directory` (GB/s), with dd: 2 GB in 8 MB
    blocks, independent of the planner's own shorter measurement."""
    probe = os.path.join(directory, "bandwidth-probe.bin")

    def rate(cmd):
        out = subprocess.run(cmd, capture_output=True, text=True).stderr
        m = re.search(r"copied, ([0-9.]+) s", out)
        return 2 * 1024 ** 3 / float(m.group(1)) / 1e9

    try:
        write = rate(["dd", "if=/dev/zero", f"of={probe}", "bs=8M", "count=256", "oflag=direct"])
        read = rate(["dd", f"if={probe}", "of=/dev/null", "bs=8M", "iflag=direct"])
    finally:
        if os.path.exists(probe):
            os.remove(probe)
    return write, read


def count_steps(metrics_path):
    try:
        with open(metrics_path) as f:
            return sum(1 for line in f if '"tokens_per_s"' in line)
    except FileNotFoundError:
        return 0


def rss_kb(pid):
    """The resident set of `pid` and its children (GNU time runs starling as a child)."""
    total = 0
    for p in [pid] + children(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def steady(metrics_path):
    """The median tokens/s of every step but the first (which profiles and warms up), and the
    range of those steps' times as a share of their median: how much the machine itself drifted
    within the run, the scale against which a prediction's error can be read."""
    rows = [json.loads(l) for l in open(metrics_path) if '"tokens_per_s"' in l]
    rates = [r["tokens_per_s"] for r in rows if r["step"] > 1]
    times = [1 / r for r in rates]
    return statistics.median(rates), (max(times) - min(times)) / statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--starling", default="build/starling")
    ap.add_argument("--config", default="configs/demo.toml")
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tiers", nargs="+", default=None,
                    help="default: disk and host on the CPU, host on a GPU")
    ap.add_argument("--device", default="cpu", help="train.device: cpu or cuda")
    ap.add_argument("--dtype", default="fp32", help="train.dtype: fp32 or bf16")
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.5, 0.3, 0.15])
    ap.add_argument("--text", default="data/brown/text")
    ap.add_argument("--data", default="")
    ap.add_argument("--swap-dir", default="")
    ap.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE",
                    help="a config setting for every run, unswapped ones too (repeatable), e.g. "
                         "optim.grad_clip=0")
    args = ap.parse_args()
    if args.tiers is None:
        args.tiers = ["disk", "host"] if args.device == "cpu" else ["host"]
    work = tempfile.mkdtemp(prefix="starling_swap_bench_", dir=os.getcwd())
    if not args.data:
        args.data = os.path.join(work, "data")
        subprocess.run([args.starling, "data", "prepare", args.text, "--out", args.data],
                       check=True, capture_output=True)
    swap_dir = args.swap_dir or work

    plain_runs = []

    def measure(tag, sets, paired=False):
        # Paired: every swapped run follows an unswapped one of its own, and the ratio is the
        # median of the pairs' ratios, so a shared machine's drift does not bias it.
        results, ratios = [], []
        for r in range(args.reps):
            plain = run_one(args, os.path.join(work, f"plain_{tag}_{r}"), []) if paired else None
            out = os.path.join(work, f"{tag}_{r}")
            res = run_one(args, out, sets)
            if "refused" in res:
                return res
            results.append(res)
            if plain:
                plain_runs.append(plain)
                ratios.append(res["tokens_per_s"] / plain["tokens_per_s"])
        return {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in results),
                "ratio": statistics.median(ratios) if ratios else None,
                "step_s": statistics.median(x["step_s"] for x in results),
                "spread": statistics.median(x["spread"] for x in results),
                "rss_mb": statistics.median(x["rss_mb"] for x in results),
                "steady_rss_mb": statistics.median(x["steady_rss_mb"] for x in results),
                "cache_mb": statistics.median(x["cache_mb"] for x in results),
                "predicted_s": (statistics.median(x["predicted_s"] for x in results)
                                if results[0]["predicted_s"] else None),
                "io_slowdown": statistics.median(x["io_slowdown"] for x in results),
                "moved_gb": results[0]["moved_gb"],
                "optimizer_s": statistics.median(x["optimizer_s"] for x in results),
                "device_gb": statistics.median(x["device_gb"] for x in results),
                "tier_bw": results[0]["tier_bw"]}

    base = measure("plain", [])
    plain_runs.clear()
    write_bw, read_bw = disk_bandwidth(swap_dir) if "disk" in args.tiers else (0, 0)
    info = subprocess.run([args.starling, "model", "presets"], capture_output=True, text=True).stdout
    m = re.search(rf"^{re.escape(args.preset)}\s.*?([0-9.]+)M params", info, re.M)
    params = float(m.group(1)) * 1e6
    state = 16 * params
    print(f"swap benchmark: {args.preset} ({params / 1e6:.1f}M params, training state "
          f"{state / 1e9:.2f} GB), batch {args.batch} x {args.seq_len}, {args.steps} steps, "
          f"median of {args.reps}, on {args.device} ({args.dtype})")
    gpu = args.device != "cpu"
    if gpu:
        print(f"unswapped: device memory peak over the steps {base['device_gb']:.2f} GiB "
              f"(activations included)")
    print(f"unswapped: {base['tokens_per_s']:.0f} tokens/s, {base['step_s']:.2f} s/step "
          f"(steady steps' range {base['spread']:.0%} of their median), "
          f"RSS over the steps {base['steady_rss_mb']:.0f} MB (peak of the run "
          f"{base['rss_mb']:.0f} MB), page cache grown by {base['cache_mb']:.0f} MB")
    if write_bw:
        print(f"disk under {swap_dir}: {write_bw:.2f} GB/s write, {read_bw:.2f} GB/s read "
              f"(dd, O_DIRECT, 2 GB)")
    print("limit: max(unswapped step, the step's planned bytes at the tier's bandwidth: dd's for "
          "the disk, the planner's probe for pinned RAM below a GPU), the fastest a swapped step "
          "can be")
    print("opt: seconds per step in the optimizer (AdamW streamed through the tier; swapped, most of it"
          " overlaps the next step's forward)")
    print("slow: the planner's probe of how much longer the computation takes while the tier "
          "moves data (swap.io_slowdown), which its prediction counts")
    print("range: the steady steps' slowest minus fastest time, as a share of their median (the "
          "machine's own drift within a run, against which the prediction's error can be read)")
    print("RSS: peak over the steady steps (the whole run's peak, with model construction and "
          "the final checkpoint, in brackets); cache: page-cache growth over the steps")
    if gpu:
        print("dev GiB: device memory peak over the steps (the budget's state, activations, "
              "autocast's copies)")
    print(f"{'tier':5} {'budget':>10} {'tokens/s':>9} {'ratio':>6} {'s/step':>7} "
          f"{'limit':>6} {'predicted':>9} {'slow':>5} {'range':>5} {'opt':>5} {'RSS MB':>14} {'cache MB':>8}"
          + (f" {'dev GiB':>7}" if gpu else ""))
    for tier in args.tiers:
        for f in args.fractions:
            budget = int(state * f)
            res = measure(f"{tier}_{f}", [f"swap.budget=\"{budget}B\"", f"swap.tier={tier}",
                                           f"swap.dir={swap_dir}"], paired=True)
            if "refused" in res:
                print(f"{tier:5} {f:>9.0%} refused: the smallest feasible budget is {res['refused']}")
                continue
            ratio = res["ratio"]
            pred = f"{res['predicted_s']:.2f}" if res["predicted_s"] else "-"
            rss = f"{res['steady_rss_mb']:.0f} ({res['rss_mb']:.0f})"
            read_gb, write_gb = res["moved_gb"]
            if tier == "disk" and read_bw:
                io_s = read_gb / read_bw + write_gb / write_bw  # one disk
            elif gpu and res["tier_bw"]:
                # Pinned RAM below a GPU: loads and stores run on separate copy engines.
                io_s = max(read_gb / res["tier_bw"][0], write_gb / res["tier_bw"][1])
            else:
                io_s = 0
            limit = max(base["step_s"], io_s)
            print(f"{tier:5} {f:>9.0%} {res['tokens_per_s']:>9.0f} {ratio:>6.2f} "
                  f"{res['step_s']:>7.2f} {limit:>6.2f} {pred:>9} {res['io_slowdown']:>5.0%} {res['spread']:>5.0%} {res['optimizer_s']:>5.2f} {rss:>14} "
                  f"{res['cache_mb']:>8.0f}" + (f" {res['device_gb']:>7.2f}" if gpu else ""))
    if plain_runs:
        print(f"unswapped runs paired with the rows: median "
              f"{statistics.median(x['tokens_per_s'] for x in plain_runs):.0f} tokens/s, range "
              f"{min(x['tokens_per_s'] for x in plain_runs):.0f}-"
              f"{max(x['tokens_per_s'] for x in plain_runs):.0f}")
    subprocess.run(["rm", "-rf", work])


def run_one(args, out_dir, sets):
    # GNU time gives the whole run's peak RSS where it is installed.
    timer = ["/usr/bin/time", "-f", "maxrss_kb %M"] if os.path.exists("/usr/bin/time") else []
    cmd = timer + [args.starling, "train", "--config",
           args.config, "--set", f"model.preset={args.preset}", "--set", f"data.dir={args.data}",
           "--set", f"train.out_dir={out_dir}", "--set", f"train.steps={args.steps}",
           "--set", f"train.batch_size={args.batch}", "--set", f"model.seq_len={args.seq_len}",
           "--set", "train.grad_accum=1", "--set", "train.log_every=1", "--set",
           "train.eval_every=0", "--set", "train.eval_batches=1", "--set",
           "train.checkpoint_every=0", "--set", "train.sample_at_end=false",
           "--set", "train.threads=0", "--set", f"train.device={args.device}",
           "--set", f"train.dtype={args.dtype}"]
    for s in list(args.extra) + list(sets):
        cmd += ["--set", s]
    # Peak RSS and page-cache growth over the steady steps: from the first step's record (the
    # planner's profiling and the model's construction come before it) to the last step's (the
    # final checkpoint, which gathers the whole state, comes after it).
    metrics = os.path.join(out_dir, "metrics.jsonl")
    log_path = out_dir + ".log"
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        steady_rss_kb = 0
        cache_start = cache_peak = None
        while p.poll() is None:
            lines = count_steps(metrics)
            if 1 <= lines < args.steps:
                rss = rss_kb(p.pid)
                steady_rss_kb = max(steady_rss_kb, rss)
                cached = cached_kb()
                cache_start = cached if cache_start is None else cache_start
                cache_peak = max(cache_peak or 0, cached)
            time.sleep(0.1)
    with open(log_path) as f:
        text = f.read()
    os.remove(log_path)
    grown_mb = ((cache_peak - cache_start) / 1024) if cache_start is not None else 0
    if p.returncode != 0:
        m = re.search(r"smallest feasible budget is ([0-9.]+ [KMG]?B)", text)
        subprocess.run(["rm", "-rf", out_dir])
        if m:
            return {"refused": m.group(1)}
        sys.exit(f"starling train failed:\n{text}")
    tokens_per_s, spread = steady(os.path.join(out_dir, "metrics.jsonl"))
    step_s = args.batch * args.seq_len / tokens_per_s
    subprocess.run(["rm", "-rf", out_dir])
    scale = {"B": 1e-9, "KB": 1e-6, "MB": 1e-3, "GB": 1.0}
    predicted = re.search(r"predicted ([0-9.]+) s", text)
    predicted_s = float(predicted.group(1)) if predicted else None
    # With clipping the update may start inside the backward as a guess: the plan predicts a step
    # whose guess is kept, one whose guess is redone and one without a guess, and the run's report
    # counts its guesses; the prediction is their mean over the run's steps.
    guess = re.search(r"predicted ([0-9.]+) s a step when the guess is kept, ([0-9.]+) s when it "
                      r"is redone, ([0-9.]+) s without a guess", text)
    if guess and predicted_s is not None:
        counts = re.search(r"(\d+) updates begun before their clipping was known, (\d+) of them "
                           r"redone", text)
        guessed, redone = (int(counts.group(1)), int(counts.group(2))) if counts else (0, 0)
        kept_s, redone_s, none_s = (float(guess.group(i)) for i in (1, 2, 3))
        predicted_s = ((guessed - redone) * kept_s + redone * redone_s +
                       (args.steps - guessed) * none_s) / args.steps
    slowed = re.search(r"the computation runs ([0-9]+)% slower while the tier moves data", text)
    moved = re.search(r"\(read ([0-9.]+) (B|KB|MB|GB), write ([0-9.]+) (B|KB|MB|GB)\)", text)
    optimizer = re.search(r"optimizer ([0-9.]+) s \(waiting", text)
    maxrss = re.search(r"maxrss_kb (\d+)", text)
    device_peak = re.search(r"device memory peak over the steps ([0-9.]+) GiB", text)
    # The planner's own measurement of the tier: "tier host (read 25.1 GB/s, write 24.0 GB/s)",
    # with ", at once" where loads and stores overlap (pinned RAM below a GPU), or how it copies.
    bw = re.search(r"\(read ([0-9.]+) (B|KB|MB|GB)/s, write ([0-9.]+) (B|KB|MB|GB)/s(?:, [a-z ]+)?\)",
                   text)
    return {"tokens_per_s": tokens_per_s, "step_s": step_s, "spread": spread,
            "rss_mb": int(maxrss.group(1)) / 1024 if maxrss else 0.0,
            "steady_rss_mb": steady_rss_kb / 1024,
            "cache_mb": grown_mb,
            "predicted_s": predicted_s,
            "io_slowdown": float(slowed.group(1)) / 100 if slowed else 0.0,
            "moved_gb": (float(moved.group(1)) * scale[moved.group(2)],
                         float(moved.group(3)) * scale[moved.group(4)]) if moved else (0.0, 0.0),
            "optimizer_s": float(optimizer.group(1)) / args.steps if optimizer else 0.0,
            "device_gb": float(device_peak.group(1)) if device_peak else 0.0,
            "tier_bw": (float(bw.group(1)) * scale[bw.group(2)],
                        float(bw.group(3)) * scale[bw.group(4)]) if bw else None}


if __name__ == "__main__":
    main()
