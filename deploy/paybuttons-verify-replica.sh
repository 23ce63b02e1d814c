#!/usr/bin/env bash
# Restores the newest copy of the database from the Litestream replica into a temporary
# directory and checks it (docs/litestream.md, "Verification"). Prints one line; on a failure
# it starts with "REPLICA VERIFICATION FAILED:" and the exit status is 1.
#
#   paybuttons-verify-replica [-config /etc/paybuttons/litestream.yml]
#
# Reads PAYBUTTONS_DB and LITESTREAM_REPLICA_URL, as litestream.yml does. On the primary it
# also fails when the replica is more than MAX_LAG (60) Litestream transactions, about a
# minute of writes, behind this host.
set -euo pipefail
config=/etc/paybuttons/litestream.yml
if [ "${1:-}" = -config ]; then config=$2; fi
max_lag=${MAX_LAG:-60}
: "${PAYBUTTONS_DB:?}" "${LITESTREAM_REPLICA_URL:?}"

fail() { echo "REPLICA VERIFICATION FAILED: $*" >&2 && exit 1; }
work=$(mktemp -d "${TMPDIR:-/var/tmp}/paybuttons-verify.XXXXXX")
trap 'rm -rf "$work"' EXIT

# This host's position, read before the restore so that the restore can only be newer: a
# txid on the primary, none on a standby (no database).
status=$(litestream status -config "$config" -json "$PAYBUTTONS_DB" 2>&1) ||
	fail "litestream status: $status"
here=$(grep -o '"local_txid": *"[0-9a-f]\{16\}"' <<<"$status" | grep -o '[0-9a-f]\{16\}' || true)

summary=$(litestream restore -config "$config" -integrity-check full -json \
	-o "$work/paybuttons.db" "$PAYBUTTONS_DB" 2>"$work/log") ||
	fail "litestream restore: $(tail -2 "$work/log" | tr '\n' ' ')"
txid=$(grep -o '"txid": *"[0-9a-f]\{16\}"' <<<"$summary" | grep -o '[0-9a-f]\{16\}') ||
	fail "litestream restore printed no txid: $summary"
check=$(paybuttons check -db "$work/paybuttons.db" 2>&1) || fail "paybuttons check: $check"

if [ -n "$here" ] && [ $((16#$here - 16#$txid)) -gt "$max_lag" ]; then
	fail "the replica (txid $txid) is $((16#$here - 16#$txid)) transactions behind" \
		"this host ($here)"
fi
echo "replica verified: txid $txid${here:+ (this host: $here)}, integrity ok, paybuttons check ok"
