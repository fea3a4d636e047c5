#!/usr/bin/env python3
"""co2 sweep: validation loss at equal tokens for co2's variants and settings, against localsgd
and diloco, on the strategies benchmark's setup (4 peers, gpt2-tiny, unlimited link).

    /usr/bin/python3 bench/strategies/sweep.py --steps 400                 # every variant
    /usr/bin/python3 bench/strategies/sweep.py --only published,k4,diloco --steps 2000
    /usr/bin/python3 bench/strategies/sweep.py --only published,k4,diloco \
        --set model.preset=llama-tiny --set model.vocab_size=1024 --set data.dir=data/brown/sp1k \
        --json build/bench/co2-sweep-llama.json --runs-dir build/bench/co2-sweep-llama
      # (data/brown/sp1k: starling data prepare data/brown/text --out data/brown/sp1k
      #  --tokenizer sentencepiece --vocab-size 1024)

Each variant is a name and a list of `--set` overrides on top of bench/strategies/config.toml
(and, for co2, run.py's co2 settings). The loss at equal tokens does not depend on the machine's
load (every round waits for its average), so a sweep can run beside other work; its wall times
can not be compared then. Results go to --json, one record per run, and a table to stdout.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as bench  # noqa: E402  (bench/strategies/run.py)

# name -> (strategy, overrides), on top of run.py's co2 settings (alpha 1, beta 0, clip norm 5).
PUBLISHED = "strategy.overlap_steps=0"  # co2's published form: applied one round late
VARIANTS = {
    "localsgd": ("localsgd", []),
    "diloco": ("diloco", []),
    "published": ("co2", [PUBLISHED]),
    "published-penalty0": ("co2", [PUBLISHED, "strategy.staleness_penalty=0"]),
    "published-alpha0.5": ("co2", [PUBLISHED, "strategy.outer_lr=0.5",
                                   "strategy.staleness_penalty=0"]),
    "published-alpha0.5-penalty1": ("co2", [PUBLISHED, "strategy.outer_lr=0.5"]),
    "published-beta0.5": ("co2", [PUBLISHED, "strategy.outer_momentum=0.5",
                                  "strategy.outer_lr=0.5"]),
    "published-tau32": ("co2", [PUBLISHED, "strategy.local_steps=32"]),
    "published-lr1.5e-3": ("co2", [PUBLISHED, "optim.lr=1.5e-3", "optim.min_lr=1.5e-4"]),
    # co2's default: applied as many steps into the next round as the exchanges take (adaptive;
    # the steps depend on the machine's speed and load, so this one is not an exact repeat).
    "adaptive": ("co2", ["strategy.overlap_steps=-1"]),
    # Applied K steps into the next round (no staleness, so no penalty).
    "k2": ("co2", ["strategy.overlap_steps=2"]),
    "k4": ("co2", ["strategy.overlap_steps=4"]),
    "k8": ("co2", ["strategy.overlap_steps=8"]),
    "k12": ("co2", ["strategy.overlap_steps=12"]),
    "k4-momentum": ("co2", ["strategy.overlap_steps=4", "strategy.outer_lr=0.7",
                            "strategy.outer_momentum=0.9"]),
    # Smaller exchanges (the sums stay fp32), so that 2 steps hide them on a slow link.
    "k2-int8": ("co2", ["strategy.overlap_steps=2", "strategy.precision=int8"]),
    "k2-bf16": ("co2", ["strategy.overlap_steps=2", "strategy.precision=bf16"]),
    "k4-int8": ("co2", ["strategy.overlap_steps=4", "strategy.precision=int8"]),
    # diloco's outer step (Nesterov, alpha 0.7, beta 0.9) on co2's average applied 2 steps in.
    "k2-int8-nesterov": ("co2", ["strategy.overlap_steps=2", "strategy.precision=int8",
                                 "strategy.outer_nesterov=true", "strategy.outer_lr=0.7",
                                 "strategy.outer_momentum=0.9"]),
    # Applied 6 steps in: where the adaptive default lands with int8 on a 10 Mbit link.
    "k6-int8-nesterov": ("co2", ["strategy.overlap_steps=6", "strategy.precision=int8",
                                 "strategy.outer_nesterov=true", "strategy.outer_lr=0.7",
                                 "strategy.outer_momentum=0.9"]),
    "k2-int8-nesterov-noclip": ("co2", ["strategy.overlap_steps=2", "strategy.precision=int8",
                                        "strategy.outer_nesterov=true", "strategy.outer_lr=0.7",
                                        "strategy.outer_momentum=0.9", "strategy.clip=none"]),
}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starling", default=os.path.join(bench.ROOT, "build", "starling"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:STRATEGY:K=V,...",
                    help="an extra variant, e.g. k6:co2:strategy.overlap_steps=6")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run, e.g. model.preset=llama-tiny")
    ap.add_argument("--json", dest="json_out",
                    default=os.path.join(bench.ROOT, "build", "bench", "co2-sweep.json"))
    ap.add_argument("--runs-dir", default=os.path.join(bench.ROOT, "build", "bench", "co2-sweep"))
    ap.add_argument("--limit-s", type=float, default=0,
                    help="a run's wall-time limit in seconds (default: run.py's bound, ~2 s a "
                         "step; raise it when the machine is shared)")
    ap.add_argument("--no-run", action="store_true",
                    help="run nothing: print (and --plot) the records --json already holds")
    ap.add_argument("--plot", default="", metavar="PNG",
                    help="plot validation loss against swarm tokens for the --only variants at "
                         "--steps (matplotlib)")
    s = ap.parse_args(argv)
    variants = dict(VARIANTS)
    for v in s.variant:
        name, strategy, sets = (v.split(":", 2) + [""])[:3]
        variants[name] = (strategy, [x for x in sets.split(",") if x])
    names = [n for n in s.only.split(",") if n] or list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        ap.error(f"unknown variants {', '.join(unknown)} (known: {', '.join(variants)})")

    a = bench.parse_args(["--starling", s.starling, "--steps", str(s.steps), "--parts", "full",
                          "--links", "unlimited", "--runs-dir", s.runs_dir]
                         + [x for kv in s.sets for x in ("--set", kv)])
    a.run_root = s.runs_dir
    a.keep_checkpoints = False
    a.limit_s = s.limit_s
    os.makedirs(a.run_root, exist_ok=True)
    records = []
    if os.path.exists(s.json_out):
        with open(s.json_out) as f:
            records = [r for r in json.load(f) if s.no_run or r.get("variant") not in names
                       or r.get("steps") != s.steps]
    for name in [] if s.no_run else names:
        strategy, sets = variants[name]
        # A tau other than the config's changes which steps the rate skips; the loss does not
        # depend on it.
        r = bench.starling_run(a, f"{name}-{s.steps}", strategy, s.steps, "unlimited", sets,
                               a.skip(strategy), "sweep")
        r["variant"] = name
        records.append(r)
        os.makedirs(os.path.dirname(s.json_out), exist_ok=True)
        with open(s.json_out, "w") as f:
            json.dump(records, f, indent=1)

    print(f"| variant | strategy | overrides | steps | val loss |")
    print("|---|---|---|---|---|")
    for r in records:
        loss = r.get("final_val_loss")
        print(f"| {r['variant']} | {r['strategy']} | {' '.join(r['sets']) or '-'} | {r['steps']} "
              f"| {'%.4f' % loss if loss is not None else r.get('error')} |")
    if s.plot:
        plot(s.plot, [next(r for r in reversed(records)
                           if r.get("variant") == n and r.get("steps") == s.steps)
                      for n in names if any(r.get("variant") == n and r.get("steps") == s.steps
                                            for r in records)], s.steps)
    return 0


def plot(path, records, steps):
    plot_curves(path, [(f"{'co2 ' if r['strategy'] == 'co2' else ''}{r['variant']} "
                        f"({r['final_val_loss']:.3f})",
                        [v["tokens"] / 1e6 for v in r.get("val") or []],
                        [v["val_loss"] for v in r.get("val") or []]) for r in records],
                "swarm tokens (millions)",
                f"4 peers, {steps} steps each: validation loss at equal tokens")


def plot_curves(path, curves, xlabel, title):
    """Validation loss curves, each (label, xs, losses), into one PNG (matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, xs, losses in curves:
        if xs:
            ax.plot(xs, losses, marker=".", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
