#!/usr/bin/env python3
"""Figures of the strategies benchmark, from run.py's results JSON and the run directories it names.

    /usr/bin/python3 bench/strategies/plot.py                      # after `make bench-strategies`
    /usr/bin/python3 bench/strategies/plot.py --json out.json --out-dir /tmp/img

Writes three PNGs (matplotlib, Agg backend: no display needed):

  strategies-loss-tokens.png   validation loss against swarm tokens, one line per strategy (the
                               full runs on the unlimited link)
  strategies-loss-time.png     the same losses against wall time on the unlimited link
  strategies-throughput.png    swarm tokens/s per strategy and link, grouped by link, with torch
                               DDP (Gloo); bars are medians, whiskers span min..max over the
                               repetitions

Curves come from each run's <dir>/peer-0/metrics.jsonl; where a directory is gone (another
machine, cleaned up) the copy of the curve inside the JSON is used. Without matplotlib it prints
one line saying so and exits 0, so `make bench-strategies` still ends with the table.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
STRATEGIES = ("ddp", "localsgd", "diloco", "co2")
# Fixed colors per strategy, the same in every figure.
COLORS = {"ddp": "#1f77b4", "localsgd": "#2ca02c", "diloco": "#9467bd", "co2": "#d62728",
          "torch_ddp": "#7f7f7f"}
LABELS = {"torch_ddp": "torch DDP (gloo)"}
LINK_ORDER = ("unlimited", "100mbit", "10mbit")


def val_curve(run):
    """[(swarm tokens, wall seconds, val loss)] of a full run: from its metrics if on disk."""
    path = os.path.join(run.get("dir", ""), "peer-0", "metrics.jsonl")
    points = []
    if os.path.exists(path):
        peers = run.get("peers", 4)
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line
                if "val_loss" in r:
                    points.append((r["tokens"] * peers, r["elapsed_s"], r["val_loss"]))
    else:
        points = [(v["tokens"], v["elapsed_s"], v["val_loss"]) for v in run.get("val", [])]
    return points


def full_runs(report):
    runs = [r for r in report.get("runs", []) if r.get("part") == "full" and not r.get("error")]
    return sorted(runs, key=lambda r: STRATEGIES.index(r["strategy"])
                  if r["strategy"] in STRATEGIES else 99)


def subtitle(report):
    cfg = report.get("config_toml", {})
    preset = cfg.get("model", {}).get("preset", "?")
    tau = report.get("settings", {}).get("local_steps", "?")
    return f"{preset}, 4 peers, batch {cfg.get('train', {}).get('batch_size', '?')}/peer, tau {tau}"


def plot_loss(plt, report, x_index, xlabel, title, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in full_runs(report):
        pts = val_curve(run)
        if not pts:
            continue
        s = run["strategy"]
        ax.plot([p[x_index] for p in pts], [p[2] for p in pts], marker="o", markersize=3,
                color=COLORS.get(s), label=LABELS.get(s, s))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"{title}\n{subtitle(report)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def plot_throughput(plt, report, path):
    tput = report.get("summary", {}).get("throughput", {})
    series = [s for s in (*STRATEGIES, "torch_ddp") if s in tput]
    links = [link for link in LINK_ORDER if any(link in tput[s] for s in series)]
    if not series or not links:
        print(f"no throughput results in the JSON; {path} not written")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(series)
    for i, s in enumerate(series):
        xs, meds, lo, hi = [], [], [], []
        for j, link in enumerate(links):
            v = tput[s].get(link)
            if v is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            meds.append(v["median"])
            lo.append(v["median"] - v["min"])
            hi.append(v["max"] - v["median"])
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=2, color=COLORS.get(s),
               label=LABELS.get(s, s))
        for x, m in zip(xs, meds):
            ax.text(x, m, f"{m / 1e3:.1f}k", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(links)))
    ax.set_xticklabels(links)
    ax.set_xlabel("link per peer")
    ax.set_ylabel("swarm tokens/s (steady state)")
    reps = report.get("settings", {}).get("reps", "?")
    ax.set_title(f"Training throughput by link, median of {reps}\n{subtitle(report)}",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", dest="json_in",
                    default=os.path.join(ROOT, "build", "bench", "strategies-results.json"),
                    help="run.py's results (default: build/bench/strategies-results.json)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "img"),
                    help="where the PNGs go (default: docs/img)")
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (apt-get install python3-matplotlib, or "
              "scripts/install-deps.sh); no figures written")
        return 0
    try:
        with open(a.json_in) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"plot.py: cannot read {a.json_in}: {e}", file=sys.stderr)
        return 1
    os.makedirs(a.out_dir, exist_ok=True)
    if full_runs(report):
        plot_loss(plt, report, 0, "swarm tokens", "Validation loss at equal tokens",
                  os.path.join(a.out_dir, "strategies-loss-tokens.png"))
        plot_loss(plt, report, 1, "wall time (s), unlimited link",
                  "Validation loss against wall time",
                  os.path.join(a.out_dir, "strategies-loss-time.png"))
    else:
        print("no full runs in the JSON; loss figures not written")
    plot_throughput(plt, report, os.path.join(a.out_dir, "strategies-throughput.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
