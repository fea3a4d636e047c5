#!/usr/bin/env python3
"""Poisoned updates: five ddp peers, one of which sends garbage, averaged with the plain mean and
with the trimmed mean (strategy.aggregation), against a clean swarm.

    /usr/bin/python3 bench/chaos/poison.py --starling build/starling            # ~6 min on 2 cores
    python3 bench/chaos/poison.py --steps 30 --plot docs/img/poison-loss.png     # with a plot

The misbehaving peer is the last one, started with STARLING_FAULT_POISON (fault_injection.h):
"scale:-10" sends its gradients sign-flipped and ten times too large, "nan" sends NaN. Rows:

  clean     mean          nobody misbehaves (the baseline)
  clean     trimmed_mean  what robustness costs when nobody misbehaves
  scale:-10 mean          the average follows the poisoner uphill
  scale:-10 trimmed_mean  the extreme value of every element is dropped
  nan       mean          the ring rejects the NaN where it enters and names the sender: every
                          round fails, and the swarm trains nothing while the poisoner stays
  nan       trimmed_mean  the NaN update is dropped, the sender named, the others train on

For each it prints the validation loss at the end (and its ratio to the clean swarm's), seconds
per step, and the bytes each peer sent per step (the trimmed mean gathers every update: about P/2
times the mean's ring traffic). The data is --data (default data/brown/byte, made by `make data`).
With --plot PNG it draws the validation loss of every row against steps (matplotlib; skipped with
a note without it).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for records.py
from records import read_jsonl  # noqa: E402  (bench/records.py)

ROWS = [("clean", "mean"), ("clean", "trimmed_mean"), ("scale:-10", "mean"),
        ("scale:-10", "trimmed_mean"), ("nan", "mean"), ("nan", "trimmed_mean")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_swarm(args, work, poison, aggregation):
    """Trains one swarm; returns each peer's metrics records."""
    config = os.path.join(work, "run.toml")
    with open(config, "w") as f:
        f.write(f"""[model]
preset = "gpt2-tiny"
seq_len = 64

[data]
dir = "{os.path.abspath(args.data)}"

[train]
steps = {args.steps}
batch_size = 4
threads = 1
log_every = 5
eval_every = {max(1, args.steps // 10)}
eval_batches = 8
checkpoint_every = 0
sample_at_end = false

[optim]
lr = 3e-3
warmup_steps = 5

[strategy]
kind = "ddp"
aggregation = "{aggregation}"
""")
    entry = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for i in range(args.peers):
        argv = [args.starling, "peer", "-q", "--insecure", "--config", config,
                "--data-rank", str(i), "--data-world", str(args.peers), "--name", f"peer-{i}",
                "--set", f'train.out_dir="{os.path.join(work, f"peer-{i}")}"',
                "--set", f"net.min_peers={args.peers}"]
        argv += ["--listen", entry] if i == 0 else ["--join", entry]
        env = dict(os.environ)
        if i == args.peers - 1 and poison != "clean":
            env["STARLING_FAULT_POISON"] = poison
        with open(os.path.join(work, f"peer-{i}.log"), "w") as log:
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env))
    for i, p in enumerate(procs):
        if p.wait(timeout=3600) != 0:
            sys.exit(f"peer {i} failed ({poison}, {aggregation}): see {work}/peer-{i}.log")
    return [read_jsonl(os.path.join(work, f"peer-{i}", "metrics.jsonl"))
            for i in range(args.peers)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown", "byte"))
    ap.add_argument("--peers", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--plot", default="", help="draw the validation losses into this PNG")
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        ap.error(f"--data {args.data}: not a prepared dataset (run `make data`)")
    root = tempfile.mkdtemp(prefix="starling-poison-")
    curves, clean_val = {}, None
    print(f"poisoned updates: {args.peers} ddp peers, gpt2-tiny, {args.steps} steps; the last peer "
          f"misbehaves")
    print(f"{'poison':10} {'aggregation':13} {'val loss':>9} {'x clean':>8} {'s/step':>7} "
          f"{'KB sent/step':>13}  rounds rejected, naming the sender")
    for poison, aggregation in ROWS:
        work = os.path.join(root, f"{poison.replace(':', '')}-{aggregation}")
        os.makedirs(work)
        t0 = time.monotonic()
        records = run_swarm(args, work, poison, aggregation)
        wall = time.monotonic() - t0
        honest = records[0]
        vals = [(m["step"], m["val_loss"]) for m in honest if "val_loss" in m]
        curves[(poison, aggregation)] = vals
        final = vals[-1][1] if vals else float("nan")
        if poison == "clean" and aggregation == "mean":
            clean_val = final
        steps = [m for m in honest if "net" in m and "step" in m]
        sent = steps[-1]["net"]["bytes_sent"] / steps[-1]["step"] / 1e3 if steps else 0
        s_per_step = (honest[-1].get("elapsed_s", wall) / args.steps) if honest else wall
        # Rounds in which an honest peer's log rejected the poisoner's update by name.
        log0 = open(os.path.join(work, "peer-0.log")).read()
        rejected = sum(line.count(f"(peer-{args.peers - 1})") for line in log0.splitlines()
                       if "non-finite" in line)
        ratio = final / clean_val if clean_val else float("nan")
        print(f"{poison:10} {aggregation:13} {final:9.3f} {ratio:8.2f} {s_per_step:7.3f} "
              f"{sent:13.1f}  {rejected}", flush=True)
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed here; no plot drawn")
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        for (poison, aggregation), vals in curves.items():
            if vals:
                ax.plot([s for s, _ in vals], [v for _, v in vals], marker=".",
                        label=f"{poison}, {aggregation}",
                        linestyle="-" if aggregation == "trimmed_mean" else "--")
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (honest peer)")
        ax.set_yscale("log")  # the ruined run climbs far above the others
        ax.set_title(f"{args.peers} ddp peers, one misbehaving")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
