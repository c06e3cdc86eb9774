#!/usr/bin/env bash
# Latency under faults, plotted over time: one campaign per scenario (scripts/nemesis/scenario.py:
# a view change, a state transfer, a whole-zone signing) on a 4-replica cluster with plain and
# voting clients, each history checked as every campaign's is, then one PNG per scenario.
#
#   SDNS_BIND_DIR=/path/to/patched/bind9 scripts/nemesis/fault-plots.sh
#
# Environment (defaults in brackets): FAULT_PLOTS_SCENARIOS ["view-change state-transfer
# sign-zone"], FAULT_PLOTS_SECONDS [45], FAULT_PLOTS_SEED [1], FAULT_PLOTS_OUT
# [target/fault-plots/<UTC time>], FAULT_PLOTS_PNG_DIR [docs/plots], SDNS_BIN [target/release/sdns
# if built, else target/debug/sdns]. Writes FAULT_PLOTS_PNG_DIR/faults-<scenario>.png; exits 1 if a
# campaign's checks failed (its plot is written all the same, saying so in its title).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/nemesis
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${SDNS_BIN:-}" ]; then
  SDNS_BIN=$TARGET/release/sdns
  [ -x "$SDNS_BIN" ] || SDNS_BIN=$TARGET/debug/sdns
fi
export SDNS_BIN
SCENARIOS=${FAULT_PLOTS_SCENARIOS:-"view-change state-transfer sign-zone"}
SECONDS_EACH=${FAULT_PLOTS_SECONDS:-45}
SEED=${FAULT_PLOTS_SEED:-1}
OUT=${FAULT_PLOTS_OUT:-$ROOT/target/fault-plots/$(date -u +%Y%m%dT%H%MZ)}
PNG_DIR=${FAULT_PLOTS_PNG_DIR:-$ROOT/docs/plots}
# Debian's matplotlib is seen by /usr/bin/python3 only (not by a pyenv or venv python3).
PLOT_PY=python3
python3 -c 'import matplotlib' 2>/dev/null || PLOT_PY=/usr/bin/python3
"$PLOT_PY" -c 'import matplotlib' 2>/dev/null || { echo "fault-plots: python3-matplotlib missing (scripts/install-deps.sh)" >&2; exit 2; }
[ -x "$SDNS_BIN" ] || { echo "fault-plots: no sdns at $SDNS_BIN (cargo build --release -p sdns)" >&2; exit 2; }
mkdir -p "$OUT" "$PNG_DIR"
echo "fault-plots: sdns $SDNS_BIN; output in $OUT; $(uptime)"
status=0
for s in $SCENARIOS; do
  python3 "$HERE/campaign.py" --scenario "$s" --replicas 4 --seconds "$SECONDS_EACH" --seed "$SEED" --out "$OUT/$s"
  rc=$?
  [ "$rc" = 0 ] || status=1
  if [ -f "$OUT/$s/report.json" ]; then
    "$PLOT_PY" "$HERE/plot.py" "$OUT/$s" --png "$PNG_DIR/faults-$s.png" || status=1
  else
    echo "fault-plots: $s left no report (exit $rc)" >&2
  fi
done
echo "fault-plots: done ($(uptime)); exit $status"
exit $status
