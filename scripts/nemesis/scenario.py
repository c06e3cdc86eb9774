"""Scenarios for campaign.py's --scenario: one fault at a known moment of the run, for latency
plotted over time (plot.py), and a watcher that notes what the replicas report while it runs.

- view-change: `kill -9` of the primary (and its named) a third into the run, a restart at two
  thirds. The backups suspect it and install the next view.
- state-transfer: checkpoints every 8 batches and 16 retained (`--checkpoint-interval`,
  `--retained-batches`); SIGSTOP of a backup (its sdns and named) a quarter into the run,
  SIGCONT at half: by then its peers have moved far past what they retain, so it catches up by
  fetching a checkpoint's state.
- sign-zone: a zone of 1,000 hosts (A, AAAA, MX: about 3,000 RRsets with the NSEC chain);
  `sdns sign-zone` asked of every replica a quarter into the run (a whole-zone signing,
  allowed at once by `--sign-zone-interval-s 1`), which runs in the background while clients go on;
  the run lasts until `sdns sign-zone` answers (the signed zone installed), at least --seconds.

The watcher polls every replica's /status four times a second and notes a new view (and its
primary), a state transfer begun and installed, and a whole-zone signing begun and installed,
each at the time it first saw it; a scenario whose event was never seen is a failed run
(`scenario_missing` in the report), so a plot cannot claim a view change that did not happen.
"""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

ZONE_HOSTS = 1000
# The longest a whole-zone signing may take before the scenario counts it as failed.
SIGN_ZONE_LIMIT_S = 900


def zone_file(path, n, hosts):
    """The demo zone plus `hosts` names, each with A, AAAA and MX."""
    z = ["$ORIGIN example.test.", "$TTL 300", "@ IN SOA ns0.example.test. hostmaster.example.test. ( 1 3600 900 604800 300 )"]
    for i in range(n):
        z += [f"@ IN NS ns{i}.example.test.", f"ns{i} IN A 127.0.0.1"]
    z += ["@ IN MX 10 mail", "www IN A 192.0.2.80", "mail IN A 192.0.2.25"]
    for i in range(hosts):
        z += [f"h{i} IN A 10.0.{i >> 8}.{i & 255}", f"h{i} IN AAAA 2001:db8::{i:x}", f"h{i} IN MX 10 mail"]
    with open(path, "w") as f:
        f.write("\n".join(z) + "\n")


def up_args(name, out, n=4):
    """What `sdns cluster up` needs besides the campaign's own flags."""
    if name == "state-transfer":
        return ["--checkpoint-interval", "8", "--retained-batches", "16"]
    if name == "sign-zone":
        path = os.path.join(out, "zone.db")
        zone_file(path, n, ZONE_HOSTS)
        return ["--zone-file", path, "--sign-zone-interval-s", "1"]
    return []


def status(c, i, timeout=0.5):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port(i)}/status", timeout=timeout) as r:
            return json.loads(r.read())
    except Exception:  # noqa: BLE001 (a stopped or killed replica does not answer)
        return None


def primary(c):
    """The primary as the replicas report it (the most common answer)."""
    seen = [s["primary"] for s in (status(c, i, 2) for i in range(c.n)) if s]
    return max(set(seen), key=seen.count) if seen else 0


def view_change(nem, seconds):
    def run(stop):
        if not stop.wait(seconds / 3):
            p = primary(nem.c)
            with nem.lock:
                nem.down[p] = "kill"
            nem.c.kill9(p)
            nem.fault_at = nem.rec.now()
            nem.note("kill", p, label=f"kill -9 primary {p}")
            if not stop.wait(seconds / 3):
                nem.note("restart", p, label=f"restart {p}")
        nem.heal_all()
    return run


def state_transfer(nem, seconds):
    def run(stop):
        if not stop.wait(seconds / 4):
            p = primary(nem.c)
            b = (p + 2) % nem.c.n
            with nem.lock:
                nem.down[b] = "stop"
            nem.c.signal_both(b, signal.SIGSTOP)
            nem.fault_at = nem.rec.now()
            nem.note("stop", b, label=f"SIGSTOP backup {b}")
            stop.wait(seconds / 4)
        nem.heal_all()
    return run


def sign_zone(nem, seconds):
    def run(stop):
        if not stop.wait(seconds / 4):
            c = nem.c
            cmd = [c.sdns, "sign-zone"]
            for i in range(c.n):
                cmd += ["--admin", f"127.0.0.1:{c.metrics_port(i)}", "--token", os.path.join(c.dir, f"replica-{i}", "state", "admin.token")]
            nem.fault_at = nem.rec.now()
            nem.note("sign-zone", None, label="sdns sign-zone asked")
            try:
                # The clients go on until the signing is installed, however long the run was
                # meant to be: the plot shows the whole of it.
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=SIGN_ZONE_LIMIT_S)
                said = (out.stdout + out.stderr).strip().splitlines()
                nem.note("sign-zone answered", None, label="sign-zone answered", exit=out.returncode, said=said[-1] if said else "")
                if out.returncode != 0:
                    nem.failures.append("sdns sign-zone failed: " + " | ".join(said[-3:]))
                # The clients' latency after the installation too (the run's time may be up).
                time.sleep(min(10, seconds / 4))
            except subprocess.TimeoutExpired:
                nem.failures.append("sdns sign-zone did not answer")
        nem.heal_all()
    return run


SCENARIOS = {"view-change": view_change, "state-transfer": state_transfer, "sign-zone": sign_zone}
# What the watcher must have seen for each scenario's run to count.
EXPECTED = {"view-change": "view installed", "state-transfer": "state transfer installed", "sign-zone": "zone signing installed"}


class Watcher:
    """Notes, into the nemesis log, what the replicas report as it changes."""

    def __init__(self, c, nem):
        self.c, self.nem = c, nem
        self.stop = threading.Event()
        self.seen = []  # (what, time)

    def observed(self, what, replica, **more):
        self.seen.append((what, self.nem.rec.now()))
        self.nem.note(what, replica, observed=True, **more)

    def run(self):
        last = {}
        view = None
        while not self.stop.wait(0.25):
            for i in range(self.c.n):
                s = status(self.c, i, 0.3)
                if not s:
                    continue
                before = last.get(i)
                last[i] = s
                if view is None:
                    view = s["view"]
                elif s["view"] > view:
                    view = s["view"]
                    self.observed("view installed", i, view=view, primary=s["primary"], label=f"view {view} (primary {s['primary']})")
                if before is None:
                    continue
                if s.get("state_transfer") is not None and before.get("state_transfer") is None:
                    self.observed("state transfer begun", i, checkpoint=s["state_transfer"], label=f"replica {i} fetches checkpoint {s['state_transfer']}")
                if s.get("state_transfers", 0) > before.get("state_transfers", 0):
                    self.observed("state transfer installed", i, label=f"replica {i} installed the state")
                if s.get("zone_signing") and not before.get("zone_signing"):
                    self.observed("zone signing begun", i, total=s["zone_signing"].get("total"), label=f"signing begun at {i}")
                if s.get("zone_signings", 0) > before.get("zone_signings", 0):
                    self.observed("zone signing installed", i, label=f"signed zone installed at {i}")

    def missing(self, scenario):
        """The scenario's event, unless a replica reported it after the fault (a view change
        at start-up does not count)."""
        want, at = EXPECTED.get(scenario), getattr(self.nem, "fault_at", None)
        if at is None:
            return [f"{scenario}: the fault was never made"]
        return [] if any(what == want and t >= at for what, t in self.seen) else [f"{scenario}: no replica reported '{want}' after the fault"]
