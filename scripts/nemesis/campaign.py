#!/usr/bin/env python3
"""A Jepsen-style campaign against a real sdns cluster: clients record every operation (its
invocation, completion and result) while a nemesis kills, stops, restarts and skews replicas
and, for the whole run, up to t replicas run a Byzantine mode; then the history is checked
for linearizability per name, the voting client's goals G1 and G2, lost acknowledged updates
and identical zones.

Each name kN.hist.example.test is a register: its CNAME target. A write is an RFC 2136 add
of a CNAME, which replaces the name's CNAME (a singleton type), so one update is one atomic
register write, from nsupdate and from `sdns update` alike. Each write's target is unique.

    scripts/nemesis/campaign.py --replicas 4 --seconds 60 --seed 7 --out /tmp/run
    scripts/nemesis/campaign.py --replicas 7 --byzantine 2:equivocate --seconds 3600 ...
    scripts/nemesis/campaign.py --scenario view-change --seconds 45 --out /tmp/vc

A --scenario replaces the random nemesis by one fault at a known moment (scenario.py: a
view change, a state transfer, a whole-zone signing), and a watcher notes what the replicas
report (views, state transfers, signings) beside the nemesis's actions, for plot.py.

Exit status 0 when every check passes, 1 when one fails (the report says which), 2 when the
campaign could not run (a cluster that did not start). Everything it learns is in --out:
history.jsonl, nemesis.jsonl, report.json, and the replicas' logs.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import linear  # noqa: E402
import scenario  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ZONE = "example.test"
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
TOOLS = {"dig": "dig", "nsupdate": "nsupdate"}


def use_tools(bind_dir):
    """BIND's own dig and nsupdate from the patched build, as the system tests use them."""
    for tool in TOOLS:
        path = os.path.join(bind_dir, "bin", tool)
        if os.access(path, os.X_OK):
            TOOLS[tool] = path


def free_base(n, rng):
    """A base port with base+1.., +101.., +201.., +301.. free for n replicas (UDP and TCP),
    below Linux's ephemeral range."""
    for _ in range(500):
        base = 20000 + rng.randrange(31) * 400
        ok = True
        for off in (1, 101, 201, 301):
            for i in range(n):
                for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                    s = socket.socket(socket.AF_INET, kind)
                    try:
                        s.bind(("127.0.0.1", base + off + i))
                    except OSError:
                        ok = False
                    finally:
                        s.close()
        if ok:
            return base
    raise SystemExit("no free block of ports")


class Cluster:
    def __init__(self, args, base):
        self.n = args.replicas
        self.t = (self.n - 1) // 3
        self.base = base
        self.dir = args.dir
        self.sdns = args.sdns
        self.up_args = [
            self.sdns, "cluster", "up", "--bits", "1024", "--replicas", str(self.n), "--dir", self.dir,
            "--bind-dir", args.bind_dir,
            "--client-port", str(base + 1), "--peer-port", str(base + 101),
            "--named-port", str(base + 201), "--metrics-port", str(base + 301),
        ]
        if args.byzantine:
            self.up_args += ["--byzantine", args.byzantine]
        self.up_args += args.up_extra
        self.byzantine = [int(a.split(":")[0]) for a in args.byzantine.split(",")] if args.byzantine else []
        self.bug_env = {"SDNS_SEEDED_BUG": args.seeded_bug} if args.seeded_bug else {}

    def client_port(self, i):
        return self.base + 1 + i

    def metrics_port(self, i):
        return self.base + 301 + i

    def up(self, env=None):
        full = dict(os.environ, **self.bug_env, **(env or {}))
        out = subprocess.run(self.up_args, capture_output=True, text=True, env=full, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"cluster up failed:\n{out.stdout}{out.stderr}")

    def down(self):
        subprocess.run([self.sdns, "cluster", "down", "--replicas", str(self.n), "--dir", self.dir], capture_output=True, timeout=120)

    def pids(self, i):
        """(sdns pid, named pid) of replica i, or None for what does not run."""
        def read(path):
            try:
                return int(open(path).read().strip())
            except (OSError, ValueError):
                return None
        return read(os.path.join(self.dir, f"replica-{i}", "sdns.pid")), read(os.path.join(self.dir, f"replica-{i}", "state", "named", "named.pid"))

    def kill9(self, i):
        sdns, _ = self.pids(i)
        if sdns:
            try:
                os.kill(sdns, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and alive(sdns):
                time.sleep(0.05)
        try:
            os.remove(os.path.join(self.dir, f"replica-{i}", "sdns.pid"))
        except OSError:
            pass

    def signal_both(self, i, sig):
        for pid in self.pids(i):
            if pid:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


class Recorder:
    """The history: every operation, appended as it completes (thread-safe)."""

    def __init__(self, path, t0):
        self.t0 = t0
        self.ops = []
        self.lock = threading.Lock()
        self.file = open(path, "w")

    def now(self):
        return time.monotonic() - self.t0

    def add(self, op):
        with self.lock:
            op["id"] = len(self.ops)
            self.ops.append(op)
            self.file.write(json.dumps(op) + "\n")
            self.file.flush()


def name(k):
    return f"k{k}.hist.{ZONE}."


def cname_targets(text):
    """The CNAME targets in dig-style answer lines."""
    targets = []
    for line in text.splitlines():
        parts = line.split()
        if not line.startswith(";") and len(parts) >= 5 and parts[3] == "CNAME":
            targets.append(parts[4])
    return targets


def plain_read(c, via, key, timeout):
    try:
        out = subprocess.run(
            [TOOLS["dig"], "@127.0.0.1", "-p", str(c.client_port(via)), "+tries=1", f"+time={timeout}", "+norec", name(key), "CNAME", "+noall", "+comments", "+answer"],
            capture_output=True, text=True, timeout=timeout + 5,
        )
    except subprocess.TimeoutExpired:
        return "info", None
    text = out.stdout
    if "status: NXDOMAIN" in text:
        return "ok", None
    if "status: NOERROR" in text:
        targets = cname_targets(text)
        return ("ok", targets[0] if targets else None) if len(targets) <= 1 else ("info", None)
    if "status:" in text:
        return "fail", None
    return "info", None


def plain_write(c, via, key, value, keyfile, timeout):
    commands = f"server 127.0.0.1 {c.client_port(via)}\nzone {ZONE}\nupdate add {name(key)} 60 CNAME {value}\nsend\n"
    try:
        out = subprocess.run([TOOLS["nsupdate"], "-v", "-t", str(timeout), "-k", keyfile], input=commands, capture_output=True, text=True, timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        return "info"
    if out.returncode == 0:
        return "ok"
    said = out.stdout + out.stderr
    if any(f"update failed: {code}" in said for code in ("REFUSED", "NOTAUTH", "FORMERR", "NOTZONE", "YXDOMAIN", "NXRRSET")):
        return "fail"
    return "info"


def replicas_arg(c):
    return ",".join(f"127.0.0.1:{c.client_port(i)}" for i in range(c.n))


def voting_read(c, key, timeout):
    try:
        out = subprocess.run([c.sdns, "query", "--replicas", replicas_arg(c), name(key), "CNAME"], capture_output=True, text=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        return "info", None
    if out.returncode != 0:
        return "info", None
    targets = cname_targets(out.stdout)
    if "NXDOMAIN" in out.stdout and not targets:
        return "ok", None
    if len(targets) == 1:
        return "ok", targets[0]
    if not targets and "NOERROR" in out.stdout:
        return "ok", None
    return "info", None


def voting_write(c, key, value, keyfile, timeout):
    try:
        out = subprocess.run(
            [c.sdns, "update", "--replicas", replicas_arg(c), "--zone", ZONE, "-k", keyfile, "add", name(key), "60", "CNAME", value],
            capture_output=True, text=True, timeout=timeout + 10,
        )
    except subprocess.TimeoutExpired:
        return "info"
    return {0: "ok", 1: "fail"}.get(out.returncode, "info")


def client(c, rec, proc, kind, rng, keys, stop, keyfile, live, reads):
    n = 0
    while not stop.is_set():
        key = rng.randrange(keys)
        via = rng.choice(live()) if kind == "plain" else None
        start = rec.now()
        if rng.random() < reads:
            if kind == "plain":
                outcome, value = plain_read(c, via, key, 3)
            else:
                outcome, value = voting_read(c, key, 6)
            rec.add({"proc": proc, "client": kind, "via": via, "f": "read", "key": f"k{key}", "value": value, "start": start, "end": rec.now(), "outcome": outcome})
        else:
            n += 1
            value = f"v{proc}-{n}.t.{ZONE}."
            if kind == "plain":
                outcome = plain_write(c, via, key, value, keyfile, 4)
            else:
                outcome = voting_write(c, key, value, keyfile, 8)
            end = rec.now()
            rec.add({"proc": proc, "client": kind, "via": via, "f": "write", "key": f"k{key}", "value": value, "start": start, "end": end if outcome != "info" else None, "outcome": outcome})
        time.sleep(rng.uniform(0, 0.05))


class Nemesis:
    """Faults at random moments, never more than t faulty replicas at once (a Byzantine
    replica counts for the whole run)."""

    def __init__(self, c, rec, rng, faults, log_path, interval, victims):
        self.c, self.rec, self.rng, self.faults = c, rec, rng, faults
        self.victims = victims or list(range(c.n))
        self.log = open(log_path, "w")
        self.interval = interval
        self.down = {}  # replica -> what is wrong with it
        self.failures = []
        self.lock = threading.Lock()

    def note(self, what, replica, **more):
        entry = {"time": self.rec.now(), "what": what, "replica": replica, **more}
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()
        print(f"  nemesis {entry['time']:7.1f}s: {what} replica {replica}", flush=True)

    def healthy(self):
        """Where plain clients go: a plain client's guarantees hold only through an honest
        replica (the paper's G1'/G2'), so never a Byzantine one nor one the nemesis holds."""
        with self.lock:
            return [i for i in range(self.c.n) if i not in self.down and i not in self.c.byzantine]

    def run(self, stop):
        budget = self.c.t - len(self.c.byzantine)
        while not stop.wait(self.rng.uniform(0.5, 1.5) * self.interval):
            if budget <= 0 or not self.faults:
                continue
            if len(self.down) >= budget:
                self.heal_one()
                continue
            candidates = [i for i in self.victims if i not in self.down and i not in self.c.byzantine]
            if not candidates:
                continue
            victim = self.rng.choice(candidates)
            fault = self.rng.choice(self.faults)
            self.inflict(victim, fault)
        self.heal_all()

    def inflict(self, i, fault):
        with self.lock:
            self.down[i] = fault
        if fault == "kill":
            self.c.kill9(i)
        elif fault == "stop":
            self.c.signal_both(i, signal.SIGSTOP)
        elif fault == "skew":
            # A clock two hours ahead (sdns and its named), by a restart under libfaketime.
            self.c.kill9(i)
            if not self.restart(i, {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": "+2h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}):
                return
        self.note(fault, i)

    def restart(self, i, env=None):
        """`cluster up` for the stopped replica; a replica that does not come back is a
        finding (noted, and counted in the report), not the end of the campaign."""
        try:
            self.c.up(env)
            return True
        except Exception as e:  # noqa: BLE001
            self.failures.append(f"replica {i} did not come back: {str(e).strip().splitlines()[-1]}")
            self.note("restart failed", i, error=str(e).strip().splitlines()[-1])
            return False

    def heal_one(self):
        with self.lock:
            if not self.down:
                return
            i = self.rng.choice(sorted(self.down))
            fault = self.down[i]
        if fault == "stop":
            self.c.signal_both(i, signal.SIGCONT)
        elif fault in ("kill", "skew"):
            self.c.kill9(i)
            if not self.restart(i):
                return
        with self.lock:
            del self.down[i]
        self.note("heal " + fault, i)

    def heal_all(self):
        for _ in range(5 * self.c.n):
            if not self.down:
                return
            self.heal_one()


def axfr(c, i, transfer_key):
    out = subprocess.run(
        [TOOLS["dig"], "@127.0.0.1", "-p", str(c.client_port(i)), "+norec", "+time=5", "+tries=2", "-k", transfer_key, ZONE, "AXFR", "+nocmd", "+nostats", "+nocomments"],
        capture_output=True, text=True, timeout=60,
    )
    lines = [l for l in out.stdout.splitlines() if l.strip() and not l.startswith(";") and l.split()[3:4] != ["TSIG"]]
    return sorted(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keys", type=int, default=6, help="registers (names); fewer means more contention")
    p.add_argument("--reads", type=float, default=0.5, help="fraction of operations that are reads")
    p.add_argument("--plain", type=int, default=4, help="dig/nsupdate client processes")
    p.add_argument("--voting", type=int, default=1, help="voting client (sdns query/update) processes")
    p.add_argument("--faults", default="kill,stop,skew", help="nemesis faults, comma-separated: kill, stop, skew; none (or empty) for none")
    p.add_argument("--interval", type=float, default=8.0, help="mean seconds between nemesis actions")
    p.add_argument("--victims", default="", help="replicas the nemesis may fault, comma-separated (default: any honest one)")
    p.add_argument("--byzantine", default="", help="ID:MODE,... replicas Byzantine for the whole run (counted against t)")
    p.add_argument("--seeded-bug", default="", help="test the checker: skip-write@ID or early-read@ID (see docs/RELIABILITY.md)")
    p.add_argument("--scenario", default="", choices=[""] + sorted(scenario.SCENARIOS),
                   help="one fault at a known moment instead of the random nemesis (scenario.py); --faults is ignored")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory (replica logs) for inspection")
    p.add_argument("--out", default=None, help="directory for history, report and logs (default: a new temporary one)")
    p.add_argument("--sdns", default=os.environ.get("SDNS_BIN", os.path.join(ROOT, "target", "debug", "sdns")))
    p.add_argument("--bind-dir", default=os.environ.get("SDNS_BIND_DIR", os.path.join(ROOT, "target", "bind9")))
    args = p.parse_args()
    rng = random.Random(args.seed)
    use_tools(args.bind_dir)
    args.out = args.out or tempfile.mkdtemp(prefix="sdns-nemesis-")
    os.makedirs(args.out, exist_ok=True)
    args.dir = tempfile.mkdtemp(prefix="sdns-nemesis-cluster-")
    faults = [f for f in args.faults.split(",") if f and f != "none"]
    args.up_extra = scenario.up_args(args.scenario, args.out, args.replicas) if args.scenario else []
    if "skew" in faults and not os.path.exists(FAKETIME_LIB):
        print(f"no {FAKETIME_LIB} (Debian's faketime package): leaving out clock skew", file=sys.stderr)
        faults.remove("skew")
    c = Cluster(args, free_base(args.replicas, rng))
    print(f"nemesis campaign: {args.replicas} replicas, {args.seconds:.0f} s, seed {args.seed}, "
          f"{'scenario ' + args.scenario if args.scenario else 'faults ' + str(faults or 'none')}, "
          f"byzantine {args.byzantine or 'none'}, seeded bug {args.seeded_bug or 'none'}; cluster in {args.dir}; out {args.out}", flush=True)
    try:
        c.up()
    except Exception as e:  # noqa: BLE001
        print(e, file=sys.stderr)
        c.down()
        return 2
    keyfile = os.path.join(args.dir, "tsig.key")
    rec = Recorder(os.path.join(args.out, "history.jsonl"), time.monotonic())
    nemesis = Nemesis(c, rec, random.Random(rng.random()), faults, os.path.join(args.out, "nemesis.jsonl"), args.interval,
                      [int(v) for v in args.victims.split(",") if v])
    watcher = None
    if args.scenario:
        nemesis.run = scenario.SCENARIOS[args.scenario](nemesis, args.seconds)
        watcher = scenario.Watcher(c, nemesis)
        threading.Thread(target=watcher.run, daemon=True).start()
    stop = threading.Event()
    threads = []
    for k in range(args.plain + args.voting):
        kind = "plain" if k < args.plain else "voting"
        t = threading.Thread(target=client, args=(c, rec, f"{kind[0]}{k}", kind, random.Random(rng.random()), args.keys, stop, keyfile, nemesis.healthy, args.reads), daemon=True)
        t.start()
        threads.append(t)
    nemesis_stop = threading.Event()
    nt = threading.Thread(target=nemesis.run, args=(nemesis_stop,), daemon=True)
    nt.start()
    time.sleep(args.seconds)
    nemesis_stop.set()
    nt.join()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    if watcher:
        watcher.stop.set()
    # Healed: each replica's final answer for every name is a read in the history too (a lost
    # write shows as a read that cannot be placed), after the cluster has settled.
    settle_until = time.monotonic() + 60
    final = {}
    for key in range(args.keys):
        for i in range(c.n):
            if i in c.byzantine:
                continue
            while True:
                start = rec.now()
                outcome, value = plain_read(c, i, key, 3)
                if outcome == "ok" or time.monotonic() > settle_until:
                    break
                time.sleep(0.5)
            rec.add({"proc": "final", "client": "plain", "via": i, "f": "read", "key": f"k{key}", "value": value, "start": start, "end": rec.now(), "outcome": outcome})
            if outcome == "ok":
                final.setdefault(f"k{key}", value)
    transfer_key = os.path.join(args.dir, "transfer.key")
    # Every honest replica's zone, taken again (all of them) until they agree or a minute
    # has passed: a replica just healed may still be catching up.
    honest = [i for i in range(c.n) if i not in c.byzantine]
    agree_until = time.monotonic() + 60
    while True:
        zones = {i: axfr(c, i, transfer_key) for i in honest}
        if (len({tuple(z) for z in zones.values()}) == 1 and all(zones.values())) or time.monotonic() > agree_until:
            break
        time.sleep(2)
    for i, zone in zones.items():
        with open(os.path.join(args.out, f"zone-{i}.txt"), "w") as f:
            f.write("\n".join(zone) + "\n")
    c.down()
    for i in range(c.n):
        log = os.path.join(args.dir, f"replica-{i}", "sdns.log")
        if os.path.exists(log):
            shutil.copy(log, os.path.join(args.out, f"replica-{i}.log"))

    history = rec.ops
    violations = linear.check(history)
    lost = linear.lost_writes(history, final)
    voting = [op for op in history if op["client"] == "voting"]
    g2 = [op for op in voting if op["outcome"] == "info"]
    distinct_zones = {tuple(z) for z in zones.values()}
    counts = {}
    for op in history:
        counts[f"{op['client']} {op['f']} {op['outcome']}"] = counts.get(f"{op['client']} {op['f']} {op['outcome']}", 0) + 1
    report = {
        "replicas": c.n, "seconds": args.seconds, "seed": args.seed, "faults": faults, "byzantine": args.byzantine,
        "seeded_bug": args.seeded_bug, "operations": len(history), "counts": counts,
        "nemesis_actions": sum(1 for _ in open(os.path.join(args.out, "nemesis.jsonl"))),
        "linearizability_violations": [str(v) for v in violations],
        "lost_acknowledged_writes": [f"{k}: {why}" for k, why in lost],
        "g2_unanswered_voting_requests": len(g2),
        "zones_identical": len(distinct_zones) == 1 and all(zones.values()),
        "zone_lines": {i: len(z) for i, z in zones.items()},
        "replicas_not_back": nemesis.failures,
        "scenario": args.scenario,
        "scenario_missing": watcher.missing(args.scenario) if watcher else [],
        "load1_at_end": float(open("/proc/loadavg").read().split()[0]),
    }
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"{len(history)} operations ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}); "
          f"{report['nemesis_actions']} nemesis actions")
    print(f"linearizability violations: {len(violations)}; lost acknowledged writes: {len(lost)}; "
          f"voting requests unanswered (G2): {len(g2)} of {len(voting)}; zones identical: {report['zones_identical']}")
    for v in violations[:5]:
        print(v)
    for k, why in lost[:5]:
        print(f"lost: {k}: {why}")
    for f in nemesis.failures:
        print(f"nemesis: {f}")
    for m in report["scenario_missing"]:
        print(f"scenario: {m}")
    passed = not violations and not lost and not g2 and report["zones_identical"] and not nemesis.failures and not report["scenario_missing"]
    print("PASS" if passed else "FAIL", f"(history and report in {args.out})")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
