"""Checks a recorded history of register operations for linearizability, one register (DNS
name) at a time, with the Wing-Gong-Lowe search (as Knossos and Porcupine do it).

A history is a list of operations, each a dict:

    {"id": 17, "proc": "plain-2", "f": "write" | "read", "key": "k3",
     "value": "v2-9" | None,          # written, or read (None: the name has no TXT)
     "start": 1.25, "end": 1.31,       # invocation and completion, seconds (end None: unknown)
     "outcome": "ok" | "fail" | "info",
     "client": "plain" | "voting", "via": 2}

Semantics, as Jepsen's:
- an `ok` operation took effect at one instant between its start and its end;
- a `fail` operation took no effect (the server said so: REFUSED, NOTAUTH, FORMERR);
- an `info` write may have taken effect at any instant after its start, or never (a timeout);
  an `info` read is dropped (it observed nothing anyone saw).

Every write writes a value no other write writes, so a read names the write it saw.
"""

import collections
import json
import sys

INFINITY = float("inf")


class Violation:
    """Why a register's history is not linearizable: the operation the search could not place,
    with the operations it overlaps, for a person to read."""

    def __init__(self, key, reason, ops):
        self.key = key
        self.reason = reason
        self.ops = ops

    def __str__(self):
        lines = [f"{self.key}: {self.reason}"]
        for op in sorted(self.ops, key=lambda o: o["start"])[:12]:
            end = "?" if op.get("end") is None else f"{op['end']:.4f}"
            lines.append(
                f"    {op['f']:5} {str(op.get('value')):>12} [{op['start']:.4f}, {end}] {op['outcome']} "
                f"by {op.get('proc')} via {op.get('client', 'plain')}@{op.get('via')}"
            )
        return "\n".join(lines)


def _relevant(ops):
    """Operations that constrain the register: ok reads, ok and info writes."""
    kept = []
    for op in ops:
        if op["f"] == "read" and op["outcome"] == "ok":
            kept.append(op)
        elif op["f"] == "write" and op["outcome"] in ("ok", "info"):
            kept.append(op)
    return kept


def check_register(key, ops, initial=None, max_states=2_000_000):
    """None if `ops` (one register's history) is linearizable, else a Violation."""
    ops = _relevant(ops)
    written = {op["value"] for op in ops if op["f"] == "write"}
    for op in ops:
        if op["f"] == "read" and op["value"] is not None and op["value"] not in written:
            return Violation(key, f"read {op['value']!r}, which no write wrote", [op])
    # Events: (time, 0 = call before 1 = return at equal times, index). An operation whose
    # end is unknown returns at infinity: it may be placed after everything, or (a write)
    # never matter.
    events = []
    for i, op in enumerate(ops):
        end = op["end"] if op["outcome"] == "ok" and op.get("end") is not None else INFINITY
        if end < op["start"]:
            return Violation(key, "an operation ends before it starts (clock error in the recorder)", [op])
        events.append((op["start"], 0, i))
        events.append((end, 1, i))
    events.sort()
    # A doubly linked list of the events still to place; index n is the head sentinel.
    n = len(events)
    head = n
    nxt = [p + 1 if p + 1 < n else None for p in range(n)] + [0 if n else None]
    prv = [p - 1 if p > 0 else head for p in range(n)] + [None]
    ret_at = {}
    for pos, (_, kind, i) in enumerate(events):
        if kind == 1:
            ret_at[i] = pos

    def unlink(pos):
        p, q = prv[pos], nxt[pos]
        nxt[p] = q
        if q is not None:
            prv[q] = p

    def relink(pos):
        p, q = prv[pos], nxt[pos]
        nxt[p] = pos
        if q is not None:
            prv[q] = pos

    # Info writes never need placing: once every ok operation is placed, the rest of the
    # history is linearizable (the info writes are put after it all, or dropped).
    must = sum(1 for op in ops if op["outcome"] == "ok")
    placed_ok = 0
    linearized = 0
    state = initial
    cache = set()
    stack = []
    pos = nxt[head]
    worst = None
    while True:
        if placed_ok == must:
            return None
        if pos is None:
            # Cannot happen while an ok operation is unplaced (its return event is here).
            return Violation(key, "search ran out of events", [])
        _, kind, i = events[pos]
        op = ops[i]
        if kind == 0:
            if op["f"] == "write":
                ok, new_state = True, op["value"]
            else:
                ok, new_state = op["value"] == state, state
            if ok:
                bits = linearized | (1 << i)
                seen = (bits, new_state)
                if seen not in cache:
                    if len(cache) >= max_states:
                        return Violation(key, f"search gave up after {max_states} states (history too concurrent)", [])
                    cache.add(seen)
                    stack.append((pos, state))
                    linearized = bits
                    state = new_state
                    if op["outcome"] == "ok":
                        placed_ok += 1
                    unlink(pos)
                    unlink(ret_at[i])
                    pos = nxt[head]
                    continue
            pos = nxt[pos]
        else:
            # A return whose operation is not placed: everything before it failed; undo one.
            if worst is None or len(stack) > worst[0]:
                worst = (len(stack), i)
            if not stack:
                blocked = ops[worst[1]] if worst else op
                overlapping = [o for o in ops if o["start"] <= (blocked.get("end") or INFINITY) and (o.get("end") or INFINITY) >= blocked["start"]]
                return Violation(key, f"no order of the operations explains this {blocked['f']} of {blocked.get('value')!r}", overlapping)
            top, state = stack.pop()
            _, _, j = events[top]
            linearized &= ~(1 << j)
            if ops[j]["outcome"] == "ok":
                placed_ok -= 1
            relink(ret_at[j])
            relink(top)
            pos = nxt[top]


def check(history):
    """Every register's verdict: a list of Violations (empty: linearizable)."""
    by_key = collections.defaultdict(list)
    for op in history:
        by_key[op["key"]].append(op)
    violations = []
    for key in sorted(by_key):
        v = check_register(key, by_key[key])
        if v is not None:
            violations.append(v)
    return violations


def lost_writes(history, final):
    """Acknowledged writes the end state contradicts: `final` maps key -> the value every
    replica holds at the end (None: absent). The final value must be written by some write,
    and that write must not have completed before an acknowledged write began (that write
    would then be later in real time and hold the register). A clearer message for the case
    the linearizability check of the final reads also catches."""
    by_key = collections.defaultdict(list)
    for op in history:
        if op["f"] == "write" and op["outcome"] in ("ok", "info"):
            by_key[op["key"]].append(op)
    lost = []
    for key, writes in sorted(by_key.items()):
        value = final.get(key)
        acked = [w for w in writes if w["outcome"] == "ok"]
        if not acked:
            continue
        winner = next((w for w in writes if w["value"] == value), None)
        if winner is None:
            lost.append((key, f"final value {value!r}, although {len(acked)} writes were acknowledged"))
            continue
        for w in acked:
            if w is not winner and winner["outcome"] == "ok" and winner["end"] < w["start"]:
                lost.append((key, f"acknowledged write {w['value']!r} (started {w['start']:.3f}) lost: the final {value!r} completed at {winner['end']:.3f}"))
                break
    return lost


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv):
    if len(argv) != 2:
        print("usage: linear.py HISTORY.jsonl", file=sys.stderr)
        return 2
    history = load(argv[1])
    violations = check(history)
    keys = len({op["key"] for op in history})
    print(f"{len(history)} operations on {keys} names: {len(violations)} not linearizable")
    for v in violations:
        print(v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
