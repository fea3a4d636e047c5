#!/usr/bin/env python3
"""The outside baseline of bench/strategies: PyTorch DDP over Gloo on Starling's model and data.

    # one process per rank; bench/strategies/run.py launches them (on loopback or in a netlab)
    RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29800 \\
        /usr/bin/python3 bench/strategies/torch_ddp.py --config bench/strategies/config.toml \\
        --steps 32 --warmup 16

It trains python/reference_model.py (the test oracle: the same GPT math and the same weight
init as Starling's OP-DAG) with torch.nn.parallel.DistributedDataParallel over
init_process_group("gloo"), on the same data and with the same settings as `starling train
--peers N` with strategy.kind = "ddp" reads from the config: batch_size sequences of seq_len
tokens per rank and step, AdamW (lr, betas, eps, weight decay on matrices and embeddings only),
linear warmup then cosine to min_lr, global-norm gradient clipping, one intra-op thread.

Data: the llm.c-style shards listed in <data.dir>/meta.json (a header of 256 little-endian int32:
magic 20240520, version 1, token count; then uint16 tokens). Windows of seq_len+1 tokens start
every seq_len tokens within a shard; each epoch visits them in a shuffled order and rank r takes
every WORLD_SIZE-th, as Starling's loader does (the shuffle itself is torch's, not Starling's, so
the batches differ while their distribution is the same).

Timing: the first --warmup steps are not timed (allocation, Gloo connection set-up, the first
buckets); every rank times the rest, and the swarm's tokens/s is the sum of the ranks' rates.
Rank 0 prints one JSON line: {"tokens_per_s", "per_rank_tokens_per_s", "step_s", "loss",
"val_loss", ...}; every other rank prints nothing on success. Exit status 1 with a JSON
{"error": ...} line on bad input.
"""

import argparse
import datetime
import json
import math
import os
import sys
import time
import tomllib

# Run from the source tree by a benchmark: keep it free of __pycache__.
sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import reference_model as rm  # noqa: E402

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 256 * 4

# Starling's defaults for the keys the baseline reads (`starling train --list-keys`), used when
# the config leaves a key out.
DEFAULTS = {
    "train": {"batch_size": 8, "seed": 1337, "eval_batches": 20, "grad_accum": 1},
    "optim": {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 100, "schedule": "cosine",
              "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0},
}
MODEL_KEYS = ("arch", "vocab_size", "seq_len", "n_layer", "n_head", "n_kv_head", "d_model",
              "d_ff", "norm_eps", "rope_theta", "tie_embeddings", "init_std")


class BadInput(Exception):
    pass


def parse_value(text):
    """A --set value as TOML reads it (3e-3, 16, true, "x"), else the bare text, like Starling."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def read_config(path, overrides=()):
    """The TOML config with --set overrides applied, as {table: {key: value}}, and the defaults
    above filled in."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise BadInput(f"{path}: {e}")
    for item in overrides:
        key, eq, value = item.partition("=")
        table, dot, field = key.partition(".")
        if not eq or not dot:
            raise BadInput(f"--set {item}: expected TABLE.KEY=VALUE")
        cfg.setdefault(table, {})[field] = parse_value(value)
    for table, keys in DEFAULTS.items():
        cfg[table] = {**keys, **cfg.get(table, {})}
    if cfg["train"]["grad_accum"] != 1:
        raise BadInput(f"{path}: train.grad_accum must be 1 for this baseline")
    return cfg


def model_config(cfg, where):
    """ModelConfig from [model]: the preset first, then any explicit key on top (as Starling)."""
    table = dict(cfg.get("model", {}))
    try:
        mc = rm.preset(table.pop("preset")) if table.get("preset") else rm.ModelConfig()
    except ValueError as e:
        raise BadInput(f"{where}: {e}")
    for key, value in table.items():
        if key not in MODEL_KEYS:
            raise BadInput(f"{where}: model.{key} is not supported by the baseline")
        setattr(mc, key, value)
    try:
        mc.validate()
    except ValueError as e:
        raise BadInput(f"{where}: {e}")
    return mc


def map_shard(path):
    """The tokens of one llm.c shard as a read-only uint16 array, header checked."""
    try:
        header = np.fromfile(path, dtype="<i4", count=256)
        size = os.path.getsize(path)
    except OSError as e:
        raise BadInput(f"token shard {path}: {e}")
    if header.size < 256:
        raise BadInput(f"token shard {path}: shorter than its 1024-byte header")
    if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise BadInput(f"token shard {path}: magic {header[0]} version {header[1]}, expected "
                       f"{SHARD_MAGIC} version {SHARD_VERSION}")
    count = int(header[2])
    if SHARD_HEADER_BYTES + 2 * count != size:
        raise BadInput(f"token shard {path}: header says {count} tokens but the file is "
                       f"{size} bytes")
    return np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_BYTES, shape=(count,))


def shard_paths(data_dir, split):
    meta_path = os.path.join(data_dir, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        return [os.path.join(data_dir, s["file"]) for s in meta[split]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{meta_path}: cannot list the {split} shards ({e})")


class Windows:
    """seq_len+1-token windows starting every seq_len tokens, none crossing a shard boundary,
    numbered across the shards in order (the rule of src/starling/data/loader.cpp)."""

    def __init__(self, paths, seq_len):
        self.seq_len = seq_len
        self.shards = [map_shard(p) for p in paths]
        self.starts = [0]
        for s in self.shards:
            n = (len(s) - 1) // seq_len if len(s) > seq_len else 0
            self.starts.append(self.starts[-1] + n)
        if self.starts[-1] == 0:
            raise BadInput(f"{paths}: no window of {seq_len + 1} tokens")

    def __len__(self):
        return self.starts[-1]

    def get(self, index):
        shard = next(i for i in range(len(self.shards)) if index < self.starts[i + 1])
        at = (index - self.starts[shard]) * self.seq_len
        return np.asarray(self.shards[shard][at:at + self.seq_len + 1], dtype=np.int64)

    def batch(self, indices):
        rows = torch.from_numpy(np.stack([self.get(i) for i in indices]))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class TrainLoader:
    """Each epoch a shuffled order of all windows; this rank takes every world-th one."""

    def __init__(self, windows, batch, seed, rank, world):
        if len(windows) < world:
            raise BadInput(f"{len(windows)} training windows for {world} ranks")
        self.windows, self.batch_size, self.seed = windows, batch, seed
        self.rank, self.world = rank, world
        self.epoch, self.order, self.cursor = -1, [], 0

    def next(self):
        rows = []
        while len(rows) < self.batch_size:
            if self.cursor >= len(self.order):
                self.epoch += 1
                g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
                self.order = torch.randperm(len(self.windows), generator=g)[self.rank::self.world]
                self.cursor = 0
            rows.append(int(self.order[self.cursor]))
            self.cursor += 1
        return self.windows.batch(rows)


def learning_rate(o, step, total_steps):
    """Starling's schedule (src/starling/train/schedule.cpp): linear warmup, then cosine."""
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    if o["schedule"] == "constant":
        return o["lr"]
    decay = max(1, total_steps - 1 - o["warmup_steps"])
    progress = min(max((step - o["warmup_steps"]) / decay, 0.0), 1.0)
    return o["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (o["lr"] - o["min_lr"])


@torch.no_grad()
def evaluate(model, val, batch, batches):
    """Starling's evaluation: the first batches*batch validation windows in file order."""
    model.eval()
    total = 0.0
    for b in range(batches):
        idx = [(b * batch + i) % len(val) for i in range(batch)]
        total += model(*val.batch(idx)).item()
    model.train()
    return total / batches


def resolve_data_dir(path):
    """Relative to the working directory as Starling does, else to the repository root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(ROOT, path)


def train(a, rank, world):
    cfg = read_config(a.config, a.sets)
    mc = model_config(cfg, a.config)
    t, o = cfg["train"], cfg["optim"]
    data_dir = resolve_data_dir(cfg.get("data", {}).get("dir", ""))
    train_windows = Windows(shard_paths(data_dir, "train"), mc.seq_len)
    val_windows = Windows(shard_paths(data_dir, "val"), mc.seq_len)
    loader = TrainLoader(train_windows, t["batch_size"], t["seed"], rank, world)

    # The reference model seeds its init like Starling's builder: same seed, same weights on
    # every rank (DDP would broadcast rank 0's anyway).
    model = rm.ReferenceModel(mc, seed=t["seed"])
    # The causal mask (and rotary tables) are constant buffers, identical on every rank; Gloo
    # cannot broadcast the bool mask, and there is nothing to sync, so DDP leaves them alone.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [name for name, _ in model.named_buffers()])
    ddp = DistributedDataParallel(model, broadcast_buffers=False)
    opt = rm.make_adamw(model, lr=o["lr"], weight_decay=o["weight_decay"],
                        betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    tokens_per_step = t["batch_size"] * mc.seq_len
    t0, loss = None, float("nan")
    for step in range(a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = learning_rate(o, step, a.steps)
        tokens, targets = loader.next()
        opt.zero_grad(set_to_none=True)
        out = ddp(tokens, targets)
        out.backward()  # DDP averages the gradients over the ranks here (Gloo all-reduce)
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        loss = out.item()
        if not math.isfinite(loss):
            raise BadInput(f"training diverged at step {step + 1}: loss {loss}")
    timed_s = time.perf_counter() - t0
    rate = (a.steps - a.warmup) * tokens_per_step / timed_s

    # Every rank's rate and loss, so rank 0 reports the swarm.
    stats = torch.tensor([rate, loss, timed_s], dtype=torch.float64)
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    val_loss = evaluate(model, val_windows, t["batch_size"], t["eval_batches"]) if rank == 0 \
        else None
    return {"tokens_per_s": sum(float(s[0]) for s in gathered),
            "per_rank_tokens_per_s": [float(s[0]) for s in gathered],
            "step_s": max(float(s[2]) for s in gathered) / (a.steps - a.warmup),
            "loss": sum(float(s[1]) for s in gathered) / world,
            "val_loss": val_loss, "steps": a.steps, "warmup": a.warmup, "world": world,
            "tokens_per_step": tokens_per_step * world, "params": mc.num_params(),
            "torch": torch.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(HERE, "config.toml"),
                    help="Starling TOML config to mirror (default: bench/strategies/config.toml)")
    ap.add_argument("--steps", type=int, default=32, help="optimizer steps in total")
    ap.add_argument("--warmup", type=int, default=8, help="first steps left out of the timing")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key as `starling train --set` does (repeatable); "
                         "keys the baseline does not read ([strategy], [net], ...) are ignored")
    ap.add_argument("--timeout-s", type=int, default=600,
                    help="Gloo's timeout for rendezvous and each collective")
    a = ap.parse_args(argv)
    if not 0 <= a.warmup < a.steps:
        ap.error("need 0 <= --warmup < --steps")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        ap.error("set RANK and WORLD_SIZE (and MASTER_ADDR, MASTER_PORT) in the environment")

    # 4 ranks share 2 cores: one intra-op thread each, as Starling's train.threads = 1.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    try:
        result = train(a, rank, world)
    except BadInput as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
