#!/usr/bin/env python3
"""Writes (issue 27): TSIG-signed DNS UPDATEs per second through a 4-replica sdns cluster
against one stock named signing the same zone with its own key, same run, same clients.

For each algorithm (SDNS_BENCH_ALGORITHMS, default "13 8"):
  1. `sdns cluster up --algorithm A` (4 replicas, the zone below) and, beside it, one stock
     named (BENCH_NAMED, default Debian's /usr/sbin/named) serving the same zone under a
     `dnssec-policy` of the same algorithm (13: ECDSAP256SHA256 as BIND's `default`; 8:
     RSASHA256 2048; 15: ED25519), same TSIG key (the cluster's tsig.key).
  2. Phases, alternating so the box's load hits both: named, cluster, named (cluster again
     with SDNS_BENCH_ROUNDS=2 ...). Each phase: C client processes (SDNS_BENCH_CLIENTS,
     default 8) each sending one UPDATE at a time (add a fresh name's A record, over UDP),
     for S seconds (SDNS_BENCH_SECONDS, default 15); then one client for S seconds (p50 of
     an unloaded write). Cluster clients spread over the replicas (client i to replica
     i mod 4), the single client talks to replica 0.
  Every answer is checked: same ID, opcode UPDATE, rcode NOERROR, a TSIG record whose MAC
  verifies with the key and the request's MAC. Anything else counts as an error.
  Recorded per phase: updates/s, p50/p99 ms, errors, the load average, and the CPU seconds
  of every process involved (each replica's sdns and its named, or the stock named) from
  /proc, so CPU per update can be compared; at the cluster's last phase its metrics page.

Output: one JSON object per phase on stdout, then a markdown table with the ratios
(cluster/s x n / named/s, p50 cluster / p50 named; named's figure the mean of the phases
around the cluster's).
Needs SDNS_BIN (release build), SDNS_BIND_DIR (for dig and the cluster's named).
"""

import base64
import hashlib
import hmac
import json
import multiprocessing
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDNS = os.environ.get("SDNS_BIN", os.path.join(ROOT, "target/release/sdns"))
BIND = os.environ.get("SDNS_BIND_DIR", os.path.join(ROOT, "target/bind9"))
NAMED = os.environ.get("BENCH_NAMED", "/usr/sbin/named")
ZONE = "example.test"
N = 4
TICK = os.sysconf("SC_CLK_TCK")
HASHES = {"hmac-sha256": hashlib.sha256, "hmac-sha512": hashlib.sha512, "hmac-sha1": hashlib.sha1, "hmac-md5": hashlib.md5}
# The baseline's policy per algorithm: one combined key (as the cluster's one threshold key),
# BIND's default lifetimes otherwise.
POLICY_ALGORITHM = {8: "rsasha256 2048", 10: "rsasha512 2048", 13: "ecdsap256sha256", 15: "ed25519"}


# --- DNS wire and TSIG (RFC 2136, RFC 8945) -----------------------------------------------------


def wire_name(name):
    out = b""
    for label in name.strip(".").lower().split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def read_key(path):
    """(name, algorithm, secret bytes) of the first key in a BIND key file."""
    text = open(path).read()
    name = re.search(r'key\s+"([^"]+)"', text).group(1)
    algorithm = re.search(r"algorithm\s+([A-Za-z0-9-]+)\s*;", text).group(1).lower()
    secret = base64.b64decode(re.search(r'secret\s+"([^"]+)"', text).group(1))
    return name, algorithm, secret


def tsig_variables(key, now, error=0, other=b""):
    name, algorithm, _ = key
    return wire_name(name) + struct.pack(">HI", 255, 0) + wire_name(algorithm) + struct.pack(">HIHHH", now >> 32, now & 0xFFFFFFFF, 300, error, len(other)) + other


def update_message(key, qid, owner, address):
    """One UPDATE adding `owner 300 IN A address`, TSIG-signed: (wire, request MAC)."""
    name, algorithm, secret = key
    header = struct.pack(">HHHHHH", qid, 5 << 11, 1, 0, 1, 0)
    body = wire_name(ZONE) + struct.pack(">HH", 6, 1)
    body += wire_name(owner) + struct.pack(">HHIH", 1, 1, 300, 4) + socket.inet_aton(address)
    now = int(time.time())
    mac = hmac.new(secret, header + body + tsig_variables(key, now), HASHES[algorithm]).digest()
    rdata = wire_name(algorithm) + struct.pack(">HIHH", now >> 32, now & 0xFFFFFFFF, 300, len(mac)) + mac + struct.pack(">HHH", qid, 0, 0)
    tsig = wire_name(name) + struct.pack(">HHIH", 250, 255, 0, len(rdata)) + rdata
    return struct.pack(">HHHHHH", qid, 5 << 11, 1, 0, 1, 1) + body + tsig, mac


def skip_name(msg, i):
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += 1 + n


def check_answer(key, qid, request_mac, msg):
    """None if `msg` is a NOERROR UPDATE answer to `qid` whose TSIG verifies, else why not."""
    if len(msg) < 12:
        return "short answer"
    rid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", msg[:12])
    if rid != qid or not flags & 0x8000 or (flags >> 11) & 0xF != 5:
        return "not the answer to this update"
    if flags & 0xF:
        return f"rcode {flags & 0xF}"
    if ar == 0:
        return "answer without TSIG"
    i = 12
    for _ in range(qd):
        i = skip_name(msg, i) + 4
    for _ in range(an + ns + ar - 1):
        i = skip_name(msg, i) + 10
        i += struct.unpack(">H", msg[i - 2 : i])[0]
    start = i
    i = skip_name(msg, i)
    rtype, _, _, rdlen = struct.unpack(">HHIH", msg[i : i + 10])
    if rtype != 250:
        return "last record is not TSIG"
    rd = msg[i + 10 : i + 10 + rdlen]
    j = skip_name(rd, 0)
    hi, lo, _fudge, macsize = struct.unpack(">HIHH", rd[j : j + 10])
    mac = rd[j + 10 : j + 10 + macsize]
    _orig, error, olen = struct.unpack(">HHH", rd[j + 10 + macsize : j + 16 + macsize])
    if error:
        return f"TSIG error {error}"
    other = rd[j + 16 + macsize : j + 16 + macsize + olen]
    unsigned = msg[:10] + struct.pack(">H", ar - 1) + msg[12:start]
    data = struct.pack(">H", len(request_mac)) + request_mac + unsigned + tsig_variables(key, (hi << 32) | lo, error, other)
    if not hmac.compare_digest(hmac.new(key[2], data, HASHES[key[1]]).digest(), mac):
        return "answer's TSIG does not verify"
    return None


def client(port, key_path, prefix, until, out):
    """One client: one UPDATE at a time to 127.0.0.1:port until `until` (time.time())."""
    key = read_key(key_path)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5.0)
    lat, errors, k = [], [], 0
    qid = os.getpid() & 0xFFFF
    while time.time() < until:
        k += 1
        qid = (qid + 1) & 0xFFFF
        wire, mac = update_message(key, qid, f"{prefix}-{k}.{ZONE}", f"192.0.2.{k % 250 + 1}")
        t0 = time.monotonic()
        s.sendto(wire, ("127.0.0.1", port))
        try:
            while True:
                data, _ = s.recvfrom(65535)
                if len(data) >= 2 and struct.unpack(">H", data[:2])[0] == qid:
                    break
            why = check_answer(key, qid, mac, data)
        except socket.timeout:
            why = "timeout (5 s)"
        except (struct.error, IndexError) as e:
            why = f"malformed answer: {e}"
        if why is None:
            lat.append(time.monotonic() - t0)
        else:
            errors.append(why)
    out.put((lat, errors))


def run_clients(ports, key_path, tag, seconds):
    """len(ports) clients for `seconds`: (updates/s, latencies sorted, errors)."""
    q = multiprocessing.Queue()
    until = time.time() + seconds
    procs = [multiprocessing.Process(target=client, args=(p, key_path, f"{tag}-c{i}", until, q)) for i, p in enumerate(ports)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    lat = sorted(x for r in results for x in r[0])
    errors = [e for r in results for e in r[1]]
    return len(lat) / wall, lat, errors


def pct(lat, p):
    return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000, 2) if lat else None


# --- processes and their CPU ------------------------------------------------------------------


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, TypeError):
        return 0.0


def child_named(pid):
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for c in f.read().split():
                    if open(f"/proc/{c}/comm").read().strip() == "named":
                        return int(c)
    except OSError:
        pass
    return None


def cpu_of(pids):
    return {k: proc_cpu(p) for k, p in pids.items()}


def zone_text():
    z = [f"$ORIGIN {ZONE}.", "$TTL 300", f"@ IN SOA ns0.{ZONE}. hostmaster.{ZONE}. ( 1 3600 900 604800 300 )"]
    for i in range(N):
        z += [f"@ IN NS ns{i}.{ZONE}.", f"ns{i} IN A 127.0.0.1"]
    z += ["@ IN MX 10 mail", "www IN A 192.0.2.80", "www IN AAAA 2001:db8::80", "mail IN A 192.0.2.25"]
    return "\n".join(z) + "\n"


def dig_has(port, rtype, want):
    r = subprocess.run([f"{BIND}/bin/dig", "+tries=1", "+time=1", "+dnssec", "-p", str(port), "@127.0.0.1", ZONE, rtype], capture_output=True, text=True)
    return want in r.stdout


def start_named(work, algorithm, key_path, port):
    """Stock named, the zone under a dnssec-policy of `algorithm`; returns its Popen once the
    zone is signed (DNSKEY and SOA's RRSIG served)."""
    d = os.path.join(work, "named")
    os.makedirs(os.path.join(d, "keys"))
    with open(os.path.join(d, "zone.db"), "w") as f:
        f.write(zone_text())
    shutil.copy(key_path, os.path.join(d, "tsig.key"))
    keyname = read_key(key_path)[0]
    with open(os.path.join(d, "named.conf"), "w") as f:
        f.write(f"""include "{d}/tsig.key";
options {{
	directory "{d}";
	pid-file "{d}/named.pid";
	session-keyfile "{d}/session.key";
	listen-on port {port} {{ 127.0.0.1; }};
	listen-on-v6 {{ none; }};
	recursion no;
	dnssec-validation no;
	notify no;
	answer-cookie no;
}};
controls {{ }};
dnssec-policy "bench" {{
	keys {{ csk lifetime unlimited algorithm {POLICY_ALGORITHM[algorithm]}; }};
}};
zone "{ZONE}" {{
	type primary;
	file "{d}/zone.db";
	key-directory "{d}/keys";
	dnssec-policy "bench";
	serial-update-method increment;
	update-policy {{ grant "{keyname}" zonesub ANY; }};
}};
""")
    # Two worker threads, as the replicas' named run (named-glue's Supervisor: -n 2).
    p = subprocess.Popen([NAMED, "-g", "-4", "-n", "2", "-c", os.path.join(d, "named.conf")], stdout=open(os.path.join(d, "named.log"), "w"), stderr=subprocess.STDOUT)
    for _ in range(300):
        if dig_has(port, "DNSKEY", "RRSIG\tDNSKEY") and dig_has(port, "SOA", "RRSIG\tSOA"):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.2)
    p.kill()
    sys.exit(f"bench: stock named did not serve a signed zone; see {d}/named.log")


def load():
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]]


def histograms(metrics_port):
    """Replica's latency histograms' (count, sum) by name, from its metrics page."""
    out = {}
    if metrics_port is None:
        return out
    text = subprocess.run(["curl", "-s", "-m", "5", f"http://127.0.0.1:{metrics_port}/metrics"], capture_output=True, text=True).stdout
    for line in text.splitlines():
        for name in ("sdns_signing_latency_seconds", "sdns_ordering_latency_seconds"):
            for part, idx in (("_count", 0), ("_sum", 1)):
                if line.startswith(name + part):
                    out.setdefault(name, [0.0, 0.0])[idx] += float(line.split()[-1])
    return out


def phase(kind, algorithm, ports, single_port, key_path, tag, seconds, pids, metrics_port=None, others=None):
    """Both loads on one side; `others`: the idle side's processes, whose CPU is recorded apart."""
    rows = []
    for use in (ports, [single_port]):
        cpu0, l0, h0, o0 = cpu_of(pids), load(), histograms(metrics_port), cpu_of(others or {})
        rate, lat, errors = run_clients(use, key_path, f"{tag}-{len(use)}", seconds)
        cpu = {k: round(v - cpu0[k], 2) for k, v in cpu_of(pids).items()}
        idle_cpu = round(sum(cpu_of(others or {}).values()) - sum(o0.values()), 2)
        h1 = histograms(metrics_port)
        acked = len(lat)
        row = {
            "kind": kind, "algorithm": algorithm, "clients": len(use), "seconds": seconds, "tag": tag,
            "updates_per_s": round(rate, 1), "acked": acked, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "errors": len(errors), "error_kinds": sorted(set(errors))[:5],
            "cpu_s": cpu, "idle_side_cpu_s": idle_cpu, "cpu_ms_per_update": round(sum(cpu.values()) * 1000 / acked, 2) if acked else None,
            "load_before": l0, "load_after": load(), "utc": time.strftime("%H:%M:%S", time.gmtime()),
        }
        # Replica 0's view: threshold signatures per acknowledged update and their mean latency
        # (named's request to the signature), and the ordering's mean latency.
        for name, short in (("sdns_signing_latency_seconds", "signing"), ("sdns_ordering_latency_seconds", "ordering")):
            if name in h0 and name in h1:
                count, total = h1[name][0] - h0[name][0], h1[name][1] - h0[name][1]
                row[f"{short}_count_replica0"] = int(count)
                row[f"{short}_mean_ms_replica0"] = round(total * 1000 / count, 2) if count else None
        if acked and "signing_count_replica0" in row:
            row["signatures_per_update"] = round(row["signing_count_replica0"] / acked, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def one_algorithm(algorithm, clients, seconds, rounds, base):
    work = tempfile.mkdtemp(prefix=f"sdns-bench-writes-{algorithm}-")
    zone_file = os.path.join(work, "zone.db")
    with open(zone_file, "w") as f:
        f.write(zone_text())
    cdir = os.path.join(work, "cluster")
    up = [SDNS, "cluster", "up", "--replicas", str(N), "--dir", cdir, "--bind-dir", BIND, "--zone-file", zone_file, "--algorithm", str(algorithm),
          "--client-port", str(base + 1), "--peer-port", str(base + 101), "--named-port", str(base + 201), "--metrics-port", str(base + 301)]
    named = None
    rows = []
    try:
        r = subprocess.run(up, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench: cluster up failed:\n{r.stdout}{r.stderr}")
        key_path = os.path.join(cdir, "tsig.key")
        sdns_pids = [int(open(os.path.join(cdir, f"replica-{i}/sdns.pid")).read()) for i in range(N)]
        cpids = {}
        for i, p in enumerate(sdns_pids):
            cpids[f"sdns{i}"] = p
            cpids[f"named{i}"] = child_named(p)
        named = start_named(work, algorithm, key_path, base + 500)
        npids = {"named": named.pid}
        cports = [base + 1 + i % N for i in range(clients)]
        for r_ in range(rounds):
            rows += phase("named", algorithm, [base + 500] * clients, base + 500, key_path, f"n{algorithm}r{r_}", seconds, npids, None, cpids)
            rows += phase("cluster", algorithm, cports, base + 1, key_path, f"c{algorithm}r{r_}", seconds, cpids, base + 301, npids)
        rows += phase("named", algorithm, [base + 500] * clients, base + 500, key_path, f"n{algorithm}r{rounds}", seconds, npids, None, cpids)
        text = subprocess.run(["curl", "-s", "-m", "5", f"http://127.0.0.1:{base + 301}/metrics"], capture_output=True, text=True).stdout
        with open(os.path.join(ROOT, "target", f"bench-writes-metrics-{algorithm}.txt"), "w") as f:
            f.write(text)
    finally:
        if named:
            named.terminate()
            named.wait()
        subprocess.run([SDNS, "cluster", "down", "--replicas", str(N), "--dir", cdir], capture_output=True)
        if os.environ.get("SDNS_BENCH_KEEP", "0") != "1":
            shutil.rmtree(work, ignore_errors=True)
    return rows


def summary(rows):
    print("\n| algorithm | clients | named updates/s (load) | cluster updates/s (load) | cluster x 4 / named | p50 named / cluster ms | p99 named / cluster ms | p50 cluster / named | CPU ms per update named / cluster | errors |")
    print("|---|---:|---|---|---:|---|---|---:|---|---:|")
    for algorithm in sorted({r["algorithm"] for r in rows}, reverse=True):
        for c in sorted({r["clients"] for r in rows}, reverse=True):
            sel = [r for r in rows if r["algorithm"] == algorithm and r["clients"] == c]
            nm = [r for r in sel if r["kind"] == "named"]
            cl = [r for r in sel if r["kind"] == "cluster"]
            if not nm or not cl:
                continue
            mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
            nrate, crate = mean(nm, "updates_per_s"), mean(cl, "updates_per_s")
            np50, cp50 = mean(nm, "p50_ms"), mean(cl, "p50_ms")
            fmt = lambda rs, k: " / ".join(f"{r[k]}" for r in rs)
            lds = lambda rs: ", ".join(f"{r['load_before'][0]:.1f}" for r in rs)
            print(f"| {algorithm} | {c} | {fmt(nm, 'updates_per_s')} ({lds(nm)}) | {fmt(cl, 'updates_per_s')} ({lds(cl)}) | {crate * N / nrate:.2f} | {np50:.2f} / {cp50:.2f} | {mean(nm, 'p99_ms'):.2f} / {mean(cl, 'p99_ms'):.2f} | {cp50 / np50:.1f} | {mean(nm, 'cpu_ms_per_update'):.2f} / {mean(cl, 'cpu_ms_per_update'):.2f} | {sum(r['errors'] for r in sel)} |")


def main():
    algorithms = [int(a) for a in os.environ.get("SDNS_BENCH_ALGORITHMS", "13 8").split()]
    clients = int(os.environ.get("SDNS_BENCH_CLIENTS", "8"))
    seconds = float(os.environ.get("SDNS_BENCH_SECONDS", "15"))
    rounds = int(os.environ.get("SDNS_BENCH_ROUNDS", "1"))
    # Below the kernel's ephemeral range (32768-60999), so no outgoing connection holds a port.
    base = int(os.environ.get("SDNS_BENCH_BASE_PORT", "23000"))
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} uptime: {open('/proc/loadavg').read().strip()}; {os.cpu_count()} cpus; sdns {SDNS}; named {NAMED}", flush=True)
    rows = []
    for a in algorithms:
        rows += one_algorithm(a, clients, seconds, rounds, base)
    summary(rows)


if __name__ == "__main__":
    main()
