#!/usr/bin/env python3
"""Loss against wall time on a shaped link: each strategy trains 4 peers for the same wall-time
budget on that link, and the validation loss is plotted against the seconds it took.

    sudo /usr/bin/python3 bench/strategies/walltime.py --link 10mbit --seconds 180 \
        --plot docs/img/strategies-loss-time-10mbit.png
    sudo /usr/bin/python3 bench/strategies/walltime.py --rate ddp=1699 --rate co2=18821 ...

The equal-token comparisons (run.py's full part, sweep.py) say what a strategy learns per token;
this says what a user with a slow link and a time budget gets. A strategy's steps are its
tokens/s on the link times the budget, over the swarm's tokens a step, rounded down to whole
rounds (ddp: to its log interval), so that each run's learning-rate schedule ends inside the
budget, as a user who knows the rate would set it. The rate is measured first by a short run on
the same link (run.py's throughput length) unless --rate gives it. The warm-up is the same share
of each run as the config's warm-up is of 400 steps, and each run evaluates about 8 times.

co2 runs as it is recommended for a 10 Mbit link: averages applied 6 steps into the next round,
int8 on the wire, Nesterov's outer step (sweep.py's k6-int8-nesterov); diloco with its published
alpha 0.7 / Nesterov beta 0.9; localsgd plain averaging; ddp every step. Shaped links need root,
iproute2 and sch_tbf (scripts/netlab.sh), as run.py's.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as bench  # noqa: E402  (bench/strategies/run.py)
from sweep import VARIANTS, plot_curves  # noqa: E402  (bench/strategies/sweep.py)

STRATEGY_VARIANT = {"ddp": [], "localsgd": VARIANTS["localsgd"][1],
                    "diloco": VARIANTS["diloco"][1], "co2": VARIANTS["k6-int8-nesterov"][1]}
REFERENCE_STEPS = 400  # the config's warm-up is set for runs of this length


def steps_for(strategy, rate, seconds, tokens_per_step, local_steps, log_every):
    """The steps that fit `seconds` at `rate` swarm tokens/s, in whole rounds (ddp: whole log
    intervals), and never fewer than 3 of them."""
    unit = log_every if strategy == "ddp" else local_steps
    return max(3, int(rate * seconds / tokens_per_step) // unit) * unit


def settings(config, sets):
    """(table, key, default) -> the config's value after the --set overrides."""
    values = {(t, k): v for t, table in config.items() if isinstance(table, dict)
              for k, v in table.items()}
    for kv in sets:
        key, _, value = kv.partition("=")
        table, _, field = key.partition(".")
        values[(table, field)] = value.strip('"')
    return lambda table, key, default: values.get((table, key), default)


def seq_len(setting):
    """Tokens per sequence: model.seq_len if set, else the preset's (python/reference_model.py
    has the same preset table as the trainer)."""
    if setting("model", "seq_len", None) is not None:
        return int(setting("model", "seq_len", None))
    sys.path.insert(0, os.path.join(bench.ROOT, "python"))
    import reference_model as rm
    return rm.preset(setting("model", "preset", "gpt2-tiny")).seq_len


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(bench.ROOT, "build", "starling"))
    ap.add_argument("--link", default="10mbit", choices=list(bench.LINKS),
                    help="the link every peer sits behind (default 10mbit)")
    ap.add_argument("--seconds", type=float, default=180.0,
                    help="the wall-time budget of each strategy's run (default 180)")
    ap.add_argument("--strategies", default=",".join(bench.STRATEGIES))
    ap.add_argument("--rate", action="append", default=[], metavar="STRATEGY=TOKENS_PER_S",
                    help="the swarm's tokens/s of a strategy on the link (skips its probe run)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run")
    ap.add_argument("--json", dest="json_out",
                    default=os.path.join(bench.ROOT, "build", "bench", "walltime.json"))
    ap.add_argument("--runs-dir",
                    default=os.path.join(bench.ROOT, "build", "bench", "walltime-runs"))
    ap.add_argument("--no-run", action="store_true",
                    help="run nothing: print (and --plot) what --json already holds")
    ap.add_argument("--plot", default="", metavar="PNG",
                    help="plot validation loss against wall time (matplotlib)")
    s = ap.parse_args(argv)
    strategies = [x for x in s.strategies.split(",") if x]
    bad = [x for x in strategies if x not in STRATEGY_VARIANT]
    if bad:
        ap.error(f"--strategies: unknown {', '.join(bad)} (known: {', '.join(STRATEGY_VARIANT)})")
    rates = {}
    for kv in s.rate:
        name, _, value = kv.partition("=")
        try:
            rates[name] = float(value)
        except ValueError:
            rates[name] = -1.0
        if name not in STRATEGY_VARIANT or rates[name] <= 0:
            ap.error(f"--rate {kv}: expected STRATEGY=TOKENS_PER_S with a known strategy and a "
                     f"positive rate")
    if s.seconds <= 0:
        ap.error("--seconds must be positive")

    if s.no_run:
        with open(s.json_out) as f:
            report = json.load(f)
    else:
        a = bench.parse_args(["--starling", s.starling, "--parts", "throughput", "--links", s.link,
                              "--runs-dir", s.runs_dir]
                             + [x for kv in s.sets for x in ("--set", kv)])
        a.run_root = s.runs_dir
        a.keep_checkpoints = False
        if bench.LINKS[s.link] and bench.labs_unavailable():
            sys.exit(f"walltime.py: the {s.link} link needs network namespaces: "
                     f"{bench.labs_unavailable()}")
        os.makedirs(a.run_root, exist_ok=True)
        setting = settings(a.config_toml, s.sets)
        tokens_per_step = (bench.PEERS * int(setting("train", "batch_size", 16))
                           * int(setting("train", "grad_accum", 1)) * seq_len(setting))
        warmup = int(setting("optim", "warmup_steps", 0))
        report = {"link": s.link, "seconds": s.seconds, "runs": []}
        for strategy in strategies:
            sets = STRATEGY_VARIANT[strategy]
            if strategy not in rates:
                n = a.ddp_throughput_steps if strategy == "ddp" else a.throughput_steps
                probe = bench.starling_run(a, f"probe-{strategy}", strategy, n, s.link, sets,
                                           a.skip(strategy), "probe")
                if probe.get("error"):
                    sys.exit(f"walltime.py: the probe of {strategy} failed: {probe['error']}")
                rates[strategy] = probe["tokens_per_s"]
            steps = steps_for(strategy, rates[strategy], s.seconds, tokens_per_step,
                              a.local_steps, a.log_every)
            unit = a.log_every if strategy == "ddp" else a.local_steps
            extra = [f"optim.warmup_steps={max(1, round(warmup * steps / REFERENCE_STEPS))}",
                     f"train.eval_every={max(unit, steps // 8 // unit * unit)}"]
            r = bench.starling_run(a, f"walltime-{strategy}", strategy, steps, s.link,
                                   sets + extra, a.skip(strategy), "walltime")
            r["rate_planned"] = rates[strategy]
            report["runs"].append(r)
            os.makedirs(os.path.dirname(os.path.abspath(s.json_out)), exist_ok=True)
            with open(s.json_out, "w") as f:
                json.dump(report, f, indent=1)

    budget = report["seconds"]
    ddp = next((r for r in report["runs"] if r["strategy"] == "ddp" and not r.get("error")), None)
    ddp_loss = ddp["val"][-1]["val_loss"] if ddp and ddp.get("val") else None
    print(f"{report['link']}, a budget of {budget:.0f} s per strategy")
    print("| strategy | steps | wall | swarm tokens | val loss at the end | × ddp |")
    print("|---|---|---|---|---|---|")
    for r in report["runs"]:
        val = r.get("val") or []
        if r.get("error") or not val:
            why = r.get("error") or "no evaluation"
            print(f"| {r['strategy']} | {r['steps']} | – | – | {why} | |")
            continue
        end = val[-1]
        ratio = f"{end['val_loss'] / ddp_loss:.3f}" if ddp_loss else "–"
        print(f"| {r['strategy']} | {r['steps']} | {end['elapsed_s']:.0f} s | "
              f"{end['tokens'] / 1e6:.2f}M | {end['val_loss']:.3f} | {ratio} |")
    if s.plot:
        plot(s.plot, report)
    return 0


def plot(path, report):
    plot_curves(path, [(f"{r['strategy']} ({r['steps']} steps)",
                        [v["elapsed_s"] for v in r.get("val") or []],
                        [v["val_loss"] for v in r.get("val") or []]) for r in report["runs"]],
                f"wall time (s), 4 peers, {report['link']} links",
                f"Validation loss against wall time, a budget of {report['seconds']:.0f} s each")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
