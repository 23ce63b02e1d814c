#!/usr/bin/env bash
# Measures what the L0 files that litestream.yml keeps for 7 days weigh: one create
# a second for 30 s (one L0 file per create), then one client as fast as it goes for
# 10 s (many creates per L0 file). docs/litestream.md, "Retention", computes the
# cost of l0-retention from these sizes.
#
#   docs/litestream-l0-size.sh
set -euo pipefail
source "$(dirname "$0")/litestream-lib.sh"
find_binaries

# l0: "files bytes" of the L0 files on the replica.
l0() { "$LS" ltx -config "$CONFIG" -level 0 "$PAYBUTTONS_DB" | awk 'NR > 1 { n++; b += $4 } END { print n + 0, b + 0 }'; }

use_site "$TMP/host"
start_primary "$TMP/primary.log"
KEY=$(new_key)
wait_log "$TMP/primary.log" 'msg="snapshot complete"'
say "$(load)"

read -r n0 b0 < <(l0)
for i in $(seq 30); do
	create "slow-$i" >/dev/null
	sleep 1
done
sleep 3
read -r n1 b1 < <(l0)
say "one create a second for 30 s: $((n1 - n0)) L0 files, $((b1 - b0)) bytes, $(((b1 - b0) / (n1 - n0))) bytes per file"

c=0
end=$((SECONDS + 10))
while [ "$SECONDS" -lt "$end" ]; do
	create "fast-$c" >/dev/null
	c=$((c + 1))
done
sleep 3
read -r n2 b2 < <(l0)
say "one client as fast as it goes for 10 s: $c creates, $((n2 - n1)) L0 files, $((b2 - b1)) bytes, $(((b2 - b1) / c)) bytes per create"
stop "$LS_PID"
STARTED=()
