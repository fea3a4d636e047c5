#!/usr/bin/env python3
"""What compression on a pipeline's links costs in loss and buys in speed: a pipeline of 2 stages
on a shaped link trained with whole tensors, with fixed top-k and with AdaTopK, each for the same
tokens. Validation loss against tokens and against time, tokens/s, bytes across the stage
boundary per step, and the fraction of entries kept.

    /usr/bin/python3 bench/pipeline/compression.py --starling build/starling        # ~15 min
    /usr/bin/python3 bench/pipeline/compression.py --steps 60 --configs none adatopk  # quick look

The model, data and optimizer are bench/strategies/config.toml's (gpt2-tiny, Brown corpus in
bytes); a step is 16 sequences of 128 tokens as 4 micro-batches of 4 (1F1B with
pipeline.extra_warmup = --extra-warmup, 2 by default), evaluated every --eval-every steps. Each configuration is `starling train --peers 2 --set pipeline.num_stages=2
--link-rate LINK` (a tbf qdisc per peer's namespace; needs root, else loopback). A configuration
is a pipeline.compression value, with topk's ratio after a colon (topk:0.1).

Results go to --json (default build/bench/pipeline-compression.json); --plot writes
docs/img/pipeline-compression-loss.png from that file without running anything.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for records.py
from records import read_jsonl  # noqa: E402  (bench/records.py)


def train(args, config, out):
    mode, _, ratio = config.partition(":")
    cmd = [args.starling, "train", "-q", "--config", os.path.join(ROOT, "bench/strategies/config.toml"),
           "--peers", "2", "--set", "pipeline.num_stages=2", "--set", "strategy.kind=\"none\"",
           "--set", f'train.out_dir="{out}"', "--set", f"train.steps={args.steps}",
           "--set", "train.batch_size=4", "--set", "train.grad_accum=4", "--set", "train.log_every=1",
           "--set", f"train.eval_every={args.eval_every}", "--set", f'data.dir="{args.data}"',
           "--set", f'pipeline.compression="{mode}"', "--set", f"pipeline.extra_warmup={args.extra_warmup}"]
    if ratio:
        cmd += ["--set", f"pipeline.topk_ratio={ratio}"]
    for kv in args.set:
        cmd += ["--set", kv]
    if args.link != "loopback" and os.geteuid() == 0:
        cmd += ["--link-rate", args.link]
    with open(out + ".log", "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + open(out + ".log").read()[-3000:])
    last = read_jsonl(os.path.join(out, "peer-1", "metrics.jsonl"))
    first = read_jsonl(os.path.join(out, "peer-0", "metrics.jsonl"))
    evals = [(r["tokens"], r["val_loss"], r.get("elapsed_s", 0)) for r in last if "val_loss" in r]
    steps = [r for r in last if "loss" in r and "net" in r]
    # Steady rate and traffic after the second step (the first sends whole tensors: nothing is
    # measured yet), from both stages' cumulative counters.
    rate = statistics.median(r["tokens_per_s"] for r in steps if r["step"] > 2)
    sent, keep = 0.0, 1.0
    for recs in (first, last):
        net = {r["step"]: r["net"] for r in recs if "net" in r and "loss" in r}
        a, b = net[2], net[max(net)]
        sent += (b["pipeline_bytes"] - a["pipeline_bytes"]) / (b["round"] - a["round"]) / 1e6
        keep = b.get("keep_ratio", 1.0)  # the last stage's: it sends the gradients
    return dict(config=config, tokens_per_s=rate, mb_per_step=sent, keep_ratio=keep,
                evals=evals, final_val_loss=evals[-1][1] if evals else None)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in results["runs"]:
        tokens = [e[0] / 1e6 for e in r["evals"]]
        loss = [e[1] for e in r["evals"]]
        secs = [e[2] / 60 for e in r["evals"]]
        label = (f"{r['config']} ({100 * r['keep_ratio']:.0f}% of gradient entries kept, "
                 f"{r['tokens_per_s']:.0f} tok/s)")
        axes[0].plot(tokens, loss, marker="o", label=label)
        axes[1].plot(secs, loss, marker="o", label=label)
    axes[0].set_xlabel("tokens (M)")
    axes[1].set_xlabel("minutes")
    for ax in axes:
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"gpt2-tiny, 2 stages, {results['link']} link between them")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default="build/starling")
    ap.add_argument("--data", default="data/brown/byte")
    ap.add_argument("--link", default="10mbit")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--configs", nargs="+", default=["none", "topk:0.1", "adatopk"])
    ap.add_argument("--extra-warmup", type=int, default=2, help="pipeline.extra_warmup, every run")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--json", default=os.path.join(ROOT, "build/bench/pipeline-compression.json"))
    ap.add_argument("--plot", action="store_true", help="only plot --json")
    ap.add_argument("--figure", default=os.path.join(ROOT, "docs/img/pipeline-compression-loss.png"),
                    help="where the plot goes (after a run, or with --plot)")
    args = ap.parse_args()
    figure = args.figure
    if args.plot:
        with open(args.json) as f:
            plot(json.load(f), figure)
        return
    args.starling = os.path.abspath(args.starling)
    args.data = os.path.abspath(os.path.join(ROOT, args.data))
    work = tempfile.mkdtemp(prefix="starling_bench_compression_")
    runs = []
    for i, config in enumerate(args.configs):
        r = train(args, config, os.path.join(work, f"run{i}"))
        runs.append(r)
        base = runs[0]
        print(f"{config:10} {r['tokens_per_s']:7.0f} tok/s ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x "
              f"{base['config']}), {r['mb_per_step']:.2f} MB/step across the link, "
              f"{100 * r['keep_ratio']:.1f}% of gradient entries kept, final val loss {r['final_val_loss']:.4f} "
              f"({100 * (r['final_val_loss'] / base['final_val_loss'] - 1):+.1f}% against {base['config']})",
              flush=True)
    results = dict(link=args.link if os.geteuid() == 0 else "loopback", steps=args.steps, runs=runs)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print("results in", args.json)
    plot(results, figure)


if __name__ == "__main__":
    main()
