#!/usr/bin/env python3
"""Emulated wide-area links for scripts/bench-table2.sh: proxy layout, latency model, report.

  wan.py links  --topology T --n N --peer-port P --client-port C --named-port B --proxy-port X
                --links-out FILE --routes-out FILE
      netdelay's links file (one TCP proxy per ordered replica pair (i, j) at X + 10 + i*n + j,
      delaying by the one-way delay between their sites; UDP and TCP proxies for the client at
      X + 0 (replica 0's client port) and X + 1 (the baseline named), with the client's delay to
      replica 0's site) and the `sdns cluster up --peer-routes` file (replica i dials j there).
  wan.py model  --topology T --n N --corrupt IDS --protocol P     -> JSON, model terms in ms
  wan.py report RESULTS.jsonl --topology T --plots DIR [--date D]  -> markdown on stdout, PNGs

The model is docs/LATENCY.md's, evaluated on the topology's delays: PBFT's three phases with
replica 0 as gateway and primary, then each of an update's signatures in turn at every replica
(a replica starts the next one when it has finished the last one), with the protocols' rules
for which shares a replica waits for. Standard library only, except matplotlib for the plots.
"""
import argparse
import json
import statistics
import sys
import tomllib

# Signatures named makes for each operation of the benchmark (docs/BENCHMARKS.md, "What is
# measured"): an add of a new name signs the A RRset, its NSEC, the previous name's NSEC and the
# SOA; a delete the previous NSEC and the SOA.
SIGNATURES = {"add": 4, "delete": 2}
# The vouched read's timeout floor and cap (wrapper config defaults, vouch_timeout_ms and
# vouch_timeout_max_ms): a read whose 2t peers' barriers need longer than the cap is ordered
# after the floor.
VOUCH_FLOOR_MS, VOUCH_CAP_MS = 5.0, 50.0

# The paper's Table 2 (Cachin & Samar, DSN 2004), in seconds, as docs/BENCHMARKS.md quotes it
# ("Against the paper's Table 2"): Internet rows. (4,0) read 0.37, (7,0) 0.44; the corrupted
# rows have no read figure. (1,0) is their unmodified named.
PAPER = {
    (1, 0): {"read": 0.003, "add": {"plain": 0.047}, "delete": {"plain": 0.022}},
    (4, 0): {"read": 0.37, "add": {"basic": 6.36, "opt-proof": 3.09, "opt-te": 3.01}, "delete": {"basic": 3.10, "opt-proof": 1.78, "opt-te": 1.80}},
    (4, 1): {"add": {"basic": 9.29, "opt-proof": 6.48, "opt-te": 3.10}, "delete": {"basic": 5.04, "opt-proof": 3.99, "opt-te": 1.90}},
    (7, 0): {"read": 0.44, "add": {"basic": 21.73, "opt-proof": 3.06, "opt-te": 2.30}, "delete": {"basic": 10.09, "opt-proof": 1.74, "opt-te": 1.83}},
    (7, 1): {"add": {"basic": 24.57, "opt-proof": 4.20, "opt-te": 3.46}, "delete": {"basic": 10.85, "opt-proof": 2.73, "opt-te": 2.03}},
    (7, 2): {"add": {"basic": 21.21, "opt-proof": 15.79, "opt-te": 4.01}, "delete": {"basic": 10.55, "opt-proof": 8.32, "opt-te": 2.27}},
}


class Topology:
    def __init__(self, path, scale=1.0):
        # scale 0: every link without delay (the same cluster, its local costs only).
        self.scale = scale
        with open(path, "rb") as f:
            t = tomllib.load(f)
        self.sites = t["replicas"]
        self.client = t["client"]
        self.same = float(t.get("same_site_ms", 0.5))
        self.jitter = float(t.get("jitter_ms", 0.0))
        self.loss = float(t.get("loss", 0.0))
        self.table = {}
        for k, v in t["one_way_ms"].items():
            a, b = k.split("|")
            self.table[(a, b)] = self.table[(b, a)] = float(v)
        self.compute = {k: float(v) for k, v in t.get("compute_ms", {}).items()}

    def site_delay(self, a, b):
        return self.scale * self._site_delay(a, b)

    def _site_delay(self, a, b):
        if a == b:
            return self.same
        if (a, b) not in self.table:
            sys.exit(f"wan.py: no one-way delay between {a} and {b} in the topology")
        return self.table[(a, b)]

    def d(self, i, j):
        """One-way delay between replicas i and j (0 to itself)."""
        return 0.0 if i == j else self.site_delay(self.sites[i], self.sites[j])

    def client_delay(self, i=0):
        return self.site_delay(self.client, self.sites[i])


def kth(values, k):
    """The k-th smallest (1-based); infinity when there are fewer."""
    v = sorted(values)
    return v[k - 1] if 0 < k <= len(v) else float("inf")


def pbft_commit_times(top, n):
    """When each replica commits a request that reached replica 0 (gateway and primary) at 0."""
    if n == 1:
        return [0.0]
    f = (n - 1) // 3
    d = top.d
    pre = [d(0, i) for i in range(n)]  # the pre-prepare (carrying the request) arrives
    # Prepared: the pre-prepare and 2f prepares of distinct backups (a backup's own included).
    prepared = [max(pre[i], kth([pre[j] + d(j, i) for j in range(1, n)], 2 * f)) for i in range(n)]
    # Committed: 2f+1 commits, its own included.
    return [kth([prepared[j] + d(j, i) for j in range(n)], 2 * f + 1) for i in range(n)]


def relax(top, n, own):
    """A finished signature is announced: replica i is done at the earliest of its own finish
    and any replica's finish plus the delay from it."""
    return [min(own[j] + top.d(j, i) for j in range(n)) for i in range(n)]


def signature_chain(top, n, corrupt, protocol, count, start):
    """Finish times (per replica) of `count` signatures signed one after another."""
    t = (n - 1) // 3
    k = t + 1
    c = top.compute
    share = c.get("share", 0.0)
    proven = c.get("share_with_proof", share)
    verify = c.get("verify_share", 0.0)
    combine = c.get("combine", 0.0)
    fallbacks = 0
    for _ in range(count):
        own = []
        # With proofs from the start (BASIC) the share takes longer.
        made = [start[j] + (proven if protocol == "basic" else share) for j in range(n)]
        for i in range(n):
            arrivals = sorted((made[j] + top.d(j, i), j not in corrupt) for j in range(n))
            valid = [a for a, ok in arrivals if ok]
            if protocol == "opt-te":
                # Trial and error over the shares at hand: done once k valid ones are in.
                own.append(kth(valid, k) + combine)
            elif protocol == "basic":
                own.append(kth(valid, k) + k * verify + combine)
            else:  # opt-proof: combine the first k; if one is bad, ask everyone for proofs
                first = arrivals[:k]
                t1 = first[-1][0] + combine
                if all(ok for _, ok in first):
                    own.append(t1)
                    continue
                fallbacks += 1
                # Honest replicas answer the retry with a proven share.
                proven_in = [t1 + top.d(i, j) + proven + top.d(j, i) for j in range(n) if j not in corrupt]
                own.append(kth(proven_in, k) + k * verify + combine)
        start = relax(top, n, own)
    return start, fallbacks


def model(top, n, corrupt, protocol):
    c = top.client_delay(0)
    t = (n - 1) // 3
    commit = pbft_commit_times(top, n)
    # Vouched read: 2t peers' barriers, one round trip to the 2t-th nearest peer.
    vouch = 2 * kth([top.d(0, j) for j in range(1, n)], 2 * t) if n > 1 else 0.0
    if vouch <= VOUCH_CAP_MS:
        read_extra, read_path = vouch, "vouched"
    else:
        read_extra, read_path = VOUCH_FLOOR_MS + commit[0], "ordered after the vouch timeout floor"
    out = {
        "n": n,
        "t": t,
        "protocol": protocol,
        "corrupt": sorted(corrupt),
        "client_one_way_ms": c,
        "ordering_ms": commit[0],
        "commit_ms_per_replica": [round(x, 2) for x in commit],
        "vouch_round_trip_ms": vouch,
        "read_path": read_path,
        "read_extra_ms": read_extra,
        "read_ms": 2 * c + read_extra,
    }
    for op, count in SIGNATURES.items():
        finish, fb = signature_chain(top, n, set(corrupt), protocol, count, commit)
        # nsupdate: the SOA query (a read) and then the update.
        out[f"{op}_extra_ms"] = read_extra + finish[0]
        out[f"{op}_signing_ms"] = finish[0] - commit[0]
        out[f"{op}_ms"] = 2 * c + read_extra + 2 * c + finish[0]
        out[f"{op}_fallbacks"] = fb
    return out


def cmd_links(a):
    top = Topology(a.topology, a.scale)
    n = a.n
    if n > len(top.sites):
        sys.exit(f"wan.py: the topology has {len(top.sites)} replica sites, not {n}")
    links, routes = [], []
    tail = f"{top.jitter:g} {top.loss:g}"
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            port = a.proxy_port + 10 + i * n + j
            links.append(f"tcp 127.0.0.1:{port} 127.0.0.1:{a.peer_port + j} {top.d(i, j):g} {tail}  # {i} {top.sites[i]} -> {j} {top.sites[j]}")
            routes.append(f"{i} {j} 127.0.0.1:{port}")
    c = top.client_delay(0)
    for proto in ("udp", "tcp"):
        links.append(f"{proto} 127.0.0.1:{a.proxy_port} 127.0.0.1:{a.client_port} {c:g} {tail}  # client {top.client} -> replica 0 {top.sites[0]}")
        links.append(f"{proto} 127.0.0.1:{a.proxy_port + 1} 127.0.0.1:{a.named_port} {c:g} {tail}  # client {top.client} -> stock named at {top.sites[0]}")
    with open(a.links_out, "w") as f:
        f.write("# netdelay links, written by scripts/bench/wan.py from " + a.topology + "\n" + "\n".join(links) + "\n")
    with open(a.routes_out, "w") as f:
        f.write("# sdns cluster up --peer-routes: FROM TO ADDRESS (a netdelay proxy)\n" + "\n".join(routes) + "\n")


def cmd_model(a):
    top = Topology(a.topology)
    corrupt = [int(x) for x in a.corrupt.split(",") if x]
    print(json.dumps(model(top, a.n, corrupt, a.protocol)))


def stats(samples):
    if not samples:
        return None
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2], "min": s[0], "max": s[-1], "n": len(s)}


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def cmd_report(a):
    top = Topology(a.topology)
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    lat = [r for r in rows if "read" in r and isinstance(r.get("read"), dict)]
    base = [r for r in lat if r.get("kind") == "baseline"]
    sd = [r for r in lat if r.get("kind") == "sdns"]
    zero = Topology(a.topology, 0.0)
    # The same configuration with every delay 0, measured just before (TABLE2_LOCAL=1), and
    # its replica 0's ordering mean: sdns's own local costs, which the model does not guess.
    local = {(r["n"], r["corrupted"], r["protocol"]): r for r in lat if r.get("kind") == "sdns-local"}
    local_split = {(r["n"], r["corrupted"], r["protocol"]): r for r in rows if r.get("kind") == "split-local"}
    pooled = {op: [x for r in base for x in r[op].get("samples_ms", [])] for op in ("read", "add", "delete")}
    bstat = {op: stats(v) for op, v in pooled.items()}
    failed = [r for r in rows if "failed" in r]
    out = []
    p = out.append
    p(f"Client at {top.client}, one way {top.client_delay(0):g} ms to replica 0 ({top.sites[0]}); replicas at "
      + ", ".join(f"{i}: {s}" for i, s in enumerate(top.sites)) + " (the first n of them).")
    p("")
    if any(bstat.values()):
        p("Stock named (same BIND build, no signer socket, ordinary RSASHA256 key) over the same client link, "
          "pooled before and after the clusters: "
          + ", ".join(f"{op} {fmt(bstat[op]['median'], 1)} ms (p25-p75 {fmt(bstat[op]['p25'], 1)}-{fmt(bstat[op]['p75'], 1)})" for op in ("read", "add", "delete") if bstat[op])
          + "; the paper's unmodified named, its (1, 0) row: read 3 ms, add 47 ms, delete 22 ms.")
        p("")
    p("Medians of the repeated operations in ms, p25-p75 in brackets; model = stock named's median "
      "plus the model's added terms (docs/LATENCY.md); x named = median / stock named's median; "
      "paper = the paper's Table 2 (seconds, 2004, Internet rows) and its ratio to their unmodified named.")
    p("")
    if local:
        p("model+local = the same configuration measured with every delay 0 just before (its median: "
          "sdns's own local costs on this machine) plus the model's network terms; on the delayed "
          "links a read (and nsupdate's SOA read) is ordered, not vouched, so the zero-delay run's "
          "mean ordering time is added for each such read.")
        p("")
    p("| (n, k) | protocol | op | median ms [p25-p75] | model ms | median / model | model+local ms | median / (model+local) | x named | paper s | paper x named |")
    p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    plot = []
    for r in sorted(sd, key=lambda r: (r["n"], r["corrupted"], r["protocol"])):
        n, k, proto = r["n"], r["corrupted"], r["protocol"]
        corrupt = [int(x) for x in str(r.get("corrupt_ids", "")).split(",") if x]
        m = model(top, n, corrupt, proto)
        m0 = model(zero, n, corrupt, proto)
        lr, ls = local.get((n, k, proto)), local_split.get((n, k, proto))
        for op in ("read", "add", "delete"):
            s = stats(r[op].get("samples_ms", []))
            if not s:
                p(f"| ({n}, {k}) | {proto} | {op} | no sample | | | | | | | |")
                continue
            ml = None
            if lr and stats(lr[op].get("samples_ms", [])):
                ml = stats(lr[op]["samples_ms"])["median"] + m[f"{op}_ms"] - m0[f"{op}_ms"]
                if m["read_path"] != m0["read_path"] and ls and ls.get("ordering_mean_ms"):
                    ml += ls["ordering_mean_ms"]
            mlr = s["median"] / ml if ml else None
            b = bstat.get(op)
            mod = b["median"] + m[f"{op}_extra_ms"] if b else None
            ratio = s["median"] / mod if mod else None
            xn = s["median"] / b["median"] if b else None
            # The paper's (1, 0) row is its unmodified named: beside the stock named, not here.
            pp = PAPER.get((n, k), {}).get(op) if n > 1 else None
            if isinstance(pp, dict):
                pp = pp.get(proto)
            pn = PAPER[(1, 0)][op]
            pn = pn.get("plain") if isinstance(pn, dict) else pn
            paper = f"{pp:g}" if pp is not None else "-"
            paper_x = f"{pp / pn:.0f}" if pp is not None and pn else "-"
            p(f"| ({n}, {k}) | {proto} | {op} | {s['median']:.1f} [{s['p25']:.1f}-{s['p75']:.1f}] | {fmt(mod, 1)} | {fmt(ratio, 2)} | {fmt(ml, 1)} | {fmt(mlr, 2)} | {fmt(xn, 1)} | {paper} | {paper_x} |")
            plot.append((n, k, proto, op, s, mod))
    if failed:
        p("")
        p("Failed or skipped: " + "; ".join(f"{r.get('tag')}: {r['failed']}" for r in failed))
    # Table 3: what the replicas' metrics split out of one update (replica 0, means).
    t3 = [r for r in rows if r.get("kind") == "split"]
    t3_local = local_split
    if t3:
        p("")
        p("Table 3 (the time split), from replica 0's metrics over each run (sum / count = mean): the ordering "
          "(a request's arrival to its delivery), and one signature (named's signing request to the threshold "
          "signature) split into this replica's share computation, waiting for peers (their shares, or their "
          "finished signature), combination with its checks, and the rest (a free worker, message handling); the "
          "four add up to the signature's time (crates/wrapper/src/signing/split.rs). The model's share and "
          "combination costs (the topology's `compute_ms`) and its per-signature wide-area time are beside it.")
        p("")
        p("| (n, k) | protocol | ordering mean ms | model ordering ms | ordering mean ms, zero delay | signature mean ms | signatures | "
          "share ms | wait ms | combine ms | other ms | model share / combine ms | model signature ms (add, per signature) | signature mean ms, zero delay |")
        p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        comp = top.compute
        for r in sorted(t3, key=lambda r: (r["n"], r["corrupted"], r["protocol"])):
            corrupt = [int(x) for x in str(r.get("corrupt_ids", "")).split(",") if x]
            m = model(top, r["n"], corrupt, r["protocol"])
            z = t3_local.get((r["n"], r["corrupted"], r["protocol"]), {})
            share = comp.get("share_with_proof", comp.get("share", 0.0)) if r["protocol"] == "basic" else comp.get("share", 0.0)
            phases = " | ".join(fmt(r.get(f"sig_{ph}_mean_ms"), 1) for ph in ("share", "wait", "combine", "other"))
            p(f"| ({r['n']}, {r['corrupted']}) | {r['protocol']} | {fmt(r.get('ordering_mean_ms'), 1)} | {m['ordering_ms']:.1f} | {fmt(z.get('ordering_mean_ms'), 1)} | "
              f"{fmt(r.get('signing_mean_ms'), 1)} | {r.get('signing_count', '-')} | {phases} | {share:.1f} / {comp.get('combine', 0.0):.1f} | "
              f"{m['add_signing_ms'] / SIGNATURES['add']:.1f} | {fmt(z.get('signing_mean_ms'), 1)} |")
    print("\n".join(out))
    if a.plots:
        plots(plot, bstat, a.plots, a.date)


def plots(data, bstat, outdir, date):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(no plots: python3-matplotlib is not installed; apt-get install -y python3-matplotlib)", file=sys.stderr)
        return
    import os
    os.makedirs(outdir, exist_ok=True)
    protos = ["basic", "opt-proof", "opt-te"]
    colors = {"basic": "#c44e52", "opt-proof": "#dd8452", "opt-te": "#4c72b0"}
    for op in ("read", "add", "delete"):
        rows = [x for x in data if x[3] == op]
        if not rows:
            continue
        configs = sorted({(x[0], x[1]) for x in rows})
        fig, ax = plt.subplots(figsize=(8, 4.2))
        width = 0.26
        for pi, proto in enumerate(protos):
            xs, ys, lo, hi, ms = [], [], [], [], []
            for ci, cfg in enumerate(configs):
                hit = [x for x in rows if (x[0], x[1]) == cfg and x[2] == proto]
                if not hit:
                    continue
                s, mod = hit[0][4], hit[0][5]
                xs.append(ci + (pi - 1) * width)
                ys.append(s["median"])
                lo.append(s["median"] - s["p25"])
                hi.append(s["p75"] - s["median"])
                ms.append(mod)
            if xs:
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=colors[proto], label=f"{proto} (median, p25-p75)")
                ax.scatter(xs, [m if m is not None else float("nan") for m in ms], marker="_", s=300, color="black", zorder=3,
                           label="model" if pi == 0 or not ax.get_legend_handles_labels()[1].count("model") else None)
        if bstat.get(op):
            ax.axhline(bstat[op]["median"], color="gray", linestyle="--", label="stock named, same client link")
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"({n}, {k})" for n, k in configs])
        ax.set_xlabel("(n, corrupted)")
        ax.set_ylabel(f"{op} latency, ms")
        ax.set_title(f"{op}: emulated WAN (Zurich x2, New York, San Jose, + Austin, London, Tokyo){' ' + date if date else ''}", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        seen = {}
        for h, l in zip(handles, labels):
            if l and l not in seen:
                seen[l] = h
        ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, f"table2-{op}.png"), dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    l = sub.add_parser("links")
    l.add_argument("--topology", required=True)
    l.add_argument("--n", type=int, required=True)
    for x in ("peer-port", "client-port", "named-port", "proxy-port"):
        l.add_argument("--" + x, type=int, required=True)
    l.add_argument("--scale", type=float, default=1.0, help="multiply every delay (0: local costs only)")
    l.add_argument("--links-out", required=True)
    l.add_argument("--routes-out", required=True)
    m = sub.add_parser("model")
    m.add_argument("--topology", required=True)
    m.add_argument("--n", type=int, required=True)
    m.add_argument("--corrupt", default="")
    m.add_argument("--protocol", default="opt-te", choices=["basic", "opt-proof", "opt-te"])
    r = sub.add_parser("report")
    r.add_argument("results")
    r.add_argument("--topology", required=True)
    r.add_argument("--plots", default="")
    r.add_argument("--date", default="")
    a = ap.parse_args()
    {"links": cmd_links, "model": cmd_model, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
