#!/usr/bin/env bash
# Restores the newest copy of the paybuttons database from its Litestream replica
# into a temporary directory and proves it usable; exits 1 with a line starting
# "REPLICA VERIFICATION FAILED" on stderr when it is not. deploy/paybuttons-verify.timer
# runs it through deploy/paybuttons-verify.service; run it by hand the same way:
#
#   PAYBUTTONS_DB=/var/lib/paybuttons/paybuttons.db LITESTREAM_REPLICA_URL=s3://... \
#     paybuttons-verify-replica [-config /etc/paybuttons/litestream.yml]
#
# Checks, in order:
#   1. litestream restore -integrity-check full succeeds (every page and index of
#      the restored file read back by SQLite's PRAGMA integrity_check);
#   2. paybuttons check says ok (the same check through the service's own binary,
#      which also refuses a file that is not a paybuttons database);
#   3. when this host runs the primary (its Litestream state is here), the replica
#      is at most MAX_LAG transactions behind it (default 60: Litestream makes at
#      most one a second, so about a minute). A replica that stopped receiving
#      (bucket unreachable, credentials expired) fails here while writes go on.
set -euo pipefail

config=/etc/paybuttons/litestream.yml
if [ "${1:-}" = -config ]; then
	config=$2
fi
max_lag=${MAX_LAG:-60}
: "${PAYBUTTONS_DB:?set PAYBUTTONS_DB, as for litestream.yml}"
: "${LITESTREAM_REPLICA_URL:?set LITESTREAM_REPLICA_URL, as for litestream.yml}"

fail() {
	printf 'REPLICA VERIFICATION FAILED: %s\n' "$*" >&2
	exit 1
}

work=$(mktemp -d "${TMPDIR:-/var/tmp}/paybuttons-verify.XXXXXX")
trap 'rm -rf "$work"' EXIT

# This host's position, read before the restore so that the restore can only be
# newer. Status "ok" with a local txid on the primary; "no database" on a standby.
status=$(litestream status -config "$config" -json "$PAYBUTTONS_DB" 2>&1) ||
	fail "litestream status: $status"
local_txid=$(grep -Eo '"local_txid": *"[0-9a-f]{16}"' <<<"$status" | grep -Eo '[0-9a-f]{16}' || true)

restored="$work/paybuttons.db"
if ! summary=$(litestream restore -config "$config" -integrity-check full -json -o "$restored" "$PAYBUTTONS_DB" 2>"$work/restore.log"); then
	fail "litestream restore from $LITESTREAM_REPLICA_URL: $(tail -3 "$work/restore.log" | tr '\n' ' ')"
fi
restored_txid=$(grep -Eo '"txid": *"[0-9a-f]+"' <<<"$summary" | grep -Eo '[0-9a-f]{16}') ||
	fail "litestream restore printed no txid: $summary"

if ! check=$(paybuttons check -db "$restored" 2>&1); then
	fail "paybuttons check of the restored copy: $check"
fi

if [ -n "$local_txid" ]; then
	lag=$((16#$local_txid - 16#$restored_txid))
	[ "$lag" -le "$max_lag" ] ||
		fail "the replica is $lag transactions behind this host (txid $restored_txid, local $local_txid; at most $max_lag allowed)"
	echo "replica verified: restored txid $restored_txid (this host: $local_txid), integrity ok, paybuttons check ok"
else
	echo "replica verified: restored txid $restored_txid, integrity ok, paybuttons check ok (no local primary to compare with)"
fi
