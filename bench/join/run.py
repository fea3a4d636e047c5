#!/usr/bin/env python3
"""Join benchmark: how long a peer joining a running swarm takes to receive its state over shaped
links, and what that costs the running peers that hold the state already.

    sudo /usr/bin/python3 bench/join/run.py --starling build/starling          # gpt2-tiny, 3 x 3
    sudo /usr/bin/python3 bench/join/run.py --preset gpt2-mini --rate 100mbit --slow 10mbit
    sudo /usr/bin/python3 bench/join/run.py --strategy co2 --set strategy.zero=true  # all take it

Every repetition runs two cases, each in a network lab of its own (scripts/netlab.sh; needs root)
whose links all run at --rate. --peers peers start a swarm (--strategy, default `ddp`; --set
KEY=VALUE passes further settings) on the Brown corpus; once the longest-standing one (the
state's sender) has taken --warm steps, one more peer starts with `--join` and adopts the
swarm's state from it (for `ddp`: weights, AdamW moments and step).

  even   every link at --rate;
  slow   every running peer but the sender on a --slow link from just before the joiner starts
         (netlab.sh rate): the case of a swarm with one good uplink and the rest on slow ones.

Per case, medians over --reps: the transfer's time and rate from the joiner's own log line
("state transfer: adopted ..."), the joiner's time from its start to its first step, and the
bytes the busiest non-sending running peer's link carried while the transfer ran (both
directions, counted on the lab hub's ports every 50 ms) against the state's size. The figure is
the slow case's transfer time over the even case's: the transfer runs over the sender and the
joiner alone, so the peers that hold the state neither receive it nor pass it on, and their
links do not slow it (1.0×). A transfer through every running peer would move the state over
the slow links, taking at least state / --slow: the table prints that bound beside it. The
transfer's rate is also given against the link's (TCP's goodput on a tbf link is at most 0.956
of the rate). `co2` with `zero = true` is the one form in which every running peer takes the
state (a join moves the shards' boundaries): there the slow links do slow the transfer, as they
did every strategy's before. The table counts the running peers that took part.

The peers run with one thread each (--peers + 1 processes on this machine's cores); the
transfer is network-bound at these rates. --out keeps every log (default: a temporary
directory, removed when the run ends).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from corpus import BYTE, ensure_byte_corpus  # noqa: E402  (bench/corpus.py)
from netlab import NETLAB, labs_unavailable, netlab  # noqa: E402  (bench/netlab.py)

ADOPTED = re.compile(r"state transfer: adopted ([0-9.]+ [KMGT]?B) of ([0-9.]+ [KMGT]?B) in "
                     r"(\d+) of (\d+) piece\(s\), ([0-9.]+) s")
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame that tbf counts


def adoption(peer):
    """The joiner's (time, match) of its whole transfer's line, or None: a long transfer also
    logs the same line every 30 s on its way, with fewer pieces than the whole."""
    for t, line in peer.find("state transfer: adopted"):
        m = ADOPTED.search(line)
        if m and m.group(3) == m.group(4):
            return t, m
    return None


def parse_bytes(text):
    number, unit = text.split()
    return float(number) * UNITS[unit]


def rate_bits(rate):
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"a tc rate such as 10mbit or 1gbit, not '{rate}'")
    return int(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]


def write_config(path, args, data):
    with open(path, "w") as f:
        f.write(f"""[model]
preset = "{args.preset}"

[data]
dir = "{data}"

[train]
steps = 1000000           # the harness ends every peer with SIGTERM
batch_size = {args.batch}
threads = 1
log_every = 1
eval_every = 0
checkpoint_every = 0
sample_at_end = false

[strategy]
kind = "{args.strategy}"
local_steps = 4
""")


class Peer:
    """One `starling peer` process in lab slot `slot`: its endpoint, step events and log lines,
    each stamped with this process's monotonic clock."""

    def __init__(self, case, slot, join):
        self.slot = slot
        self.dir = os.path.join(case.work, f"peer-{slot}")
        self.log_path = self.dir + ".log"
        self.t_start = time.monotonic()
        argv = ["ip", "netns", "exec", f"{case.lab}-{slot}", case.args.starling, "peer", "--json",
                "-q", "--insecure", "--config", case.config, "--data-rank", str(slot),
                "--data-world", str(case.args.peers + 1), "--name", f"peer-{slot}",
                "--set", f'train.out_dir="{self.dir}"',
                "--set", f'net.listen="tcp://{case.ip(slot)}:0"',
                "--set", f"net.min_peers={1 if join else case.args.peers}"]
        for setting in case.args.set:
            argv += ["--set", setting]
        if join:
            argv += ["--join", *join]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.endpoint = None
        self.steps = []   # times of step events
        self.lines = []   # (time, line) of the log
        self.log = open(self.log_path, "w")
        threading.Thread(target=self._events, daemon=True).start()
        threading.Thread(target=self._log, daemon=True).start()

    def _events(self):
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "listening":
                self.endpoint = event["endpoint"]
            elif event.get("event") == "step":
                self.steps.append(time.monotonic())

    def _log(self):
        for line in self.proc.stderr:
            now = time.monotonic()
            self.lines.append((now, line.rstrip("\n")))
            self.log.write(f"{now - self.t_start:8.3f} {line}")
            self.log.flush()

    def find(self, text, since=0.0):
        """The log lines holding `text`, logged at `since` or later."""
        return [(t, line) for t, line in list(self.lines) if text in line and t >= since]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class PortCounters:
    """Bytes through every hub port of the lab, sampled every 50 ms by a reader inside the hub
    namespace. Port p<i> receives what peer i uploads and sends what it downloads; the
    monotonic clock is the same inside and outside the namespace."""

    READER = """
import sys, time
while True:
    fields = {}
    for line in open("/proc/net/dev").read().splitlines()[2:]:
        name, rest = line.split(":", 1)
        v = rest.split()
        fields[name.strip()] = (int(v[0]), int(v[8]))
    print(time.monotonic(), " ".join(f"{k}={rx},{tx}" for k, (rx, tx) in fields.items()
                                     if k.startswith("p")), flush=True)
    time.sleep(0.05)
"""

    def __init__(self, lab):
        self.samples = []  # (time, {port: rx + tx})
        self.proc = subprocess.Popen(["ip", "netns", "exec", f"{lab}-hub", "/usr/bin/python3",
                                      "-c", self.READER], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            t, *ports = line.split()
            counts = {}
            for p in ports:
                name, values = p.split("=")
                rx, tx = values.split(",")
                counts[name] = int(rx) + int(tx)
            self.samples.append((float(t), counts))

    def moved(self, port, start, end):
        """Bytes through `port` between the last sample at or before `start` and the first at or
        after `end`: a slight overcount, never an undercount."""
        before = [c for t, c in self.samples if t <= start]
        after = [c for t, c in self.samples if t >= end]
        if not before or not after:
            return None
        return after[0].get(port, 0) - before[-1].get(port, 0)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Case:
    def __init__(self, args, name, rep, work):
        self.args, self.name = args, name
        self.work = os.path.join(work, f"{name}-{rep}")
        os.makedirs(self.work)
        self.config = os.path.join(self.work, "run.toml")
        write_config(self.config, args, args.data)
        self.lab = f"join{os.getpid()}{name[0]}{rep}"
        self.ips = {}

    def ip(self, slot):
        if slot not in self.ips:
            self.ips[slot] = netlab("ip", self.lab, str(slot))
        return self.ips[slot]

    def run(self):
        args = self.args
        netlab_env = dict(os.environ, NETLAB_OWNER_PID=str(os.getpid()))
        subprocess.run([NETLAB, "up", self.lab, str(args.peers + 1), args.rate], check=True,
                       env=netlab_env, stdout=subprocess.DEVNULL)
        peers, counters = [], None
        try:
            counters = PortCounters(self.lab)
            return self._run(peers, counters)
        finally:
            for p in peers:
                p.stop()
            if counters:
                counters.stop()
            subprocess.run([NETLAB, "down", self.lab])

    def _wait(self, what, done, seconds, peers):
        deadline = time.monotonic() + seconds
        while not done():
            ended = [p.slot for p in peers if p.proc.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"peer(s) {ended} exited" if ended else f"not within {seconds} s"
                raise RuntimeError(f"{self.name}: waiting for {what}: {why}; see the logs in "
                                   f"{self.work}")
            time.sleep(0.05)

    def _run(self, peers, counters):
        args = self.args
        sender = Peer(self, 0, None)
        peers.append(sender)
        self._wait("peer 0 listening", lambda: sender.endpoint, 60, peers)
        for slot in range(1, args.peers):
            peers.append(Peer(self, slot, [sender.endpoint]))
        self._wait(f"{args.warm} steps of the swarm", lambda: len(sender.steps) >= args.warm,
                   args.timeout, peers)
        if self.name == "slow":
            for slot in range(1, args.peers):
                netlab("rate", self.lab, str(slot), args.slow)
        joiner = Peer(self, args.peers, [p.endpoint for p in peers])
        peers.append(joiner)
        self._wait("the joiner's adoption", lambda: adoption(joiner), args.timeout, peers)
        self._wait("the joiner's first step", lambda: joiner.steps, args.timeout, peers)
        t_adopted, m = adoption(joiner)
        seconds = float(m.group(5))
        state = parse_bytes(m.group(2))
        start = t_adopted - seconds
        keepers = peers[1:args.peers]
        keeper_bytes = [counters.moved(f"p{p.slot}", start, t_adopted) for p in keepers]
        # The running peers took the sender's state when they formed the swarm: only what they
        # logged after the joiner started counts.
        since = joiner.t_start
        stayed_out = [p.slot for p in keepers
                      if p.find("state transfer: not needed here", since)]
        took = [p.slot for p in keepers if p.find("state transfer: adopted", since) or
                p.find("state transfer: received", since)]
        # Each running peer stays out of the transfer or takes part in it, and says which.
        unclear = [p.slot for p in keepers if (p.slot in stayed_out) == (p.slot in took)]
        # Peer 0, the longest-standing, is the one on a fast link in the slow case.
        if not sender.find("state transfer: sent", since):
            unclear.append(0)
        return {
            "seconds": seconds,
            "state": state,
            "rate": state / seconds if seconds > 0 else 0,
            "first_step": joiner.steps[0] - joiner.t_start,
            "keeper_bytes": max((b for b in keeper_bytes if b is not None), default=None),
            "sender_bytes": counters.moved("p0", start, t_adopted),
            "joiner_bytes": counters.moved(f"p{args.peers}", start, t_adopted),
            "keepers_took": len(took),
            "unclear": unclear,
        }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mb(x):
    return "–" if x is None else f"{x / 1e6:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--preset", default="gpt2-tiny")
    ap.add_argument("--strategy", default="ddp",
                    choices=["ddp", "localsgd", "diloco", "co2", "atom"],
                    help="the swarm's strategy.kind (rounds of 4 steps where it has rounds)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further setting for every peer (repeatable)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--peers", type=int, default=3, help="running peers before the join (>= 2)")
    ap.add_argument("--rate", default="100mbit", help="every link's rate")
    ap.add_argument("--slow", default="10mbit",
                    help="the non-sending running peers' links in the slow case")
    ap.add_argument("--warm", type=int, default=3, help="the sender's steps before the join")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="seconds any wait may take")
    ap.add_argument("--data", default=BYTE, help="a prepared byte-level corpus")
    ap.add_argument("--out", help="keep every log here (default: a temporary directory)")
    args = ap.parse_args()
    if args.peers < 2:
        ap.error("--peers: at least 2, so that one running peer does not send")
    try:
        rate, slow = rate_bits(args.rate), rate_bits(args.slow)
    except argparse.ArgumentTypeError as e:
        ap.error(f"--rate/--slow: {e}")
    if why := labs_unavailable():
        print(f"bench/join needs network labs: {why}", file=sys.stderr)
        return 77
    if args.data == BYTE:
        ensure_byte_corpus(args.starling, os.path.join(HERE, "..", "atom", "config.toml"))
    work = args.out or tempfile.mkdtemp(prefix="starling-join-")
    os.makedirs(work, exist_ok=True)
    results = {"even": [], "slow": []}
    done = False
    try:
        for rep in range(args.reps):
            for name in ("even", "slow"):
                r = Case(args, name, rep, work).run()
                results[name].append(r)
                print(f"rep {rep + 1}/{args.reps} {name}: {r['state'] / 1e6:.1f} MB in "
                      f"{r['seconds']:.2f} s ({r['rate'] / 1e6:.2f} MB/s); busiest other running peer's link "
                      f"{mb(r['keeper_bytes'])} MB; joiner's first step after "
                      f"{r['first_step']:.1f} s", file=sys.stderr, flush=True)
        done = True
    except RuntimeError as e:
        print(f"bench/join: {e}", file=sys.stderr)
        return 1
    finally:
        if done and not args.out:  # a failed run keeps its logs
            shutil.rmtree(work, ignore_errors=True)

    state = median(r["state"] for r in results["even"] + results["slow"])
    settings = "".join(", " + x for x in args.set)
    print(f"\n{args.strategy} swarm of {args.peers} + 1 joiner{settings}, {args.preset} (the "
          f"state sent: {state / 1e6:.1f} MB), links at {args.rate}; slow case: the "
          f"{args.peers - 1} non-sending running peer(s) at {args.slow}. Medians of {args.reps}.\n")
    print("| case | transfer s | MB/s | × link goodput | joiner start → first step s "
          "| running peers that took part | busiest other running peer's link during it MB "
          "| sender's link MB | joiner's link MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("even", "slow"):
        rs = results[name]
        rate_ratio = median(r["rate"] * 8 / (rate * GOODPUT) for r in rs)
        print(f"| {name} | {median(r['seconds'] for r in rs):.2f} | "
              f"{median(r['rate'] for r in rs) / 1e6:.2f} | {rate_ratio:.2f} | "
              f"{median(r['first_step'] for r in rs):.1f} | "
              f"{median(r['keepers_took'] for r in rs):g} of {args.peers - 1} | "
              f"{mb(median(r['keeper_bytes'] for r in rs))} | "
              f"{mb(median(r['sender_bytes'] for r in rs))} | "
              f"{mb(median(r['joiner_bytes'] for r in rs))} |")
    even_s = median(r["seconds"] for r in results["even"])
    slow_s = median(r["seconds"] for r in results["slow"])
    bound = state * 8 / (slow * GOODPUT)
    print(f"\nslow / even transfer time: {slow_s / even_s:.2f}× ({slow_s:.2f} s against "
          f"{even_s:.2f} s); through the slow links the state would take at least {bound:.1f} s "
          f"({bound / even_s:.1f}× the even case).")
    bad = [(name, i) for name, rs in results.items() for i, r in enumerate(rs) if r["unclear"]]
    if bad:
        print(f"WARNING: peer 0 did not send the state, or another running peer logged neither "
              f"staying out of the transfer nor taking the state, in {bad}: see the logs" +
              (f" in {work}" if args.out else " (rerun with --out)"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
