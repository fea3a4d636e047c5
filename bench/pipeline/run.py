#!/usr/bin/env python3
"""Pipeline benchmark: tokens/s of a model cut into 2 and 4 stages on as many local peers, on
loopback and on shaped links, against single-process training of the same model and batches
measured in the same run; the measured bubble against the schedule's theoretical one; the bytes
that cross the stage boundaries per step.

    /usr/bin/python3 bench/pipeline/run.py --starling build/starling             # gpt2-mini
    /usr/bin/python3 bench/pipeline/run.py --stages 2 --links loopback --reps 1  # quick look
    /usr/bin/python3 bench/pipeline/run.py --stages 2 --links 10mbit --compression none topk:0.1 adatopk

Each configuration runs `starling train --peers S --set pipeline.num_stages=S` (uniform split by
node count, no compression unless --compression names others: the baseline the scheduler has to
beat) for --steps steps; shaped
links (`--link-rate`, a tbf qdisc per peer's namespace) need root and are skipped without it.
Tokens/s is the median over the steps after the first two of the last stage's records, then the
median over --reps runs; the ratio is against the single process's tokens/s, run before each
pipeline run (paired). Every peer runs train.threads = 1 and the single process
--baseline-threads (default 1), so on a machine with fewer cores than stages the stages share
them. The bubble is each stage's time waiting for the others over its busy time (from the
cumulative counters in its step records, after the second step), averaged over stages; the theoretical bubble of GPipe and 1F1B is
(S - 1) / (M + S - 1) for M micro-batches (train.grad_accum). The data is a byte-level corpus made
with `starling data prepare` from --text (default data/brown/text, made by `make data`).
"""
import argparse
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from bench_run import prepare, run  # noqa: E402
from records import read_jsonl as records  # noqa: E402


def steady_tokens_per_s(metrics):
    rows = [r["tokens_per_s"] for r in records(metrics) if r.get("step", 0) > 2 and "tokens_per_s" in r]
    return statistics.median(rows) if rows else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default="build/starling")
    ap.add_argument("--text", default="data/brown/text")
    ap.add_argument("--preset", default="gpt2-mini")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--links", nargs="+", default=["loopback", "1gbit", "100mbit", "10mbit"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline-threads", type=int, default=1)
    ap.add_argument("--extra-warmup", type=int, default=0, help="pipeline.extra_warmup (1f1b)")
    ap.add_argument("--compression", nargs="+", default=["none"],
                    help="pipeline.compression values to compare: none, topk, topk:RATIO, adatopk")
    args = ap.parse_args()

    work, cfg = prepare(args.starling, args.text, "starling_bench_pipeline_",
                        f'preset = "{args.preset}"\n',
                        f"steps = {args.steps}\nbatch_size = {args.batch}\ngrad_accum = {args.accum}\n")
    root = os.geteuid() == 0
    tokens_per_step = None
    rows = []
    n = 0
    for stages, link, compression in [(s, l, c) for s in args.stages for l in args.links
                                      for c in args.compression]:
        if link != "loopback" and not root:
            print(f"{stages} stages, {link}: skipped (shaped links need root)")
            continue
        mode, _, ratio = compression.partition(":")
        ratios, tps, base, bubbles, mb_step, keep, loss = [], [], [], [], [], [], []
        for rep in range(args.reps):
            n += 1
            one = os.path.join(work, f"one{n}")
            run([args.starling, "train", "-q", "--config", cfg, "--set", f'train.out_dir="{one}"',
                 "--set", f"train.threads={args.baseline_threads}"], one + ".log")
            b = steady_tokens_per_s(os.path.join(one, "metrics.jsonl"))
            out = os.path.join(work, f"pipe{n}")
            cmd = [args.starling, "train", "-q", "--config", cfg, "--peers", str(stages),
                   "--set", f'train.out_dir="{out}"', "--set", f"pipeline.num_stages={stages}",
                   "--set", f'pipeline.schedule="{args.schedule}"']
            if link != "loopback":
                cmd += ["--link-rate", link]
            cmd += ["--set", f'pipeline.compression="{mode}"',
                "--set", f"pipeline.extra_warmup={args.extra_warmup}"]
            if ratio:
                cmd += ["--set", f"pipeline.topk_ratio={ratio}"]
            run(cmd, out + ".log")
            t = steady_tokens_per_s(os.path.join(out, f"peer-{stages - 1}", "metrics.jsonl"))
            # From each stage's step records (cumulative counters in "net"): the steps after
            # the second, so neither start-up nor the final evaluation counts.
            waits, sent = [], 0.0
            for s in range(stages):
                recs = {r["step"]: r["net"] for r in records(os.path.join(out, f"peer-{s}", "metrics.jsonl"))
                        if "net" in r and "loss" in r}
                first, last = recs[2], recs[max(recs)]
                steps = last["round"] - first["round"]
                compute = last["compute_s"] - first["compute_s"]
                wait = last["net_wait_s"] - first["net_wait_s"]
                waits.append(wait / (compute + wait) if compute + wait > 0 else 0)
                sent += (last["pipeline_bytes"] - first["pipeline_bytes"]) / 1e6 / steps
                keep.append(last.get("keep_ratio", 1.0))
            final = [r["loss"] for r in records(os.path.join(out, f"peer-{stages - 1}", "metrics.jsonl"))
                     if "loss" in r]
            loss.append(final[-1] if final else float("nan"))
            base.append(b)
            tps.append(t)
            ratios.append(t / b if b > 0 else 0)
            bubbles.append(statistics.mean(waits) if waits else float("nan"))
            mb_step.append(sent)
        theory = (stages - 1) / (args.accum + stages - 1)
        row = dict(stages=stages, link=link, tokens_per_s=statistics.median(tps),
                   single_tokens_per_s=statistics.median(base), ratio=statistics.median(ratios),
                   bubble=statistics.median(bubbles), theoretical_bubble=theory,
                   mb_per_step=statistics.median(mb_step), compression=compression,
                   keep_ratio=statistics.median(keep), final_loss=statistics.median(loss))
        rows.append(row)
        print(f"{stages} stages, {link:8}, {compression:9}: {row['ratio']:.2f}x single process "
              f"({row['tokens_per_s']:.0f} vs {row['single_tokens_per_s']:.0f} tok/s), "
              f"bubble {100 * row['bubble']:.0f}% (theory {100 * theory:.0f}%), "
              f"{row['mb_per_step']:.2f} MB/step across stages, keeping "
              f"{100 * row['keep_ratio']:.1f}% of entries, final loss {row['final_loss']:.4f}",
              flush=True)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("results in", os.path.join(work, "results.json"))


if __name__ == "__main__":
    main()
