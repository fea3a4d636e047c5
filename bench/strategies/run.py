#!/usr/bin/env python3
"""Strategies benchmark: ddp, localsgd, diloco, co2 (4 peers) on unlimited, 100 and 10 Mbit links.

    /usr/bin/python3 bench/strategies/run.py --starling build/starling   # `make bench-strategies`
    /usr/bin/python3 bench/strategies/run.py --quick                     # smoke test, ~5 min
    /usr/bin/python3 bench/strategies/run.py --parts throughput --links 10mbit --reps 1

Every run is `starling train --config bench/strategies/config.toml --peers 4` (4 local peer
processes; on a shaped link each in its own network namespace behind a tbf link, via
--link-rate). Parts (--parts):

  full        one run per strategy of --steps steps (default 1000) on the unlimited link
              (loopback): validation loss against swarm tokens and against wall time. Every
              strategy sees the same tokens (steps x 16 sequences x 128 tokens x 4 peers), and
              what a strategy computes does not depend on the link, so loss is not re-run on slow
              links.
  throughput  short runs on each link for every strategy: --throughput-steps (96) for the
              round-based ones, --ddp-throughput-steps (32) for ddp, whose every step crosses the
              network (a 96-step ddp run at 10 Mbit alone would take ~9 minutes). tokens/s is the
              swarm's steady rate: the first round (local_steps steps; ddp: log_every steps) is
              skipped, and evaluation time never counts (see steady_tokens_per_s). On the
              unlimited link the full run counts as the first repetition.
  torch       python bench/strategies/torch_ddp.py: PyTorch DistributedDataParallel over Gloo on
              the same model, data and optimizer, 4 ranks, on loopback and in a netlab
              (scripts/netlab.sh) per shaped link, --ddp-throughput-steps steps.
  ablations   on the unlimited link: co2's published form (overlap_steps = 0: each average
              applied one round late), the same without its staleness penalty, and co2 with
              clip = "none" (full length: their loss against co2's), and co2 with zero = true
              against zero = false (throughput length: state bytes per peer and peak RSS).

--reps N repeats the throughput and torch runs (medians are reported). The table gives tokens/s
per strategy and link, each against ddp on the same link, each slow link against the strategy's
own unlimited rate, Starling ddp against torch DDP, and validation loss at equal tokens against
ddp; below it the issue's targets, each `ok` or `MISS`. Everything, with the run directories
(which plot.py reads), goes to --json. Shaped links need root, iproute2 and sch_tbf; without them
only the unlimited link runs. See README.md.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for netlab.py
from netlab import NETLAB, labs_unavailable, netlab  # noqa: E402  (bench/netlab.py)
from records import peer_dirs, read_jsonl, steady_tokens_per_s  # noqa: E402  (bench/records.py)
from corpus import ensure_byte_corpus  # noqa: E402  (bench/corpus.py)
from report import PEERS, check_targets, print_report, summarize  # noqa: E402  (report.py)
TORCH_DDP = os.path.join(HERE, "torch_ddp.py")
PYTHON = "/usr/bin/python3"  # Debian's, which has torch
STRATEGIES = ("ddp", "localsgd", "diloco", "co2")
# name -> tc rate for --link-rate / netlab (None: loopback, no namespaces)
LINKS = {"unlimited": None, "100mbit": "100mbit", "10mbit": "10mbit"}
LINK_BYTES_PER_S = {"unlimited": None, "100mbit": 12.5e6, "10mbit": 1.25e6}
PARTS = ("full", "throughput", "torch", "ablations")

# --quick: the same pipeline, tiny. Rounds of 4 steps so that a 12-step run still has rounds to
# skip and to measure; only ddp and co2 on the shaped link (the pair the targets compare).
QUICK = {"steps": 12, "throughput_steps": 12, "ddp_throughput_steps": 6, "reps": 1,
         "links": "unlimited,10mbit", "slow_strategies": "ddp,co2",
         "sets": ["strategy.local_steps=4", "train.log_every=2", "train.eval_every=4",
                  "train.eval_batches=2"]}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- reading what a run left behind ------------------------------------------------------------


def summarize_run(run_dir, skip_steps, end_step):
    """What the tables and plots need from one swarm run directory."""
    out = {}
    per_peer = [read_jsonl(os.path.join(d, "metrics.jsonl")) for d in peer_dirs(run_dir)
                if os.path.exists(os.path.join(d, "metrics.jsonl"))]
    # The swarm's rate is the sum of its peers' rates (each trains on its own share of data).
    rates = [steady_tokens_per_s(r, skip_steps, end_step) for r in per_peer]
    if rates and all(r is not None for r, _ in rates):
        out["tokens_per_s"] = sum(r for r, _ in rates)
        out["measured_steps"] = min(n for _, n in rates)
    if per_peer:
        # Evaluations run on the shared (averaged) model, the same on every peer: peer 0's.
        out["val"] = [{"step": r["step"], "tokens": r["tokens"] * PEERS,
                       "elapsed_s": r["elapsed_s"], "val_loss": r["val_loss"]}
                      for r in per_peer[0] if "val_loss" in r]
        out["train"] = [{"step": r["step"], "tokens": r["tokens"] * PEERS,
                         "elapsed_s": r["elapsed_s"], "loss": r["loss"]}
                        for r in per_peer[0] if "loss" in r]
        if out["val"]:
            out["final_val_loss"] = out["val"][-1]["val_loss"]
    swarm_path = os.path.join(run_dir, "swarm.json")
    if os.path.exists(swarm_path):
        with open(swarm_path) as f:
            swarm = json.load(f)
        done = swarm.get("done", [])
        out["swarm"] = {k: swarm.get(k) for k in ("tokens", "elapsed_s", "tokens_per_s",
                                                  "failed_peers")}
        if done:
            nets = [d.get("net", {}) for d in done]
            out["state_bytes"] = max(n.get("state_bytes", 0) for n in nets) or None
            out["peak_rss_mb"] = max(d.get("peak_rss_mb", 0) for d in done)
            out["bytes_sent_per_peer"] = statistics.mean(n.get("bytes_sent", 0) for n in nets)
            out["net_wait_s"] = statistics.mean(n.get("net_wait_s", 0) for n in nets)
            out["final_loss"] = statistics.mean(d.get("loss", 0) for d in done)
    return out


# --- running things ----------------------------------------------------------------------------


def timeout_for(strategy, steps, link, local_steps, model_bytes):
    """A generous bound on one run's wall time: 4 peers on 2 cores take ~0.8 s a step here; a
    ring all-reduce moves 1.5x the model over every link, ddp every step, the others once a
    round; the joiners' first state transfer is ~4x the model."""
    rate = LINK_BYTES_PER_S[link]
    comm = 0.0 if rate is None else 1.5 * model_bytes / (0.9 * rate)
    per_step = 2.0 + 2 * (comm if strategy in ("ddp", "torch") else comm / local_steps)
    start = 0.0 if rate is None else 2 * 4 * model_bytes / (0.9 * rate)
    return 180 + start + steps * per_step


def stop_group(p, grace_s=20):
    """Ends a process group this script started: SIGTERM (starling forwards it to its peers,
    which leave and take their namespaces down), then SIGKILL."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        pass


def tail(path, lines=8):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# Settings one strategy needs and the others must not get. Heavy-ball outer momentum overshoots
# on runs this short (measured on this model at 200 steps with the published one-round-late form:
# alpha 1.0/beta 0 gave val loss 2.47, alpha 0.7/beta 0.5 gave 2.55, alpha 0.7/beta 0.9 with norm
# clipping at 1.0 was slower still; at 400 steps with overlap_steps = 4, alpha 0.7/beta 0.9 gave
# 2.337 against 2.258: docs/results.md), so co2 runs plain averaging (its default overlap_steps,
# 4 of 16) with a norm clip that only catches outliers (Nesterov's outer step, outer_nesterov,
# does better: sweep.py's k2-int8-nesterov; the comparisons here keep plain averaging so their
# figures stay comparable). diloco keeps its published
# alpha 0.7 / Nesterov beta 0.9 (the config's defaults).
STRATEGY_SETS = {
    "co2": ["strategy.outer_lr=1.0", "strategy.outer_momentum=0.0", "strategy.clip_threshold=5.0"],
}


def starling_run(a, name, strategy, steps, link, sets, skip_steps, part, rep=0):
    """One `starling train --peers 4` run into <runs>/<name>; returns its record."""
    run_dir = os.path.join(a.run_root, name)
    log_path = run_dir + ".log"
    cmd = [a.starling, "train", "--config", a.config, "--peers", str(PEERS), "-q",
           "--set", f"train.steps={steps}", "--set", f"train.out_dir={run_dir}",
           "--set", f"strategy.kind={strategy}"]
    for s in a.sets + STRATEGY_SETS.get(strategy, []) + sets:
        cmd += ["--set", s]
    if LINKS[link]:
        cmd += ["--link-rate", LINKS[link]]
    limit = getattr(a, "limit_s", None) or timeout_for(strategy, steps, link, a.local_steps,
                                                       a.model_bytes)
    # The last round is left out as well as the first: co2 drains its final all-reduce there
    # (waits for it instead of overlapping it), which a short run would otherwise charge to its
    # steady rate. Every other round boundary stays in, so each measured round carries exactly
    # one boundary's communication, for every strategy.
    end_step = steps if strategy == "ddp" else steps - a.local_steps
    record = {"name": name, "part": part, "strategy": strategy, "link": link, "rep": rep,
              "steps": steps, "skip_steps": skip_steps, "end_step": end_step, "sets": sets,
              "dir": run_dir, "log": log_path, "command": cmd}
    log(f"{name}: {strategy}, {steps} steps, {link}{' ' + ' '.join(sets) if sets else ''} ...")
    t0 = time.monotonic()
    with open(log_path, "w") as out:
        # A session of its own, so a timeout or Ctrl-C ends starling and its peers together.
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                             start_new_session=True)
        try:
            p.wait(timeout=limit)
            error = None if p.returncode == 0 else f"exit status {p.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {limit:.0f} s"
        finally:
            stop_group(p)
    record["seconds"] = time.monotonic() - t0
    if os.path.isdir(run_dir):
        record.update(summarize_run(run_dir, skip_steps, end_step))
        if not a.keep_checkpoints:  # ~90 MB a run: the metrics are what the benchmark keeps
            for d in peer_dirs(run_dir):
                shutil.rmtree(os.path.join(d, "checkpoints"), ignore_errors=True)
    if error is None and record.get("tokens_per_s") is None:
        error = "no metric window after the skipped steps (too few steps?)"
    record["error"] = error
    if error:
        log(f"  FAILED {name}: {error}\n{tail(log_path)}")
    else:
        log(f"  {record['seconds']:.0f} s: {record['tokens_per_s']:.0f} tokens/s"
            + (f", val loss {record['final_val_loss']:.4f}" if "final_val_loss" in record else ""))
    return record


def torch_run(a, name, link, steps, warmup, port, rep=0):
    """4 torch_ddp.py ranks on loopback or in a fresh netlab for `link`; returns rank 0's result."""
    lab = f"sb{os.getpid()}-{link}" if LINKS[link] else None
    logs = [os.path.join(a.run_root, f"{name}-rank{r}.log") for r in range(PEERS)]
    record = {"name": name, "part": "torch", "strategy": "torch_ddp", "link": link, "rep": rep,
              "steps": steps, "skip_steps": warmup, "logs": logs}
    limit = timeout_for("torch", steps, link, a.local_steps, a.model_bytes)
    log(f"{name}: torch DDP (gloo), {steps} steps, {link} ...")
    procs, t0 = [], time.monotonic()
    try:
        if lab:
            netlab("up", lab, str(PEERS), LINKS[link])
        ips = [netlab("ip", lab, str(r)) for r in range(PEERS)] if lab else ["127.0.0.1"] * PEERS
        for r in range(PEERS):
            cmd = [PYTHON, TORCH_DDP, "--config", a.config, "--steps", str(steps),
                   "--warmup", str(warmup), "--timeout-s", str(int(limit))]
            for s in a.sets:  # the baseline mirrors whatever the Starling runs were given
                cmd += ["--set", s]
            if lab:
                cmd = ["ip", "netns", "exec", netlab("ns", lab, str(r))] + cmd
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(PEERS), MASTER_ADDR=ips[0],
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       # Gloo picks its interface from the hostname otherwise, which resolves
                       # to nothing reachable inside a lab namespace.
                       GLOO_SOCKET_IFNAME="eth0" if lab else "lo")
            with open(logs[r], "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                              env=env, cwd=ROOT, start_new_session=True))
        error = wait_ranks(procs, limit)
        out = procs[0].stdout.read()
        line = next((x for x in reversed(out.strip().splitlines()) if x.startswith("{")), None)
        result = json.loads(line) if line else {}
        error = error or result.get("error") or (None if line else "rank 0 printed no result")
        record.update({k: v for k, v in result.items() if k != "error"})
    except (RuntimeError, json.JSONDecodeError) as e:
        error = str(e)
    finally:
        for p in procs:
            stop_group(p, grace_s=5)
        if lab:
            netlab("down", lab, check=False)
    record["seconds"] = time.monotonic() - t0
    record["error"] = error
    if error:
        log(f"  FAILED {name}: {error}\n" + "".join(f"--- {os.path.basename(p)}\n{tail(p)}"
                                                   for p in logs))
    else:
        log(f"  {record['seconds']:.0f} s: {record['tokens_per_s']:.0f} tokens/s")
    return record


def wait_ranks(procs, limit):
    """Waits for every rank; a failed rank leaves the others blocked in a collective, so they
    get 10 s more before they are ended. Returns the first failure or None."""
    deadline = time.monotonic() + limit
    failure = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > deadline:
            return failure or f"timed out after {limit:.0f} s"
        bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
        if bad and failure is None:
            failure = f"rank {bad[0]} exited with status {procs[bad[0]].returncode}"
            deadline = min(deadline, now + 10)
        time.sleep(0.2)
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    return failure or (f"rank {bad[0]} exited with status {procs[bad[0]].returncode}"
                       if bad else None)


# --- the plan ----------------------------------------------------------------------------------


def plan(a):
    """The runs in order, as (kind, kwargs) pairs: the long ones first, then the repetitions,
    each repetition going through every link so that drift in the machine's speed spreads over
    all configurations instead of landing on one."""
    runs = []
    if "full" in a.parts and "unlimited" in a.links:
        for s in a.strategies:
            runs.append(("starling", dict(name=f"full-{s}", strategy=s, steps=a.steps,
                                           link="unlimited", sets=[], skip_steps=a.skip(s),
                                           part="full")))
    if "ablations" in a.parts and "co2" in a.strategies:
        for tag, sets in (("published", ["strategy.overlap_steps=0"]),
                          ("published-staleness0", ["strategy.overlap_steps=0",
                                                    "strategy.staleness_penalty=0"]),
                          ("clipnone", ["strategy.clip=none"])):
            runs.append(("starling", dict(name=f"ablation-co2-{tag}", strategy="co2",
                                           steps=a.steps, link="unlimited", sets=sets,
                                           skip_steps=a.skip("co2"), part="ablation")))
        for zero in ("false", "true"):
            runs.append(("starling", dict(name=f"ablation-co2-zero{zero}", strategy="co2",
                                           steps=a.throughput_steps, link="unlimited",
                                           sets=[f"strategy.zero={zero}"],
                                           skip_steps=a.skip("co2"), part="ablation")))
    for rep in range(a.reps):
        for link in a.links:
            if "throughput" in a.parts:
                for s in a.strategies:
                    if link != "unlimited" and s not in a.slow_strategies:
                        continue
                    # The unlimited link's first repetition is the full run.
                    if link == "unlimited" and rep == 0 and "full" in a.parts:
                        continue
                    n = a.ddp_throughput_steps if s == "ddp" else a.throughput_steps
                    runs.append(("starling", dict(name=f"tp-{link}-{s}-r{rep}", strategy=s,
                                                   steps=n, link=link, sets=[],
                                                   skip_steps=a.skip(s), part="throughput",
                                                   rep=rep)))
            if "torch" in a.parts:
                runs.append(("torch", dict(name=f"torch-{link}-r{rep}", link=link,
                                            steps=a.ddp_throughput_steps,
                                            warmup=a.skip("ddp"), rep=rep)))
    return runs


# --- the report --------------------------------------------------------------------------------


def model_bytes(config):
    """fp32 bytes of the model, for the timeouts (a guess of 4 MB if torch is not importable)."""
    try:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import reference_model as rm
        preset = config.get("model", {}).get("preset")
        return 4 * rm.preset(preset).num_params() if preset else 4e6
    except Exception:  # noqa: BLE001 - only a timeout depends on it
        return 4e6


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"),
                    help="the starling binary (default: build/starling)")
    ap.add_argument("--config", default=os.path.join(HERE, "config.toml"),
                    help="the experiment (default: bench/strategies/config.toml)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny smoke run of the whole pipeline (rounds of 4 steps, unlimited and "
                         "10mbit only, 1 repetition): ~5 minutes")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--links", default=None, help="comma-separated subset of "
                    f"{','.join(LINKS)} (default: all; quick: unlimited,10mbit)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    ap.add_argument("--slow-strategies", default=None,
                    help="strategies run on the shaped links (default: all; quick: ddp,co2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps of the full runs and loss ablations (default 1000; quick 12)")
    ap.add_argument("--throughput-steps", type=int, default=None,
                    help="steps of a throughput run of localsgd/diloco/co2 (default 96; quick 12)")
    ap.add_argument("--ddp-throughput-steps", type=int, default=None,
                    help="steps of a ddp or torch DDP throughput run (default 32; quick 6)")
    ap.add_argument("--reps", type=int, default=None,
                    help="repetitions of throughput and torch runs (default 3; quick 1)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every Starling run (repeatable)")
    ap.add_argument("--runs-dir", default=os.path.join(ROOT, "build", "bench", "strategies-runs"),
                    help="where run directories go, one subdirectory per invocation")
    ap.add_argument("--keep-checkpoints", action="store_true",
                    help="keep each run's checkpoints (~90 MB a run); by default only metrics")
    ap.add_argument("--json", dest="json_out",
                    default=os.path.join(ROOT, "build", "bench", "strategies-results.json"),
                    help="results file (default: build/bench/strategies-results.json)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    ap.add_argument("--from-json", default="", metavar="PATH",
                    help="run nothing: print the table and targets of an earlier results file "
                         "(its own settings) again")
    ap.add_argument("--base-port", type=int, default=29800, help="torch DDP rendezvous ports")
    a = ap.parse_args(argv)

    q = QUICK if a.quick else {}
    a.steps = a.steps or q.get("steps", 1000)
    a.throughput_steps = a.throughput_steps or q.get("throughput_steps", 96)
    a.ddp_throughput_steps = a.ddp_throughput_steps or q.get("ddp_throughput_steps", 32)
    a.reps = a.reps or q.get("reps", 3)
    a.links = (a.links or q.get("links", ",".join(LINKS))).split(",")
    a.strategies = a.strategies.split(",")
    a.slow_strategies = (a.slow_strategies or q.get("slow_strategies", ",".join(STRATEGIES))
                         ).split(",")
    a.parts = a.parts.split(",")
    a.sets = q.get("sets", []) + a.sets
    for name, values, known in (("--links", a.links, LINKS), ("--strategies", a.strategies,
                                STRATEGIES), ("--slow-strategies", a.slow_strategies, STRATEGIES),
                                ("--parts", a.parts, PARTS)):
        bad = [v for v in values if v not in known]
        if bad:
            ap.error(f"{name}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    if not os.access(a.starling, os.X_OK):
        ap.error(f"no starling binary at {a.starling}: build it (make build) or pass --starling")
    a.starling = os.path.abspath(a.starling)
    a.config = os.path.abspath(a.config)
    try:
        with open(a.config, "rb") as f:
            a.config_toml = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        ap.error(f"{a.config}: {e}")
    # Round length and log interval, after the overrides: they decide what is skipped.
    settings = {t: dict(v) for t, v in a.config_toml.items() if isinstance(v, dict)}
    for s in a.sets:
        key, _, value = s.partition("=")
        table, _, field = key.partition(".")
        settings.setdefault(table, {})[field] = value
    a.local_steps = int(settings.get("strategy", {}).get("local_steps", 16))
    a.log_every = int(settings.get("train", {}).get("log_every", 10))
    # Warm-up left out of tokens/s: the first round (state transfer, first all-reduce, the
    # caching allocator filling up); ddp communicates every step, so its first metric window.
    a.skip = lambda s: a.log_every if s == "ddp" else a.local_steps
    # The first and the last round are not timed (see starling_run), so 3 rounds at least.
    if min(a.steps, a.throughput_steps) < 3 * a.local_steps:
        ap.error(f"--steps and --throughput-steps must be at least 3 rounds "
                 f"({3 * a.local_steps} steps): the first and last round are not timed")
    if a.ddp_throughput_steps <= a.log_every:
        ap.error(f"--ddp-throughput-steps must exceed the {a.log_every} steps it leaves untimed")
    a.model_bytes = model_bytes(a.config_toml)
    return a


def write_json(a, runs, summary, targets, started):
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
              "seconds": time.monotonic() - started,
              "settings": {k: v for k, v in vars(a).items()
                           if k not in ("skip", "config_toml")},
              "config_toml": a.config_toml, "run_root": a.run_root,
              "summary": summary, "targets": targets,
              "failures": [f"{r['name']}: {r['error']}" for r in runs if r.get("error")],
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
    tmp = a.json_out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(tmp, a.json_out)


def reprint(path):
    """--from-json: the report of an earlier run, recomputed from its run records."""
    with open(path) as f:
        report = json.load(f)
    a = argparse.Namespace(**report["settings"])
    summary = summarize(a, report["runs"])
    print_report(a, summary, check_targets(summary))
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.from_json:
        return reprint(a.from_json)
    if any(LINKS[link] for link in a.links):
        why = labs_unavailable()
        if why:
            log(f"run.py: shaped links skipped: {why}")
            a.links = [link for link in a.links if not LINKS[link]]
    if a.dry_run:
        for kind, kw in plan(a):
            print(f"{kw['name']:<28}{kind:<9}{kw['link']:<10}{kw['steps']:>5} steps "
                  f"{' '.join(kw.get('sets', []))}")
        return 0
    ensure_byte_corpus(a.starling, a.config)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    a.run_root = os.path.join(os.path.abspath(a.runs_dir), stamp + ("-quick" if a.quick else ""))
    os.makedirs(a.run_root, exist_ok=True)
    log(f"run.py: run directories under {a.run_root}")

    started = time.monotonic()
    runs = []
    port = a.base_port
    todo = plan(a)
    for i, (kind, kw) in enumerate(todo):
        log(f"[{i + 1}/{len(todo)}, {time.monotonic() - started:.0f} s]")
        if kind == "starling":
            runs.append(starling_run(a, **kw))
        else:
            port += 1
            runs.append(torch_run(a, port=port, **kw))
        # After every run, so an interrupted benchmark still leaves what it measured.
        summary = summarize(a, runs)
        write_json(a, runs, summary, check_targets(summary), started)

    summary = summarize(a, runs)
    targets = check_targets(summary)
    write_json(a, runs, summary, targets, started)
    print_report(a, summary, targets)
    failures = [r for r in runs if r.get("error")]
    for r in failures:
        print(f"FAILED: {r['name']}: {r['error']} (log: {r.get('log') or r.get('logs')})")
    print(f"total {time.monotonic() - started:.0f} s; wrote {a.json_out} "
          f"(plots: {PYTHON} bench/strategies/plot.py --json {a.json_out})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
