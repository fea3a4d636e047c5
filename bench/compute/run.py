#!/usr/bin/env python3
"""Compute benchmark: Starling's training step against PyTorch eager, same model, batch, threads.

    python3 bench/compute/run.py                       # what `make bench` runs
    python3 bench/compute/run.py --presets gpt2-mini --threads 1 --repeats 3 --steps 3
    python3 bench/compute/run.py --only-torch          # without a built starling binary
    python3 bench/compute/run.py --device cuda --presets gpt2-124m,llama-125m --threads 1 \\
        --starling build-cuda/starling                 # a GPU: fp32 and bf16 against torch's modes

For every preset and thread count it runs, R times and alternating which goes first,
  build/starling bench compute --preset P --batch B --threads N --steps S --warmup W --json
  bench/compute/torch_baseline.py --preset P --batch B --threads N --steps S --warmup W
each in its own process with OMP_NUM_THREADS=N, and reads the one JSON line each prints. It then
prints a table of medians over the R repeats and the ratio starling/torch of the median tokens/s
(> 1: Starling is faster), and writes every run plus the table to build/bench/compute-results.json.
Both sides time the same work: forward, backward, gradient clipping and an AdamW step on a fixed
batch of random tokens. See bench/compute/README.md for how to read the numbers.

With --device cuda the sides are Starling fp32 and bf16 (train.dtype) and PyTorch's three usual
modes (torch_baseline.py --mode eager, eager-bf16, compile-bf16), and the table adds TFLOP/s and
peak GPU memory; ratios compare Starling bf16 with PyTorch eager bf16 and torch.compile.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def parse_list(text, kind=str):
    return [kind(x) for x in text.split(",") if x.strip()]


def last_json_line(stdout):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return None


def run_one(cmd, threads, timeout):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"run.py: timed out after {timeout} s: {' '.join(cmd)}")
    result = last_json_line(p.stdout) if p.returncode == 0 else None
    if result is None:
        sys.exit(f"run.py: {' '.join(cmd)} failed (exit {p.returncode}) without a JSON line\n"
                 f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return result


def commands(a, preset, threads):
    common = ["--preset", preset, "--batch", str(a.batch), "--threads", str(threads),
              "--steps", str(a.steps), "--warmup", str(a.warmup)]
    starling = [a.starling, "bench", "compute", *common, "--json"]
    torch = [a.python, os.path.join(HERE, "torch_baseline.py"), *common]
    if a.seq_len:
        starling += ["--set", f"model.seq_len={a.seq_len}"]
        torch += ["--seq-len", str(a.seq_len)]
    # The same Starling step on libtorch's default CPU allocator: shows how much of the ratio is
    # the caching allocator (page faults avoided) and how much is the rest.
    if a.device != "cpu":
        starling += ["--device", a.device]
        torch += ["--device", a.device]
        return {"starling": starling, "starling-bf16": starling + ["--dtype", "bf16"],
                "torch": torch, "torch-eager-bf16": torch + ["--mode", "eager-bf16"],
                "torch-compile-bf16": torch + ["--mode", "compile-bf16"]}
    system = starling + ["--system-allocator"]
    return {"starling": starling, "starling-sysalloc": system, "torch": torch}


def summarize(runs, impl):
    mine = [r for r in runs if r["impl"] == impl]
    if not mine:
        return None
    med = lambda key: statistics.median(r[key] for r in mine)  # noqa: E731
    return {"n": len(mine), "tokens_per_s": med("tokens_per_s"), "step_ms": med("step_ms"),
            "mfu": med("mfu"), "peak_gflops": med("peak_gflops"),
            "tflops": med("tflops") if all("tflops" in r for r in mine) else None,
            "peak_memory_mb": max(r.get("peak_memory_mb", 0) for r in mine),
            "tokens_per_s_min": min(r["tokens_per_s"] for r in mine),
            "tokens_per_s_max": max(r["tokens_per_s"] for r in mine)}


def print_table(rows):
    def cell(x, width):
        if not x:
            return f"{'-':>{width}}{'-':>8}"
        return f"{x['tokens_per_s']:>{width}.0f}{100 * x['mfu']:>7.1f}%"

    head = (f"{'preset':<12}{'thr':>4}{'batch':>6}{'seq':>5} | {'starling tok/s':>15}{'MFU':>8} | "
            f"{'sys-alloc tok/s':>16}{'MFU':>8} | {'torch tok/s':>12}{'MFU':>8} | {'ratio':>6}"
            f" | {'sys ratio':>9}")
    print(head)
    print("-" * len(head))
    for row in rows:
        ratio = f"{row['ratio']:>6.2f}" if row["ratio"] is not None else f"{'-':>6}"
        sys_ratio = (f"{row['sysalloc_ratio']:>9.2f}" if row["sysalloc_ratio"] is not None
                     else f"{'-':>9}")
        print(f"{row['preset']:<12}{row['threads']:>4}{row['batch']:>6}{row['seq_len']:>5} | "
              f"{cell(row['starling'], 15)} | {cell(row['starling-sysalloc'], 16)} | "
              f"{cell(row['torch'], 12)} | {ratio} | {sys_ratio}")
    print("medians over repeats; ratio = starling tokens/s / torch tokens/s (> 1: starling faster);")
    print("sys ratio = the same with Starling on libtorch's default CPU allocator")


GPU_RATIOS = [("starling", "torch"), ("starling-bf16", "torch-eager-bf16"),
              ("starling-bf16", "torch-compile-bf16")]


def print_gpu_table(rows):
    head = (f"{'preset':<12}{'batch':>6}{'seq':>6}  {'implementation':<20}{'tok/s':>10}"
            f"{'TFLOP/s':>9}{'MFU':>8}{'peak GB':>9}")
    print(head)
    print("-" * len(head))
    for row in rows:
        for impl, x in row["impls"].items():
            if not x:
                continue
            print(f"{row['preset']:<12}{row['batch']:>6}{row['seq_len']:>6}  {impl:<20}"
                  f"{x['tokens_per_s']:>10.0f}{x['tflops'] or 0:>9.1f}{100 * x['mfu']:>7.1f}%"
                  f"{x['peak_memory_mb'] / 1e3:>9.2f}")
        for (a, b), r in zip(GPU_RATIOS, row["ratios"]):
            if r is not None:
                print(f"{'':<26}ratio {a} / {b}: {r:.2f}")
    print("medians over repeats; MFU against the measured matmul peak of each side's dtype "
          "(bf16 tensor cores for bf16); ratio > 1: Starling faster")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="gpt2-mini,llama-mini", help="comma-separated presets")
    ap.add_argument("--threads", default="2,1", help="comma-separated thread counts")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per run")
    ap.add_argument("--repeats", type=int, default=5, help="runs per implementation and row")
    ap.add_argument("--seq-len", type=int, default=0, help="override the presets' seq_len")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"),
                    help="the starling binary (default: build/starling)")
    ap.add_argument("--python", default=sys.executable,
                    help="python with torch for the baseline (default: this interpreter)")
    ap.add_argument("--only-torch", action="store_true", help="run the torch baseline alone")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "compute-results.json"),
                    help="where to write all runs and the table (JSON)")
    a = ap.parse_args(argv)

    if a.device != "cpu":
        impls = ["starling", "starling-bf16", "torch", "torch-eager-bf16", "torch-compile-bf16"]
        if a.only_torch:
            impls = [i for i in impls if i.startswith("torch")]
    else:
        impls = ["torch"] if a.only_torch else ["starling", "starling-sysalloc", "torch"]
    if "starling" in impls and not os.access(a.starling, os.X_OK):
        ap.error(f"no starling binary at {a.starling}: build it (cmake --build build) or pass "
                 "--starling PATH, or run the torch side alone with --only-torch")

    runs, rows = [], []
    for preset in parse_list(a.presets):
        for threads in parse_list(a.threads, int):
            cmds = commands(a, preset, threads)
            row_runs = []
            for rep in range(a.repeats):
                # Alternate who goes first so slow drift (thermal, neighbours) hits both sides.
                order = impls if rep % 2 == 0 else impls[::-1]
                for impl in order:
                    r = run_one(cmds[impl], threads, a.timeout)
                    r.update(impl=impl, repeat=rep)
                    row_runs.append(r)
                    print(f"  {preset} threads={threads} repeat {rep + 1}/{a.repeats} {impl}: "
                          f"{r['tokens_per_s']:.0f} tokens/s, {r['step_ms']:.1f} ms/step",
                          file=sys.stderr, flush=True)
            if a.device != "cpu":
                summary = {i: summarize(row_runs, i) for i in impls}
                ratios = [summary[x]["tokens_per_s"] / summary[y]["tokens_per_s"]
                          if summary.get(x) and summary.get(y) else None for x, y in GPU_RATIOS]
                rows.append({"preset": preset, "threads": threads, "batch": a.batch,
                             "seq_len": row_runs[0]["seq_len"], "impls": summary,
                             "ratios": ratios})
                runs += row_runs
                continue
            s, t = summarize(row_runs, "starling"), summarize(row_runs, "torch")
            sa = summarize(row_runs, "starling-sysalloc")
            rows.append({"preset": preset, "threads": threads, "batch": a.batch,
                         "seq_len": row_runs[0]["seq_len"], "starling": s,
                         "starling-sysalloc": sa, "torch": t,
                         "ratio": s["tokens_per_s"] / t["tokens_per_s"] if s and t else None,
                         "sysalloc_ratio": sa["tokens_per_s"] / t["tokens_per_s"] if sa and t
                         else None})
            runs += row_runs

    print_gpu_table(rows) if a.device != "cpu" else print_table(rows)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
        "settings": vars(a), "rows": rows, "runs": runs,
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
