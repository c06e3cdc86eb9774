#!/usr/bin/env python3
"""Whole-zone signing at scale (issue 13), measured against dnssec-signzone in the same run.

For each zone size: the zone (the demo zone plus N hosts with A, AAAA and MX) is signed by
BIND's own dnssec-signzone with an ordinary key (2048-bit RSASHA256; with
SDNS_BENCH_ALGORITHM=13 ECDSAP256SHA256, 15 ED25519, 10 RSASHA512) in one thread, as the
replicas' signer runs, its CPU time taken from the kernel's accounting of the child. Then a
4-replica sdns cluster (a threshold key of the same algorithm, `--algorithm`) is started on the same zone while a probe
reads `www A` from replica 0 every 50 ms and an update goes to replica 1 every 2 s; its first
signing runs in the background of `cluster up` (measured from the first answer to the end of
`cluster up`; the replicas' CPU since their start, so start-up counts too). For smaller
zones `sdns sign-zone` then signs the whole zone again under the same load (CPU measured
over just that; the load's own CPU per second is measured in a window before it), and once
more with the probe and the updates stopped (the CPU of the signing alone). Recorded: the CPU time each replica spent (its sdns process with the
dnssec-signzone it ran, plus its named; from /proc/PID/stat), the wall time, the largest
gap between probe answers, the slowest update acknowledgement, and how long installing the
signed zone held each replica's executor (metric sdns_zone_install_seconds).

Usage: scripts/bench-signing.sh [NAMES ...]   (default: 1000 10000; a second signing by
`sdns sign-zone` for zones up to SDNS_BENCH_AGAIN_UP_TO names, default 2000;
SDNS_BENCH_SIGNER_THREADS sets the replicas' --zone-signer-threads; run under `taskset -c 0`
to give the whole cluster one core; SDNS_BENCH_RESIGN_WINDOW_S=120 measures incremental
re-signing instead of a second signing: signatures due 30 s after the first signing began,
then the probe and the updates for that many seconds while the slices run)
Needs the sdns binary (SDNS_BIN, default target/debug/sdns) and the patched BIND
(SDNS_BIND_DIR, default target/bind9).
"""

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDNS = os.environ.get("SDNS_BIN", os.path.join(ROOT, "target/debug/sdns"))
BIND = os.environ.get("SDNS_BIND_DIR", os.path.join(ROOT, "target/bind9"))
ZONE = "example.test"
# Seconds of load alone (probe and updates, no signing) measured between the signings.
LOAD_WINDOW_S = float(os.environ.get("SDNS_BENCH_LOAD_WINDOW_S", "20"))
TICK = os.sysconf("SC_CLK_TCK")
# Signatures each replica's whole-zone signing keeps in flight (--zone-signer-threads);
# empty: the replicas' default, one per core they may run on (taskset narrows it).
SIGNER_THREADS = os.environ.get("SDNS_BENCH_SIGNER_THREADS", "")
# Incremental re-signing at scale: with a window (seconds), the cluster is started with
# signatures due for re-signing 30 s after the first signing began (validity one day,
# `--resign-after-s 30`, a slice every 2 s), and after `cluster up` the probe and the
# updates run for this long while the slices re-sign the zone; no second whole-zone
# signing then.
RESIGN_WINDOW_S = float(os.environ.get("SDNS_BENCH_RESIGN_WINDOW_S", "0"))
# The zone key's DNSSEC algorithm, for the cluster's threshold key (`--algorithm`) and
# dnssec-signzone's ordinary key alike: 8 (RSASHA256 2048, the default), 10, 13 or 15.
ALGORITHM = int(os.environ.get("SDNS_BENCH_ALGORITHM", "8"))
KEYGEN_ARGS = {8: ["-a", "RSASHA256", "-b", "2048"], 10: ["-a", "RSASHA512", "-b", "2048"], 13: ["-a", "ECDSAP256SHA256"], 15: ["-a", "ED25519"]}[ALGORITHM]


def zone_text(names):
    z = [f"$ORIGIN {ZONE}.", "$TTL 300", f"@ IN SOA ns0.{ZONE}. hostmaster.{ZONE}. ( 1 3600 900 604800 300 )"]
    for i in range(4):
        z += [f"@ IN NS ns{i}.{ZONE}.", f"ns{i} IN A 127.0.0.1"]
    z += ["@ IN MX 10 mail", "www IN A 192.0.2.80", "www IN AAAA 2001:db8::80", "mail IN A 192.0.2.25"]
    for i in range(names):
        z += [f"h{i} IN A 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", f"h{i} IN AAAA 2001:db8::{i:x}", f"h{i} IN MX 10 mail"]
    return "\n".join(z) + "\n"


def children_cpu():
    r = os.times()
    return r.children_user + r.children_system


def dnssec_signzone(zone_file, work):
    """CPU seconds and wall seconds of dnssec-signzone with a plain key of ALGORITHM."""
    keydir = os.path.join(work, "plainkeys")
    os.makedirs(keydir, exist_ok=True)
    key = subprocess.run([f"{BIND}/bin/dnssec-keygen", "-q", "-K", keydir] + KEYGEN_ARGS + ["-f", "KSK", ZONE], check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(keydir, key + ".key")) as f:
        dnskey = f.read()
    signed_in = os.path.join(work, "plain.in")
    with open(zone_file) as f, open(signed_in, "w") as out:
        out.write(f.read() + dnskey)
    before, t0 = children_cpu(), time.monotonic()
    subprocess.run([f"{BIND}/bin/dnssec-signzone", "-q", "-n", "1", "-z", "-d", work, "-K", keydir, "-o", ZONE, "-f", os.path.join(work, "plain.signed"), signed_in, os.path.join(keydir, key)], check=True, capture_output=True)
    return children_cpu() - before, time.monotonic() - t0


def encode_name(name):
    out = b""
    for label in name.strip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def proc_cpu(pid, with_children):
    """CPU seconds of a process (utime + stime, and its reaped children's when asked)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[0] is the state (field 3); utime is field 14, stime 15, cutime 16, cstime 17.
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def named_pid(sdns_pid):
    try:
        for task in os.listdir(f"/proc/{sdns_pid}/task"):
            with open(f"/proc/{sdns_pid}/task/{task}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/comm") as c:
                        if c.read().strip() == "named":
                            return int(child)
    except OSError:
        pass
    return None


def replica_cpu(pids):
    out = []
    for pid in pids:
        total = proc_cpu(pid, True)
        npid = named_pid(pid)
        if npid:
            total += proc_cpu(npid, False)
        out.append(total)
    return out


def replica_parts(pid):
    """One replica's CPU seconds split: the sdns process itself, the children it reaped
    (dnssec-signzone, named-compilezone), and its named."""
    own = proc_cpu(pid, False)
    npid = named_pid(pid)
    return [own, proc_cpu(pid, True) - own, proc_cpu(npid, False) if npid else 0.0]


def probe(port, stop, answers, state):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2.0)
    qid = 0
    while not stop.is_set():
        sent = time.monotonic()
        qid = (qid + 1) & 0xFFFF
        s.sendto(struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 0) + encode_name(f"www.{ZONE}") + struct.pack(">HH", 1, 1), ("127.0.0.1", port))
        try:
            while True:
                data, _ = s.recvfrom(4096)
                if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
                    if data[3] & 0x0F == 0:
                        answers.append(time.monotonic())
                    break
        except socket.timeout:
            state["unanswered"] += 1
        rest = 0.05 - (time.monotonic() - sent)
        if rest > 0:
            time.sleep(rest)


def updater(port, key, stop, acks):
    k = 0
    while not stop.is_set():
        k += 1
        script = f"server 127.0.0.1 {port}\nzone {ZONE}\nupdate add bench-{k}.{ZONE} 300 A 192.0.2.{k % 250}\nsend\n"
        t0 = time.monotonic()
        r = subprocess.run([f"{BIND}/bin/nsupdate", "-t", "30", "-k", key], input=script, capture_output=True, text=True)
        acks.append((time.monotonic() - t0, r.returncode == 0, t0))
        stop.wait(2.0)


def metric(port, name):
    try:
        text = subprocess.run(["curl", "-s", "-m", "5", f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


def max_gap(points, start, end):
    if not points:
        return None
    inside = [start] + [t for t in points if start <= t <= end] + [end]
    return max(b - a for a, b in zip(inside, inside[1:]))


def largest_gaps(points, start, end, count=3):
    """The `count` largest gaps between probe answers in [start, end], as (length, UTC time
    of its beginning), to be found in the replicas' logs."""
    inside = [start] + [t for t in points if start <= t <= end] + [end]
    offset = time.time() - time.monotonic()
    gaps = sorted(((b - a, a) for a, b in zip(inside, inside[1:])), reverse=True)[:count]
    return [(round(g, 3), time.strftime("%H:%M:%S", time.gmtime(a + offset)) + f".{int((a + offset) % 1 * 1000):03d}") for g, a in gaps]


def rounded(x):
    return None if x is None else round(x, 3)


def sign_zone_args(cdir, base):
    args = [SDNS, "sign-zone"]
    for i in range(4):
        args += ["--admin", f"127.0.0.1:{base + 301 + i}", "--token", os.path.join(cdir, f"replica-{i}/state/admin.token")]
    return args


def timed_sign_zone(cdir, base, pids):
    """Runs `sdns sign-zone` once: (start, end, CPU seconds per replica, install seconds
    per replica, whether it signed, its output)."""
    cpu0, parts0 = replica_cpu(pids), replica_parts(pids[0])
    start = time.monotonic()
    out = subprocess.run(sign_zone_args(cdir, base), capture_output=True, text=True)
    end = time.monotonic()
    cpu = [b - a for a, b in zip(cpu0, replica_cpu(pids))]
    timed_sign_zone.parts = [round(b - a, 2) for a, b in zip(parts0, replica_parts(pids[0]))]
    install = [metric(base + 301 + i, "sdns_zone_install_seconds") for i in range(4)]
    text = out.stdout + out.stderr
    return start, end, cpu, install, out.returncode == 0 and "signed at seq" in text, text


def installations(cdir):
    """Each replica's last "signed zone installed" log line, as its key=value fields:
    rounds, records changed during each (round_records), restart_ms, catch_up_ms."""
    out = []
    for i in range(4):
        fields = {}
        try:
            with open(os.path.join(cdir, f"replica-{i}/sdns.log")) as f:
                lines = [l for l in f if "signed zone installed" in l]
        except OSError:
            lines = []
        if lines:
            for part in lines[-1].split():
                if "=" in part:
                    k, v = part.split("=", 1)
                    fields[k] = v.strip('"')
        out.append({k: fields.get(k) for k in ("rounds", "round_records", "diff_from", "diff_ms", "restart_ms", "catch_up_ms")})
    return out


def slices(cdir, i=0):
    """Replica i's re-signing slices that re-signed something: (count, RRsets re-signed,
    mean and max ms each held its executor), from its log."""
    held, rrsets = [], 0
    try:
        with open(os.path.join(cdir, f"replica-{i}/sdns.log")) as f:
            for line in f:
                if "re-signing slice" not in line:
                    continue
                fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
                held.append(int(fields.get("ms", "0")))
                rrsets += int(fields.get("resigned", "0"))
    except OSError:
        pass
    return {"slices": len(held), "rrsets": rrsets, "mean_ms": round(sum(held) / len(held), 1) if held else None, "max_ms": max(held, default=None)}


def observed(kind, names, plain_cpu, start, end, cpu, answers, acks, state, install, ok, output, cdir=None):
    return {
        "installations": installations(cdir) if cdir else None,
        "names": names,
        "signing": kind,
        "ok": ok,
        "output": output.strip()[-200:],
        "dnssec_signzone_cpu_s": round(plain_cpu, 3),
        "wall_s": round(end - start, 2),
        "replica_cpu_s": [round(c, 2) for c in cpu],
        "cpu_ratio_mean": round(sum(cpu) / len(cpu) / plain_cpu, 2) if plain_cpu > 0 else None,
        "cpu_ratio_max": round(max(cpu) / plain_cpu, 2) if plain_cpu > 0 else None,
        "probe_answers_during": len([t for t in answers if start <= t <= end]),
        "probe_unanswered": state["unanswered"],
        "max_read_gap_s": rounded(max_gap(answers, start, end)),
        "largest_read_gaps_utc": largest_gaps(answers, start, end) if answers else None,
        # Before the installation (the last hold before `end`): the background part alone.
        "max_read_gap_before_install_s": rounded(max_gap(answers, start, end - max((x or 0.0) for x in install) - 0.5)) if end - start > 5 else None,
        "updates": len(acks),
        "updates_failed": len([1 for _, ok, _ in acks if not ok]),
        "max_update_ack_s": round(max((a for a, _, _ in acks), default=0.0), 3),
        "max_update_ack_before_install_s": round(max((a for a, _, t in acks if t + a < end - max((x or 0.0) for x in install) - 0.5), default=0.0), 3),
        "install_hold_s": install,
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "signer_threads": SIGNER_THREADS or "default",
        "cpus": len(os.sched_getaffinity(0)),
        "algorithm": ALGORITHM,
    }


def one_size(names, base, again):
    """The first signing (during `cluster up`: replica CPU since start, so start-up counts
    too) and, with `again`, a second whole-zone signing by `sdns sign-zone`."""
    work = tempfile.mkdtemp(prefix=f"sdns-bench-signing-{names}-")
    zone_file = os.path.join(work, "zone.db")
    with open(zone_file, "w") as f:
        f.write(zone_text(names))
    plain_cpu, _ = dnssec_signzone(zone_file, work)
    cdir = os.path.join(work, "cluster")
    ports = ["--client-port", str(base + 1), "--peer-port", str(base + 101), "--named-port", str(base + 201), "--metrics-port", str(base + 301)]
    up = [SDNS, "cluster", "up", "--replicas", "4", "--dir", cdir, "--bind-dir", BIND, "--zone-file", zone_file, "--sign-zone-interval-s", "1", "--algorithm", str(ALGORITHM)] + ports
    if SIGNER_THREADS:
        up += ["--zone-signer-threads", SIGNER_THREADS]
    if RESIGN_WINDOW_S > 0:
        up += ["--signature-validity-s", "86400", "--resign-after-s", "30", "--resign-slice-interval-s", "2"]
        again = False
    results = []
    stop, answers, acks, state = threading.Event(), [], [], {"unanswered": 0}
    threads = [
        threading.Thread(target=probe, args=(base + 1, stop, answers, state)),
        threading.Thread(target=updater, args=(base + 2, os.path.join(cdir, "tsig.key"), stop, acks)),
    ]
    try:
        cluster = subprocess.Popen(up, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threads[0].start()
        # The replicas answer (the unsigned zone) before the first signing is asked for.
        while not answers and cluster.poll() is None:
            time.sleep(0.05)
        start = time.monotonic()
        while not os.path.exists(os.path.join(cdir, "tsig.key")):
            time.sleep(0.05)
        threads[1].start()
        output = cluster.communicate()[0]
        end = time.monotonic()
        pids = [int(open(os.path.join(cdir, f"replica-{i}/sdns.pid")).read()) for i in range(4)]
        cpu = replica_cpu(pids)
        install = [metric(base + 301 + i, "sdns_zone_install_seconds") for i in range(4)]
        row = observed("first (cluster up; CPU since start)", names, plain_cpu, start, end, cpu, answers, list(acks), state, install, cluster.returncode == 0, output, cdir)
        row["replica0_cpu_sdns_children_named_s"] = [round(x, 2) for x in replica_parts(pids[0])]
        results.append(row)
        if RESIGN_WINDOW_S > 0:
            acks.clear()
            cpu0, start = replica_cpu(pids), time.monotonic()
            time.sleep(RESIGN_WINDOW_S)
            end = time.monotonic()
            cpu = [b - a for a, b in zip(cpu0, replica_cpu(pids))]
            row = observed(f"re-signing slices ({RESIGN_WINDOW_S:.0f} s window after cluster up)", names, plain_cpu, start, end, cpu, answers, list(acks), state, [None] * 4, True, "", None)
            row["slices_replica0"] = slices(cdir)
            results.append(row)
        if again:
            # What the load alone (probe and updates, no whole-zone signing) costs each
            # replica per second, over a window of its own: the signing rows below include it.
            time.sleep(1.0)
            cpu0, t0 = replica_cpu(pids), time.monotonic()
            time.sleep(LOAD_WINDOW_S)
            load_rate = [(b - a) / (time.monotonic() - t0) for a, b in zip(cpu0, replica_cpu(pids))]
            acks.clear()
            start, end, cpu, install, ok, text = timed_sign_zone(cdir, base, pids)
            row = observed("again (sdns sign-zone)", names, plain_cpu, start, end, cpu, answers, list(acks), state, install, ok, text, cdir)
            row["replica0_cpu_sdns_children_named_s"] = timed_sign_zone.parts
            row["load_only_cpu_per_s"] = [round(x, 4) for x in load_rate]
            results.append(row)
            # The same signing without the probe and the updates: the CPU of signing alone
            # (what the CPU bar compares), and the wall time on an otherwise idle cluster.
            stop.set()
            for t in threads:
                t.join()
            time.sleep(1.0)
            start, end, cpu, install, ok, text = timed_sign_zone(cdir, base, pids)
            row = observed("again, no load (sdns sign-zone)", names, plain_cpu, start, end, cpu, [], [], {"unanswered": 0}, install, ok, text, cdir)
            row["replica0_cpu_sdns_children_named_s"] = timed_sign_zone.parts
            results.append(row)
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        subprocess.run([SDNS, "cluster", "down", "--replicas", "4", "--dir", cdir], capture_output=True)
    return results


def main():
    args = sys.argv[1:]
    again_up_to = int(os.environ.get("SDNS_BENCH_AGAIN_UP_TO", "2000"))
    sizes = [int(a) for a in args] or [1000, 10000]
    base = int(os.environ.get("SDNS_BENCH_BASE_PORT", "46000"))
    rows = []
    for n in sizes:
        for r in one_size(n, base, n <= again_up_to):
            print(json.dumps(r), flush=True)
            rows.append(r)
    print(f"\nalgorithm {ALGORITHM}; load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("\n| names | signing | dnssec-signzone CPU | wall | CPU per replica | ratio mean / max | max read gap (before installing) | max update ack (before installing) | install hold | records changed per round; restart, catch-up (replica 0) |")
    print("|---:|---|---:|---:|---|---|---:|---:|---|---|")
    for r in rows:
        hold = ", ".join(f"{x:.2f}" if x is not None else "-" for x in r["install_hold_s"])
        i0 = (r.get("installations") or [{}])[0]
        rounds = f"{i0.get('round_records')}; {i0.get('restart_ms')} ms, {i0.get('catch_up_ms')} ms" if i0.get("rounds") else "-"
        print(f"| {r['names']} | {r['signing']} | {r['dnssec_signzone_cpu_s']} s | {r['wall_s']} s | {', '.join(str(c) for c in r['replica_cpu_s'])} s | {r['cpu_ratio_mean']}x / {r['cpu_ratio_max']}x | {r['max_read_gap_s']} s ({r['max_read_gap_before_install_s']} s) | {r['max_update_ack_s']} s ({r['max_update_ack_before_install_s']} s) | {hold} s | {rounds} |")


if __name__ == "__main__":
    main()
