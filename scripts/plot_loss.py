#!/usr/bin/env python3
"""Training and validation loss of a run, as a PNG.

    /usr/bin/python3 scripts/plot_loss.py runs/demo runs/demo/loss.png
    /usr/bin/python3 scripts/plot_loss.py runs/swarm /tmp/swarm-loss.png   # a --peers N run

RUN_DIR is a `starling train` run directory: either a single run (RUN_DIR/metrics.jsonl) or a
swarm (RUN_DIR/peer-<i>/metrics.jsonl, from `starling train --peers N`). Training loss is drawn
per peer as a thin line, validation loss (the shared model, so peer 0's) as a thicker line with
markers, both against the optimizer step. Prints the path it wrote. Without matplotlib it prints
one line saying how to get it and exits 0, so a demo never fails on a missing plot.
"""

import argparse
import glob
import json
import os
import sys


def read_metrics(path):
    """(train points, val points) of one metrics.jsonl as [(step, loss)]; a torn last line
    (an interrupted run) is skipped."""
    train, val = [], []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "val_loss" in r:
                val.append((r["step"], r["val_loss"]))
            elif "loss" in r:
                train.append((r["step"], r["loss"]))
    return train, val


def metrics_files(run_dir):
    """[(label, path)]: the run's own metrics.jsonl, or one per peer of a swarm."""
    single = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(single):
        return [("train", single)]
    peers = glob.glob(os.path.join(run_dir, "peer-*", "metrics.jsonl"))
    peers.sort(key=lambda p: int(os.path.basename(os.path.dirname(p))[5:]))
    return [(os.path.basename(os.path.dirname(p)), p) for p in peers]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="run directory (metrics.jsonl or peer-*/metrics.jsonl)")
    ap.add_argument("out", help="PNG to write")
    a = ap.parse_args(argv)

    files = metrics_files(a.run_dir)
    if not files:
        print(f"plot_loss.py: no metrics.jsonl in {a.run_dir} or its peer-* directories",
              file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_loss.py: matplotlib is not installed (apt-get install python3-matplotlib); "
              "no plot written")
        return 0

    fig, ax = plt.subplots(figsize=(7, 4.5))
    swarm = len(files) > 1 or files[0][0] != "train"
    val = []
    for label, path in files:
        train, v = read_metrics(path)
        val = val or v  # the shared model is evaluated alike everywhere: the first peer's
        if train:
            ax.plot([p[0] for p in train], [p[1] for p in train], linewidth=0.7, alpha=0.6,
                    label=f"train loss, {label}" if swarm else "train loss")
    if val:
        ax.plot([p[0] for p in val], [p[1] for p in val], color="black", linewidth=1.8,
                marker="o", markersize=4, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(os.path.basename(os.path.normpath(a.run_dir)) +
                 (f" ({len(files)} peers)" if swarm else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fig.savefig(a.out, dpi=120)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
