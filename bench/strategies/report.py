"""The strategies benchmark's report: per-strategy and per-link summaries of the runs, the
issue's targets (each ok or MISS) and the printed table. run.py measures; this file only reads
what it measured (also from a saved --json, through run.py --from-json)."""

import statistics

PEERS = 4

# The issue's targets.
CO2_SLOW_OVER_OWN = 0.9      # co2 tokens/s at 10 Mbit >= 0.9x its own unlimited tokens/s
CO2_LOSS_TOLERANCE = 0.03    # co2 val loss at equal tokens within 3% of ddp's
CO2_OVER_DDP_SLOW = 5.0      # co2 >= 5x ddp tokens/s at 10 Mbit

def ratio(x, y):
    return x / y if x is not None and y else None


def summarize(a, runs):
    """Medians, ratios and the loss comparison, from the run records."""
    ok = [r for r in runs if not r.get("error")]
    tput = {}
    for s in list(a.strategies) + ["torch_ddp"]:
        for link in a.links:
            samples = [r["tokens_per_s"] for r in ok if r["strategy"] == s and r["link"] == link
                       and r["part"] in ("full", "throughput", "torch")]
            if samples:
                tput.setdefault(s, {})[link] = {"median": statistics.median(samples),
                                                "min": min(samples), "max": max(samples),
                                                "samples": samples}
    med = {s: {link: v["median"] for link, v in by.items()} for s, by in tput.items()}
    vs_ddp = {s: {link: ratio(v, med.get("ddp", {}).get(link)) for link, v in by.items()}
              for s, by in med.items() if s != "torch_ddp"}
    vs_own_unlimited = {s: {link: ratio(v, by.get("unlimited")) for link, v in by.items()
                            if link != "unlimited"} for s, by in med.items()}
    starling_vs_torch = {link: ratio(med.get("ddp", {}).get(link), v)
                         for link, v in med.get("torch_ddp", {}).items()}

    full = {r["strategy"]: r for r in ok if r["part"] == "full"}
    ddp_loss = full.get("ddp", {}).get("final_val_loss")
    loss = {s: {"final_val_loss": r.get("final_val_loss"),
                "tokens": r["val"][-1]["tokens"] if r.get("val") else None,
                "vs_ddp": ratio(r.get("final_val_loss"), ddp_loss),
                "elapsed_s": r.get("swarm", {}).get("elapsed_s")}
            for s, r in full.items()}

    abl = {r["name"].removeprefix("ablation-"): r for r in ok if r["part"] == "ablation"}
    co2_loss = full.get("co2", {}).get("final_val_loss")
    ablations = {}
    for tag, r in abl.items():
        ablations[tag] = {"sets": r["sets"], "final_val_loss": r.get("final_val_loss"),
                          "vs_co2": ratio(r.get("final_val_loss"), co2_loss),
                          "vs_ddp": ratio(r.get("final_val_loss"), ddp_loss),
                          "tokens_per_s": r.get("tokens_per_s"),
                          "state_bytes": r.get("state_bytes"),
                          "peak_rss_mb": r.get("peak_rss_mb")}
    zt, zf = abl.get("co2-zerotrue"), abl.get("co2-zerofalse")
    if zt and zf:
        ablations["zero_state_bytes_ratio"] = ratio(zt.get("state_bytes"), zf.get("state_bytes"))
        ablations["zero_peak_rss_ratio"] = ratio(zt.get("peak_rss_mb"), zf.get("peak_rss_mb"))
    return {"throughput": tput, "vs_ddp": vs_ddp, "vs_own_unlimited": vs_own_unlimited,
            "starling_ddp_vs_torch_ddp": starling_vs_torch, "loss": loss,
            "ablations": ablations}


def check_targets(summary):
    """The issue's three targets; a target whose inputs were not measured says so."""
    def line(ok, text, value):
        if value is None:
            return {"ok": None, "text": f"n/a  {text}: not measured"}
        return {"ok": ok, "text": f"{'ok  ' if ok else 'MISS'} {text}: {value:.3f}"}

    own = summary["vs_own_unlimited"].get("co2", {}).get("10mbit")
    loss = summary["loss"].get("co2", {}).get("vs_ddp")
    over = summary["vs_ddp"].get("co2", {}).get("10mbit")
    return [
        line(own is not None and own >= CO2_SLOW_OVER_OWN,
             f"co2 tokens/s at 10mbit >= {CO2_SLOW_OVER_OWN}x its own unlimited", own),
        line(loss is not None and abs(loss - 1) <= CO2_LOSS_TOLERANCE,
             f"co2 val loss at equal tokens within {CO2_LOSS_TOLERANCE:.0%} of ddp's "
             "(co2/ddp)", loss),
        line(over is not None and over >= CO2_OVER_DDP_SLOW,
             f"co2 tokens/s at 10mbit >= {CO2_OVER_DDP_SLOW}x ddp's", over),
    ]


def fmt(x, spec, width):
    """x right-aligned in `width`, formatted by `spec` ("+" first: always a sign); None: "-"."""
    if x is None:
        return f"{'-':>{width}}"
    sign, spec = ("+", spec[1:]) if spec.startswith("+") else ("", spec)
    return f"{x:>{sign}{width}{spec}}"


def print_report(a, summary, targets):
    links = list(a.links)
    slow = [link for link in links if link != "unlimited"]
    med = {s: {link: v["median"] for link, v in by.items()}
           for s, by in summary["throughput"].items()}
    w = 11
    head = (f"{'tokens/s':<12}" + "".join(f"{link:>{w}}" for link in links) + " |"
            + "".join(f"{'x ddp ' + link:>{w + 5}}" for link in links) + " |"
            + "".join(f"{link + '/unl':>{w + 2}}" for link in slow))
    print(head)
    print("-" * len(head))
    for s in list(a.strategies) + ["torch_ddp"]:
        if s not in med:
            continue
        vs = summary["vs_ddp"].get(s, {})
        own = summary["vs_own_unlimited"].get(s, {})
        print(f"{s:<12}" + "".join(fmt(med[s].get(link), ".0f", w) for link in links) + " |"
              + "".join(fmt(vs.get(link), ".2f", w + 5) for link in links) + " |"
              + "".join(fmt(own.get(link), ".2f", w + 2) for link in slow))
    svt = summary["starling_ddp_vs_torch_ddp"]
    if svt:
        print(f"{'ddp/torch':<12}" + "".join(fmt(svt.get(link), ".2f", w) for link in links)
              + "   (Starling ddp tokens/s over torch DDP's, same link)")
    print(f"tokens/s: the swarm's ({PEERS} peers), steady state (first round and evaluations "
          f"left out), median of {a.reps} run(s); x ddp: over Starling ddp on the same link; "
          "link/unl: over the strategy's own unlimited rate")

    if summary["loss"]:
        print("\nvalidation loss at equal tokens (full runs, unlimited link):")
        for s, v in summary["loss"].items():
            rel = None if v["vs_ddp"] is None else 100 * (v["vs_ddp"] - 1)
            print(f"  {s:<10}{fmt(v['final_val_loss'], '.4f', 8)}  at {v['tokens'] or 0:.3g} "
                  f"tokens  {fmt(rel, '+.2f', 7)}% vs ddp  ({fmt(v['elapsed_s'], '.0f', 5)} s "
                  "wall)")
    abl = summary["ablations"]
    if abl:
        print("\nablations (co2, unlimited link):")
        for tag, v in abl.items():
            if not isinstance(v, dict):
                continue
            if "zero" in tag:  # throughput length: memory and speed, not loss
                print(f"  {tag:<16}state {(v['state_bytes'] or 0) / 1e6:.2f} MB/peer, peak RSS "
                      f"{v['peak_rss_mb']:.0f} MB, {fmt(v['tokens_per_s'], '.0f', 0)} tokens/s")
            else:  # full length: loss against co2 with the defaults and against ddp
                print(f"  {tag:<16}val loss {fmt(v['final_val_loss'], '.4f', 0)} "
                      f"({fmt(v['vs_co2'], '.3f', 0)}x co2, {fmt(v['vs_ddp'], '.3f', 0)}x ddp)")
        if abl.get("zero_state_bytes_ratio") is not None:
            print(f"  zero=true / zero=false: state bytes {abl['zero_state_bytes_ratio']:.3f}x, "
                  f"peak RSS {fmt(abl.get('zero_peak_rss_ratio'), '.3f', 5)}x")
    print("\ntargets:")
    for t in targets:
        print(t["text"])


# --- main --------------------------------------------------------------------------------------
