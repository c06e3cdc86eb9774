"""Tests of the linearizability checker: hand-made histories, and random small histories
checked against a brute-force search over every order (`python3 -m unittest` in this folder)."""

import itertools
import random
import unittest

import linear


def w(value, start, end, outcome="ok", key="k"):
    return {"f": "write", "key": key, "value": value, "start": start, "end": end, "outcome": outcome, "proc": "p"}


def r(value, start, end, outcome="ok", key="k"):
    return {"f": "read", "key": key, "value": value, "start": start, "end": end, "outcome": outcome, "proc": "p"}


class HandMade(unittest.TestCase):
    def ok(self, ops):
        self.assertIsNone(linear.check_register("k", ops))

    def bad(self, ops):
        self.assertIsNotNone(linear.check_register("k", ops))

    def test_sequential(self):
        self.ok([r(None, 0, 1), w("a", 2, 3), r("a", 4, 5), w("b", 6, 7), r("b", 8, 9)])

    def test_stale_read_after_acknowledged_write(self):
        # The seeded "read before its barrier": a read that starts after b was acknowledged sees a.
        self.bad([w("a", 0, 1), w("b", 2, 3), r("a", 4, 5)])

    def test_concurrent_read_may_see_either(self):
        self.ok([w("a", 0, 1), w("b", 2, 6), r("a", 3, 4), r("b", 5, 7)])
        self.ok([w("a", 0, 1), w("b", 2, 6), r("b", 3, 4)])

    def test_reads_may_not_go_back(self):
        # Both reads overlap the write, but once one saw b a later one cannot see a.
        self.bad([w("a", 0, 1), w("b", 2, 10), r("b", 3, 4), r("a", 5, 6)])

    def test_read_of_a_value_never_written(self):
        self.bad([w("a", 0, 1), r("zzz", 2, 3)])

    def test_lost_write(self):
        # The seeded "skip one write": acknowledged b, then reads keep seeing a.
        self.bad([w("a", 0, 1), w("b", 2, 3), r("a", 10, 11)])

    def test_info_write_may_apply_late_or_never(self):
        self.ok([w("a", 0, 1), w("b", 2, None, "info"), r("a", 3, 4), r("b", 9, 10)])
        self.ok([w("a", 0, 1), w("b", 2, None, "info"), r("a", 3, 4), r("a", 9, 10)])
        # ...but not before it was invoked.
        self.bad([w("a", 0, 1), r("b", 2, 3), w("b", 4, None, "info")])

    def test_failed_write_takes_no_effect(self):
        self.bad([w("a", 0, 1), w("b", 2, 3, "fail"), r("b", 4, 5)])

    def test_failed_and_info_reads_are_ignored(self):
        self.ok([w("a", 0, 1), r("zzz", 2, 3, "info"), r(None, 4, 5, "fail"), r("a", 6, 7)])

    def test_initial_absence(self):
        self.ok([r(None, 0, 1), w("a", 2, 3)])
        self.bad([w("a", 0, 1), r(None, 2, 3)])

    def test_whole_history_by_key(self):
        history = [w("a", 0, 1, key="x"), r("a", 2, 3, key="x"), w("a2", 0, 1, key="y"), w("b2", 2, 3, key="y"), r("a2", 4, 5, key="y")]
        violations = linear.check(history)
        self.assertEqual([v.key for v in violations], ["y"])
        self.assertIn("a2", str(violations[0]))

    def test_lost_writes_against_the_final_state(self):
        history = [w("a", 0, 1), w("b", 2, 3), w("c", 4, None, "info")]
        self.assertEqual(linear.lost_writes(history, {"k": "b"}), [])
        self.assertEqual(linear.lost_writes(history, {"k": "c"}), [])
        self.assertEqual(len(linear.lost_writes(history, {"k": "a"})), 1)
        self.assertEqual(len(linear.lost_writes(history, {"k": None})), 1)


def brute_force(ops):
    """Linearizable by trying every order of the relevant operations (small histories only)."""
    ops = [op for op in ops if (op["f"] == "read" and op["outcome"] == "ok") or (op["f"] == "write" and op["outcome"] in ("ok", "info"))]
    must = [op for op in ops if op["outcome"] == "ok"]
    optional = [op for op in ops if op["outcome"] != "ok"]
    for k in range(len(optional) + 1):
        for chosen in itertools.combinations(optional, k):
            placed = must + list(chosen)
            for order in itertools.permutations(placed):
                end = lambda op: op["end"] if op["outcome"] == "ok" else float("inf")
                # Real time: if a ended before b started, a comes first.
                if any(end(order[j]) < order[i]["start"] for i in range(len(order)) for j in range(i + 1, len(order))):
                    continue
                state, good = None, True
                for op in order:
                    if op["f"] == "write":
                        state = op["value"]
                    elif op["value"] != state:
                        good = False
                        break
                if good:
                    return True
    return False


class AgainstBruteForce(unittest.TestCase):
    def test_random_small_histories(self):
        rng = random.Random(20261127)
        disagreements = []
        verdicts = {True: 0, False: 0}
        for case in range(1500):
            ops = []
            values = []
            for i in range(rng.randint(1, 6)):
                start = rng.randint(0, 12)
                end = start + rng.randint(0, 6)
                outcome = rng.choice(["ok", "ok", "ok", "info", "fail"])
                if rng.random() < 0.45:
                    value = f"v{i}"
                    values.append(value)
                    ops.append(w(value, start, None if outcome == "info" else end, outcome))
                else:
                    seen = rng.choice(values + [None]) if values else None
                    ops.append(r(seen, start, end, outcome))
            expected = brute_force(ops)
            got = linear.check_register("k", ops) is None
            verdicts[expected] += 1
            if expected != got:
                disagreements.append((case, ops, expected))
        self.assertEqual(disagreements[:3], [])
        # The generator makes both kinds, so the comparison means something.
        self.assertGreater(verdicts[True], 100)
        self.assertGreater(verdicts[False], 100)


if __name__ == "__main__":
    unittest.main()
