"""What the benchmarks share for reading a run's records."""
import json
import os


def read_jsonl(path):
    """Records of a metrics.jsonl; a torn last line (a killed peer) is skipped, not fatal."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def peer_dirs(run_dir):
    """The peer-<i> directories of a swarm's run directory, in peer order."""
    names = [n for n in os.listdir(run_dir) if n.startswith("peer-") and
             os.path.isdir(os.path.join(run_dir, n))]
    return [os.path.join(run_dir, n) for n in sorted(names, key=lambda n: int(n[5:]))]


def steady_tokens_per_s(records, skip_steps, end_step):
    """One peer's tokens/s over the metric windows inside (skip_steps, end_step].

    Each training line carries the tokens/s of its window (the steps since the previous line,
    communication at round boundaries included, evaluation and checkpoints excluded), so the
    window's time is its tokens over that rate. Returns (tokens/s, steps measured), or (None, 0)
    when no window qualifies."""
    prev_step, prev_tokens = 0, 0
    tokens = seconds = 0.0
    steps = 0
    for r in records:
        if "loss" not in r or "tokens_per_s" not in r:
            continue  # an evaluation line
        window = r["tokens"] - prev_tokens
        if prev_step >= skip_steps and r["step"] <= end_step and r["tokens_per_s"] > 0:
            tokens += window
            seconds += window / r["tokens_per_s"]
            steps += r["step"] - prev_step
        prev_step, prev_tokens = r["step"], r["tokens"]
    return (tokens / seconds if seconds > 0 else None), steps
