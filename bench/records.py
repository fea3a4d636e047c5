"""What the benchmarks share for reading a run's records."""
import json


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
