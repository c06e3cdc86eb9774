#!/usr/bin/env python3
"""Latency probes for scripts/bench-cluster.sh (standard library only).

  measure.py latency --port P --zone Z --key K --reps N --tag T   -> one JSON object on stdout
  measure.py dnsperf FILE                                        -> JSON with dnsperf's figures
  measure.py queryfile ZONE                                      -> a dnsperf query file on stdout

Latency, as in the paper's Table 2 (Cachin & Samar, DSN 2004, Section 5.2):
  read   = one plain UDP query (www.<zone> A, EDNS0 without DO), send to answer, timed with
           perf_counter: dig only reports whole milliseconds, too coarse for a loopback named;
  add    = wall time of one `nsupdate -k` process adding a new A record. The script has a
           `server` line and no `zone` line, so nsupdate first asks the server for the SOA of
           the name (a read) and then sends the update, which is what the paper timed;
  delete = the same, deleting that record.
The operations run one after another (all reads, then all adds, then all deletes), never
concurrently. Each sample is checked (answer rcode NOERROR, nsupdate exit status 0 and no
"failed" in its output); failures are counted and their first messages kept, never timed.
"""
import json
import os
import random
import re
import socket
import statistics
import struct
import subprocess
import sys
import time


def encode_name(name):
    out = b""
    for label in name.strip(".").split("."):
        out += bytes([len(label)]) + label.encode("ascii")
    return out + b"\0"


def query_once(host, port, qname, timeout):
    """One A query over UDP; returns (elapsed seconds, rcode, answer count)."""
    qid = random.randrange(65536)
    # Header: id, flags 0 (a plain iterative query to an authority), 1 question, 1 additional (OPT).
    msg = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1)
    msg += encode_name(qname) + struct.pack(">HH", 1, 1)
    msg += b"\0" + struct.pack(">HHIH", 41, 1232, 0, 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.connect((host, port))
        t0 = time.perf_counter()
        s.send(msg)
        while True:
            data = s.recv(65535)
            if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
                break
        elapsed = time.perf_counter() - t0
    _, flags, _, ancount, _, _ = struct.unpack(">HHHHHH", data[:12])
    return elapsed, flags & 0xF, ancount


def nsupdate_once(host, port, key, lines, timeout):
    """One nsupdate process; returns (elapsed seconds, error text or None)."""
    script = f"server {host} {port}\n" + "".join(l + "\n" for l in lines) + "send\n"
    t0 = time.perf_counter()
    try:
        # -t bounds the whole exchange; UDP retry interval (-u) stays nsupdate's default (3 s).
        p = subprocess.run(["nsupdate", "-t", str(int(timeout)), "-k", key], input=script,
                           capture_output=True, text=True, timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, f"nsupdate killed after {timeout + 5} s"
    elapsed = time.perf_counter() - t0
    out = (p.stdout + p.stderr).strip()
    if p.returncode != 0 or "failed" in out.lower() or "refused" in out.lower():
        return elapsed, f"exit {p.returncode}: {out[:300]}"
    return elapsed, None


def summary(samples_s):
    ms = [x * 1000.0 for x in samples_s]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "stdev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        # Samples near whole seconds hint at a protocol timer rather than computation.
        "over_900ms": sum(1 for x in ms if x > 900.0),
        "samples_ms": [round(x, 3) for x in ms],
    }


def latency(args):
    host, port, zone, key, reps, tag = args.host, args.port, args.zone.strip("."), args.key, args.reps, args.tag
    result = {"tag": tag, "port": port, "reps": reps}
    result.update(json.loads(args.meta))
    errors = []

    reads = []
    for _ in range(reps):
        try:
            t, rcode, an = query_once(host, port, f"www.{zone}", args.read_timeout)
            if rcode != 0 or an == 0:
                errors.append(f"read: rcode {rcode}, {an} answers")
            else:
                reads.append(t)
        except OSError as e:
            errors.append(f"read: {e} (after {args.read_timeout} s)")
    result["read"] = summary(reads)

    # Names unique per run so a leftover from an earlier sample cannot turn an add into a no-op.
    names = [f"b{tag}-{i}.{zone}." for i in range(reps)]
    adds, dels = [], []
    for i, name in enumerate(names):
        t, err = nsupdate_once(host, port, key, [f"update add {name} 300 A 192.0.2.{1 + i % 250}"], args.update_timeout)
        (errors.append(f"add {name}: {err}") if err else adds.append(t))
    # The adds must be visible before the deletes are timed (else a delete would be a no-op).
    try:
        _, rcode, an = query_once(host, port, names[-1], args.read_timeout)
        if rcode != 0 or an == 0:
            errors.append(f"check after adds: {names[-1]} rcode {rcode}, {an} answers")
    except OSError as e:
        errors.append(f"check after adds: {e}")
    for name in names:
        t, err = nsupdate_once(host, port, key, [f"update delete {name} A"], args.update_timeout)
        (errors.append(f"delete {name}: {err}") if err else dels.append(t))
    result["add"] = summary(adds)
    result["delete"] = summary(dels)
    result["errors"] = len(errors)
    result["error_messages"] = errors[:10]
    print(json.dumps(result))


def parse_dnsperf(path, meta):
    text = open(path, encoding="utf-8", errors="replace").read()

    def grab(pattern, conv=float):
        m = re.search(pattern, text)
        return conv(m.group(1)) if m else None

    out = {
        "qps": grab(r"Queries per second:\s+([0-9.]+)"),
        "sent": grab(r"Queries sent:\s+(\d+)", int),
        "completed": grab(r"Queries completed:\s+(\d+)", int),
        "lost": grab(r"Queries lost:\s+(\d+)", int),
        "avg_latency_s": grab(r"Average Latency \(s\):\s+([0-9.]+)"),
        "noerror": grab(r"NOERROR\s+(\d+)", int),
    }
    out.update(json.loads(meta))
    print(json.dumps(out))


def queryfile(zone):
    zone = zone.strip(".")
    for name, rtype in [("www", "A"), ("www", "AAAA"), ("mail", "A"), ("", "MX"), ("", "SOA"), ("ns0", "A"), ("", "TXT"), ("", "NS")]:
        print(f"{name + '.' if name else ''}{zone} {rtype}")


TYPES = {"A": 1, "NS": 2, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28}


def bigzone(zone, names):
    """Records appended to the demo zone: `names` hosts with A, AAAA and MX, and a PTR each
    under ptr.<zone> (forward names, so the zone's own key signs them)."""
    zone = zone.strip(".")
    for i in range(names):
        print(f"h{i}.{zone}. 300 IN A 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        print(f"h{i}.{zone}. 300 IN AAAA 2001:db8::{i:x}")
        print(f"h{i}.{zone}. 300 IN MX 10 mail.{zone}.")
        print(f"{i}.ptr.{zone}. 300 IN PTR h{i}.{zone}.")


def mixfile(zone, names, count, seed):
    """dnsperf input with an operator's query mix (issue 12): A 60%, PTR 17%, AAAA 15%, MX 7%,
    1% names that do not exist; names uniform over the zone (the worst case for a cache)."""
    zone = zone.strip(".")
    rng = random.Random(seed)
    for _ in range(count):
        i, r = rng.randrange(names), rng.random()
        if r < 0.60:
            print(f"h{i}.{zone} A")
        elif r < 0.77:
            print(f"{i}.ptr.{zone} PTR")
        elif r < 0.92:
            print(f"h{i}.{zone} AAAA")
        elif r < 0.99:
            print(f"h{i}.{zone} MX")
        else:
            print(f"nx{i}.{zone} A")


def probe(args):
    """Unloaded latency: the query file's first `count` queries one after another over UDP
    (EDNS 4096 with the DO bit, as dnsperf -D sends them); percentiles in ms."""
    queries = [line.split() for line in open(args.file, encoding="utf-8") if line.strip()][: args.count]
    samples, errors = [], 0
    for qname, qtype in queries:
        qid = random.randrange(65536)
        msg = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1)
        msg += encode_name(qname) + struct.pack(">HH", TYPES[qtype], 1)
        msg += b"\0" + struct.pack(">HHIH", 41, 4096, 0x8000, 0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(args.timeout)
            s.connect((args.host, args.port))
            try:
                t0 = time.perf_counter()
                s.send(msg)
                while True:
                    data = s.recv(65535)
                    if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
                        break
                samples.append(time.perf_counter() - t0)
            except OSError:
                errors += 1
    samples.sort()
    pct = lambda p: round(samples[min(len(samples) - 1, int(p / 100 * len(samples)))] * 1000, 4) if samples else None
    out = {"probes": len(queries), "answered": len(samples), "errors": errors,
           "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "max_ms": pct(100)}
    out.update(json.loads(args.meta))
    print(json.dumps(out))


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--host", default="127.0.0.1")
    lat.add_argument("--port", type=int, required=True)
    lat.add_argument("--zone", required=True)
    lat.add_argument("--key", required=True)
    lat.add_argument("--reps", type=int, default=20)
    lat.add_argument("--tag", required=True)
    lat.add_argument("--read-timeout", type=float, default=5.0)
    lat.add_argument("--update-timeout", type=float, default=30.0)
    lat.add_argument("--meta", default="{}", help="JSON object merged into the result (run parameters)")
    dp = sub.add_parser("dnsperf")
    dp.add_argument("file")
    dp.add_argument("--meta", default="{}")
    bz = sub.add_parser("bigzone")
    bz.add_argument("zone")
    bz.add_argument("names", type=int)
    mf = sub.add_parser("mixfile")
    mf.add_argument("zone")
    mf.add_argument("names", type=int)
    mf.add_argument("--count", type=int, default=100000)
    mf.add_argument("--seed", type=int, default=12)
    pr = sub.add_parser("probe")
    pr.add_argument("file")
    pr.add_argument("--host", default="127.0.0.1")
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--count", type=int, default=2000)
    pr.add_argument("--timeout", type=float, default=5.0)
    pr.add_argument("--meta", default="{}")
    qf = sub.add_parser("queryfile")
    qf.add_argument("zone")
    args = ap.parse_args()
    if args.cmd == "latency":
        latency(args)
    elif args.cmd == "dnsperf":
        parse_dnsperf(args.file, args.meta)
    elif args.cmd == "bigzone":
        bigzone(args.zone, args.names)
    elif args.cmd == "mixfile":
        mixfile(args.zone, args.names, args.count, args.seed)
    elif args.cmd == "probe":
        probe(args)
    else:
        queryfile(args.zone)


if __name__ == "__main__":
    sys.exit(main())
