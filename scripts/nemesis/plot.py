#!/usr/bin/env python3
"""Latency over time from a campaign's output (history.jsonl, nemesis.jsonl, report.json): each
operation at its invocation, its latency on a log scale, by client and kind; operations that
got no answer (timeouts: `info`) as crosses at the top; the nemesis's actions as solid lines and
what the replicas reported (scenario.Watcher) as dashed ones; the median over each second.

    scripts/nemesis/plot.py OUT_DIR --png docs/plots/faults-view-change.png

Needs matplotlib (Debian's python3-matplotlib; run with /usr/bin/python3 if another python3
comes first on PATH).
"""

import argparse
import json
import os
import statistics
import sys


def load(out):
    with open(os.path.join(out, "history.jsonl")) as f:
        history = [json.loads(line) for line in f if line.strip()]
    events = []
    path = os.path.join(out, "nemesis.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    return history, events, report


def medians(ops, width=1.0):
    """(window middle, median latency in ms) per window of `width` seconds of invocation."""
    buckets = {}
    for op in ops:
        buckets.setdefault(int(op["start"] // width), []).append((op["end"] - op["start"]) * 1000)
    return [((k + 0.5) * width, statistics.median(v)) for k, v in sorted(buckets.items())]


# The random nemesis's own notes carry no label.
LABELS = {"kill": "kill -9 {r}", "stop": "SIGSTOP {r}", "skew": "restart {r} 2 h ahead", "heal kill": "replica {r} back",
          "heal stop": "SIGCONT {r}", "heal skew": "replica {r} back, clock right"}


def event_label(e):
    if "label" in e:
        return e["label"]
    return LABELS.get(e["what"], "{what} {r}").format(r=e["replica"], what=e["what"])


def grouped(events, within=1.0):
    """What several replicas reported alike within a second, as one line ("... at 0, 1, 2")."""
    out = []
    for e in events:
        last = out[-1] if out else None
        if (last and e.get("observed") and last.get("observed") and last["what"] == e["what"]
                and e["time"] - last["time"] <= within and e["what"] != "view installed"):
            last["replicas"].append(e["replica"])
            last["label"] = f"{e['what']} at " + ", ".join(str(r) for r in last["replicas"])
            continue
        out.append(dict(e, replicas=[e["replica"]]))
    return out


def verdict(report):
    bad = (len(report["linearizability_violations"]) + len(report["lost_acknowledged_writes"])
           + report["g2_unanswered_voting_requests"] + len(report.get("replicas_not_back", []))
           + len(report.get("scenario_missing", [])) + (0 if report["zones_identical"] else 1))
    return "history checked: linearizable, nothing lost, G2 held, zones identical" if bad == 0 else "CHECK FAILED (report.json)"


def plot(out, png, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history, events, report = load(out)
    ops = [op for op in history if op["proc"] != "final"]
    if not ops:
        sys.exit(f"plot.py: no operations in {out}")
    done = [op for op in ops if op["outcome"] in ("ok", "fail") and op["end"] is not None]
    lost = [op for op in ops if op["outcome"] == "info"]
    fig, ax = plt.subplots(figsize=(11, 6))
    styles = {
        ("plain", "read"): ("tab:blue", ".", "plain read (dig)"),
        ("plain", "write"): ("tab:orange", ".", "plain write (nsupdate)"),
        ("voting", "read"): ("tab:green", "^", "voting read (sdns query)"),
        ("voting", "write"): ("tab:purple", "v", "voting write (sdns update)"),
    }
    for (client, f), (colour, marker, label) in styles.items():
        sel = [op for op in done if op["client"] == client and op["f"] == f]
        if sel:
            ax.scatter([op["start"] for op in sel], [max((op["end"] - op["start"]) * 1000, 0.1) for op in sel],
                       s=6 if marker == "." else 14, c=colour, marker=marker, alpha=0.6, linewidths=0, label=f"{label}: {len(sel)}")
    top = max([(op["end"] - op["start"]) * 1000 for op in done] + [1000]) * 1.6
    if lost:
        ax.scatter([op["start"] for op in lost], [top] * len(lost), c="red", marker="x", s=20, label=f"no answer (timeout): {len(lost)}")
    m = medians(done)
    ax.plot([x for x, _ in m], [y for _, y in m], c="black", lw=1.2, label="median per second")
    for e in grouped(events):
        observed = e.get("observed", False)
        colour = {"view installed": "tab:red", "state transfer begun": "tab:brown", "state transfer installed": "tab:brown",
                  "zone signing begun": "tab:olive", "zone signing installed": "tab:olive"}.get(e["what"], "tab:gray" if observed else "red")
        ax.axvline(e["time"], c=colour, ls="--" if observed else "-", lw=1)
        # Labels along the bottom, where no operation is this quick.
        # The nemesis's actions labelled left of their line, what the replicas reported right
        # of it: a view installed a few hundred ms after the kill stays readable.
        ax.text(e["time"], 0.02, event_label(e) + " ", rotation=90, va="bottom", ha="left" if observed else "right",
                fontsize=7, color=colour, transform=ax.get_xaxis_transform())
    ax.set_yscale("log")
    # Room below the quickest operation for the events' labels.
    ax.set_ylim(max(min((op["end"] - op["start"]) * 1000 for op in done), 0.1) / 30 if done else 0.01, top * 1.3)
    ax.set_xlim(0, max([op["start"] for op in ops] + [e["time"] for e in events]) + 1)
    ax.set_xlabel("seconds since the clients started (invocation time)")
    ax.set_ylabel("latency, ms (log scale)")
    load1 = report.get("load1_at_end")
    ax.set_title(title or f"{report.get('scenario') or 'campaign'}: {report['replicas']} replicas, {len(ops)} operations; {verdict(report)}"
                 + (f"; load {load1:.1f} on {os.cpu_count()} cores" if load1 is not None else ""), fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7, ncol=4, markerscale=2)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="a campaign's --out directory")
    p.add_argument("--png", required=True)
    p.add_argument("--title", default=None)
    a = p.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("plot.py: matplotlib is missing (apt-get install -y python3-matplotlib; /usr/bin/python3)")
    plot(a.out, a.png, a.title)
    print(a.png)


if __name__ == "__main__":
    main()
