#!/usr/bin/env python3
"""Markdown report from scripts/bench-cluster.sh's results.jsonl (standard library only).

Ratios are to the plain-named baseline measured in the same run: its samples from before and
after the cluster runs are pooled, so slow drift of the machine's load shows in neither alone.
"""
import json
import re
import statistics
import sys

PROTOCOLS = ["basic", "opt-proof", "opt-te"]
OPS = ["read", "add", "delete"]


def load(path):
    rows = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def baseline(rows):
    """Pooled mean and median per operation over every baseline measurement."""
    out = {}
    for op in OPS:
        samples = [s for r in rows if r.get("kind") == "baseline" for s in r.get(op, {}).get("samples_ms", [])]
        if samples:
            out[op] = (statistics.fmean(samples), statistics.median(samples))
    return out


def fmt(ms):
    if ms is None:
        return "–"
    if ms < 10:
        return f"{ms:.2f}"
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def cell(r, op, base, which):
    """'mean (×ratio)' or 'median (×ratio)' for one operation of one run."""
    s = r.get(op, {}) if r else {}
    if not s.get("n"):
        return "failed" if r else "–"
    i = 0 if which == "mean" else 1
    v = s["mean_ms" if which == "mean" else "median_ms"]
    text = fmt(v)
    if op in base and base[op][i] > 0:
        text += f" (×{v / base[op][i]:.1f})"
    if s.get("n") and r.get("reps") and s["n"] < r["reps"]:
        text += f" [{s['n']}/{r['reps']} ok]"
    return text


def table2(rows, base, which):
    runs = {(r["n"], r["corrupted"], r["protocol"]): r for r in rows if r.get("kind") == "sdns"}
    # A configuration that failed or was skipped shows as "failed" in its cell (tag nXcY-protocol).
    for r in rows:
        m = re.match(r"^n(\d+)c(\d+)-(.+)$", r.get("tag", ""))
        if r.get("failed") and m:
            runs.setdefault((int(m.group(1)), int(m.group(2)), m.group(3)), {"failed": r["failed"]})
    configs = sorted({(n, k) for n, k, _ in runs})
    head = "| (n, corrupted) | Read | " + " | ".join(f"Add {p.upper()}" for p in PROTOCOLS) + " | " + \
        " | ".join(f"Delete {p.upper()}" for p in PROTOCOLS) + " |"
    lines = [head, "|" + " --- |" * (2 + 2 * len(PROTOCOLS))]
    if base:
        b = {op: base[op][0 if which == "mean" else 1] for op in base}
        lines.append(f"| plain named (baseline) | {fmt(b.get('read'))} | " + " | ".join([fmt(b.get("add"))] * 3)
                     + " | " + " | ".join([fmt(b.get("delete"))] * 3) + " |")
    for n, k in configs:
        mine = {p: runs.get((n, k, p)) for p in PROTOCOLS}
        # Read does not depend on the signature protocol: the first run of the row gives it.
        first = next((mine[p] for p in ["opt-te", "opt-proof", "basic"] if mine[p]), None)
        adds = [cell(mine[p], "add", base, which) for p in PROTOCOLS]
        dels = [cell(mine[p], "delete", base, which) for p in PROTOCOLS]
        lines.append(f"| ({n}, {k}) | {cell(first, 'read', base, which)} | " + " | ".join(adds) + " | " + " | ".join(dels) + " |")
    return "\n".join(lines)


def details(rows, base):
    lines = ["| run | up (s) | load1 | read mean / median | add mean / median | delete mean / median | add max | samples > 900 ms | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("kind") not in ("sdns", "baseline"):
            continue
        def mm(op):
            s = r.get(op, {})
            return f"{fmt(s.get('mean_ms'))} / {fmt(s.get('median_ms'))}" if s.get("n") else "–"
        slow = sum(r.get(op, {}).get("over_900ms", 0) for op in OPS)
        lines.append(f"| {r['tag']} | {r.get('up_seconds', '–')} | {r.get('load1', '–')} | {mm('read')} | {mm('add')} | {mm('delete')} | "
                     f"{fmt(r.get('add', {}).get('max_ms'))} | {slow} | {r.get('errors', '–')} |")
    return "\n".join(lines)


def throughput(rows):
    t = {(r.get("reads"), r.get("target")): r for r in rows if r.get("kind") == "tput"}
    if not t:
        return "(not run)"
    lines = ["| reads mode | sdns replica 0 (q/s) | its named directly (q/s) | ratio | sdns avg latency (ms) | named avg latency (ms) | lost (sdns / named) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for mode in ["ordered", "local"]:
        s, d = t.get((mode, "sdns")), t.get((mode, "named"))
        if not s and not d:
            continue
        q = lambda r: r.get("qps") if r else None
        ratio = f"{q(s) / q(d):.3f}" if q(s) and q(d) else "–"
        lat = lambda r: fmt(r["avg_latency_s"] * 1000) if r and r.get("avg_latency_s") is not None else "–"
        lost = lambda r: str(r.get("lost")) if r else "–"
        lines.append(f"| {mode} | {fmt(q(s))} | {fmt(q(d))} | {ratio} | {lat(s)} | {lat(d)} | {lost(s)} / {lost(d)} |")
    return "\n".join(lines)


def main():
    rows = load(sys.argv[1])
    base = baseline(rows)
    print("### Latency, mean in ms (× the plain-named baseline of the same run)\n")
    print(table2(rows, base, "mean"))
    print("\n### Latency, median in ms (× baseline median)\n")
    print(table2(rows, base, "median"))
    print("\n### Every run\n")
    print(details(rows, base))
    print("\n### Read throughput (dnsperf), 4 replicas, OPT-TE\n")
    print(throughput(rows))
    failed = [r for r in rows if r.get("failed")]
    if failed:
        print("\n### Failed or skipped\n")
        for r in failed:
            print(f"- {r['tag']}: {r['failed']}")


if __name__ == "__main__":
    main()
