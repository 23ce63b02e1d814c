#!/usr/bin/env bash
# The Litestream drill for paybuttons: every step of docs/litestream.md, run for
# real against a file replica in a temporary directory, with the repository's
# litestream.yml and the command lines of deploy/paybuttons.service.
#
#   docs/litestream-drill.sh
#
# Uses litestream from $LITESTREAM or PATH (else installs v0.5.18 into the
# temporary directory) and builds paybuttons from this checkout (or $PAYBUTTONS).
# Takes about a minute. Prints a summary; exits 1 if any check failed.
#
#  1. steady state: host A runs `litestream replicate -exec "paybuttons serve"`;
#     batch 1 is written, a moment T is noted, batch 2 is written, then a client
#     keeps creating until host A is lost: both processes killed with SIGKILL.
#  2. restore to a new path from the replica, paybuttons check, serve it, compare.
#  3. point-in-time restore to T: batch 1 is there, batch 2 is not.
#  4. standby takeover: host B, with no database, starts the same command line;
#     -restore-if-db-not-exists restores, it serves, takes writes, replicates them.
#  5. shutdown: SIGTERM to host B; paybuttons stops at once and, Litestream having
#     the file open, leaves the WAL in place; the next start has every write.
#  6. verification: deploy/paybuttons-verify-replica.sh passes on the replica, and
#     fails loudly on a replica with a damaged file.
#  7. rollback: the copy as of T is put in place of host B's database, host B starts
#     and takes writes; the newest copy on the replica is T's state plus those writes.
set -euo pipefail
source "$(dirname "$0")/litestream-lib.sh"

BATCH=${BATCH:-50}
RESULTS=()
FAILED=0
# result OK|FAIL TEXT: one line of the summary.
result() {
	RESULTS+=("$(printf '%-4s %s' "$1" "$2")")
	say "  -> $1: $2"
	[ "$1" = OK ] || FAILED=1
}
expect() { # expect WHAT GOT WANT
	if [ "$2" = "$3" ]; then result OK "$1: $2"; else result FAIL "$1: got $2, want $3"; fi
}
# count_in FILE_OF_IDS FILE: how many of the ids in FILE_OF_IDS are in FILE.
count_in() { grep -cxFf "$1" "$2" || true; }

find_binaries
say "paybuttons built with $(go version "$PB" | cut -d' ' -f2), litestream $("$LS" version), replica file://$TMP/replica; $(load)"

say ""
say "== 1. steady state on host A, then host A is lost (kill -9)"
use_site "$TMP/hostA"
start_primary "$TMP/hostA.log"
KEY=$(new_key)
wait_log "$TMP/hostA.log" 'msg="snapshot complete"'
for i in $(seq "$BATCH"); do create "batch1-$i"; done >"$TMP/batch1"
say "batch 1: $(wc -l <"$TMP/batch1") creates acknowledged"
sleep 3 # > monitor-interval + sync-interval: batch 1 is on the replica
T=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
say "T = $T"
sleep 2
for i in $(seq "$BATCH"); do create "batch2-$i"; done >"$TMP/batch2"
say "batch 2: $(wc -l <"$TMP/batch2") creates acknowledged"
sleep 3
( # batch 3: a client creating without pause, each acknowledged id with its time
	n=0
	while :; do
		n=$((n + 1))
		if id=$(create "batch3-$n" 2>/dev/null); then printf '%s %s\n' "$EPOCHREALTIME" "$id" >>"$TMP/batch3.acked"; fi
	done
) &
client=$!
disown "$client" # killed below: no "Killed" notice
sleep "$((2 + RANDOM % 4)).$((RANDOM % 10))"
kill -KILL "$PB_PID" "$LS_PID"
killed_at=$EPOCHREALTIME
kill -KILL "$client"
wait "$LS_PID" 2>/dev/null || true
STARTED=()
cut -d' ' -f2 "$TMP/batch3.acked" >"$TMP/batch3"
say "batch 3: $(wc -l <"$TMP/batch3") creates acknowledged, then SIGKILL to litestream and paybuttons at once"

say ""
say "== 2. restore the newest copy to a new path, check it, serve it, compare"
use_site "$TMP/restored"
say "\$ litestream restore -config litestream.yml -o $PAYBUTTONS_DB \$PAYBUTTONS_DB"
restore_to "$PAYBUTTONS_DB" 2>&1 | indent
check=$("$PB" check -db "$PAYBUTTONS_DB" 2>&1) || true
expect "paybuttons check of the restored copy" "$check" ok
start_server "$TMP/restored.log"
ids >"$TMP/restored.ids"
stop "$PB_PID"
STARTED=()
expect "batch 1 restored" "$(count_in "$TMP/batch1" "$TMP/restored.ids")" "$BATCH"
expect "batch 2 restored" "$(count_in "$TMP/batch2" "$TMP/restored.ids")" "$BATCH"
acked3=$(wc -l <"$TMP/batch3")
kept3=$(count_in "$TMP/batch3" "$TMP/restored.ids")
read -r window lag < <(awk -v killed="$killed_at" '
	FILENAME == ARGV[1] { have[$1] = 1; next }
	{ if ($1 > last) last = $1; if (($2 in have) && $1 > kept) kept = $1 }
	END { if (!kept) kept = last; printf "%.3f %.3f\n", last - kept, killed - kept }' "$TMP/restored.ids" "$TMP/batch3.acked")
say "batch 3: $kept3 of $acked3 acknowledged creates restored, $((acked3 - kept3)) lost with host A"
say "  loss window: $window s from the last restored acknowledged create to the last acknowledged one"
say "  (the replica was $lag s behind when host A was killed)"
if awk -v w="$window" 'BEGIN { exit !(w < 3) }'; then
	result OK "acknowledged writes lost with the host: $((acked3 - kept3)) of $acked3, a window of $window s (under 3 s)"
else
	result FAIL "acknowledged writes lost with the host: $((acked3 - kept3)) of $acked3, a window of $window s (3 s or more)"
fi
# The replica is a prefix of the commits: every lost create came after every kept one.
holes=$(awk 'FILENAME == ARGV[1] { have[$1] = 1; next }
	{ n++; t[n] = $1; k[n] = ($2 in have) } END {
		for (i = 1; i <= n; i++) if (k[i]) last = t[i]
		for (i = 1; i <= n; i++) if (!k[i] && t[i] < last - 0.05) h++
		print h + 0 }' "$TMP/restored.ids" "$TMP/batch3.acked")
expect "acknowledged creates missing although later ones were restored" "$holes" 0

say ""
say "== 3. point-in-time restore to T = $T (between batch 1 and batch 2)"
use_site "$TMP/pitr"
say "\$ litestream restore -config litestream.yml -timestamp $T -o $PAYBUTTONS_DB \$PAYBUTTONS_DB"
restore_to "$PAYBUTTONS_DB" -timestamp "$T" 2>&1 | indent
check=$("$PB" check -db "$PAYBUTTONS_DB" 2>&1) || true
expect "paybuttons check of the copy as of T" "$check" ok
start_server "$TMP/pitr.log"
ids >"$TMP/pitr.ids"
stop "$PB_PID"
STARTED=()
expect "batch 1 in the copy as of T" "$(count_in "$TMP/batch1" "$TMP/pitr.ids")" "$BATCH"
expect "batch 2 in the copy as of T" "$(count_in "$TMP/batch2" "$TMP/pitr.ids")" 0
expect "batch 3 in the copy as of T" "$(count_in "$TMP/batch3" "$TMP/pitr.ids")" 0

say ""
say "== 4. standby takeover: host B starts with no database"
use_site "$TMP/hostB"
start_primary "$TMP/hostB.log"
grep -E 'msg="(attempting restore|restore completed|no backup found)' "$TMP/hostB.log" | indent
if grep -q 'msg="restore completed"' "$TMP/hostB.log"; then
	result OK "host B restored the replica before serving"
else
	result FAIL "host B did not restore the replica before serving"
fi
ids >"$TMP/hostB.ids"
expect "buttons host B serves (as restored in step 2)" "$(wc -l <"$TMP/hostB.ids")" "$(wc -l <"$TMP/restored.ids")"
for i in $(seq 20); do create "batch4-$i"; done >"$TMP/batch4"
say "batch 4: $(wc -l <"$TMP/batch4") creates acknowledged by host B"

say ""
say "== 5. shutdown: SIGTERM to host B (litestream passes it to paybuttons)"
started=$EPOCHREALTIME
stop "$LS_PID"
STARTED=()
took=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
grep -E 'msg="shutting down"|msg=stopped|litestream shut down' "$TMP/hostB.log" | indent
stopping=$(awk '/msg="shutting down"/ { a = $1 } /msg=stopped/ { b = $1 } END {
	gsub(/time=|Z/, "", a); gsub(/time=|Z/, "", b); split(a, x, /[T:]/); split(b, y, /[T:]/)
	printf "%.2f", (y[2] * 3600 + y[3] * 60 + y[4]) - (x[2] * 3600 + x[3] * 60 + x[4]) }' "$TMP/hostB.log")
say "paybuttons: $stopping s from \"shutting down\" to \"stopped\"; litestream and paybuttons gone after $took s"
if awk -v c="$stopping" 'BEGIN { exit !(c < 1) }'; then
	result OK "paybuttons stopped $stopping s after SIGTERM beside Litestream (under 1 s: no request in flight)"
else
	result FAIL "paybuttons took $stopping s to stop beside Litestream"
fi
# Litestream keeps the WAL file when it closes (it sets SQLite's PERSIST_WAL);
# paybuttons, when it closes last, checkpoints the WAL and deletes it. A WAL after
# the stop: Litestream had the file open when paybuttons closed it.
if [ -s "$PAYBUTTONS_DB-wal" ]; then
	result OK "the WAL was left beside the database: Litestream had the file open, so paybuttons' close did not checkpoint it"
else
	result FAIL "the WAL was checkpointed away at the stop although Litestream had the file open"
fi
start_server "$TMP/hostB-again.log"
ids >"$TMP/hostB-again.ids"
stop "$PB_PID"
STARTED=()
expect "batch 4 after the next start of host B" "$(count_in "$TMP/batch4" "$TMP/hostB-again.ids")" 20
check=$("$PB" check -db "$PAYBUTTONS_DB" 2>&1) || true
expect "paybuttons check of host B's database" "$check" ok

say ""
say "== 6. verification routine (deploy/paybuttons-verify-replica.sh, as the timer runs it)"
if out=$(PATH="$(dirname "$LS"):$(dirname "$PB"):$PATH" "$REPO/deploy/paybuttons-verify-replica.sh" \
	-config "$CONFIG" 2>&1); then
	say "  $out"
	result OK "verification passes on the replica"
else
	say "  $out"
	result FAIL "verification fails on a good replica"
fi
use_site "$TMP/verify-restored"
restore_to "$PAYBUTTONS_DB" >/dev/null 2>&1
start_server "$TMP/verify.log"
ids >"$TMP/verify.ids"
stop "$PB_PID"
STARTED=()
expect "batch 4 on the replica after host B's shutdown" "$(count_in "$TMP/batch4" "$TMP/verify.ids")" 20
# A damaged replica: the newest L0 file with bytes overwritten in its page data.
cp -a "$TMP/replica" "$TMP/replica.good"
newest=$(find "$TMP/replica/ltx/0/" -type f -printf '%f\n' | sort | tail -1)
printf 'not an ltx page' | dd of="$TMP/replica/ltx/0/$newest" bs=1 seek=200 conv=notrunc 2>/dev/null
use_site "$TMP/hostB" # the primary's view: compares with its local position too
if out=$(PATH="$(dirname "$LS"):$(dirname "$PB"):$PATH" "$REPO/deploy/paybuttons-verify-replica.sh" \
	-config "$CONFIG" 2>&1); then
	say "  $out"
	result FAIL "verification passed on a replica with a damaged file"
else
	say "  $(grep 'REPLICA VERIFICATION FAILED' <<<"$out" | cut -c1-400)"
	result OK "verification fails loudly on a replica with a damaged file"
fi
rm -rf "$TMP/replica"
mv "$TMP/replica.good" "$TMP/replica"

say ""
say "== 7. put the copy as of T back as host B's live database, and go on"
use_site "$TMP/hostB"
restore_to "$TMP/asof.db" -timestamp "$T" >/dev/null 2>&1
mkdir "$TMP/hostB.before"
mv "$TMP/hostB/"paybuttons.db* "$TMP/hostB/.paybuttons.db-litestream" "$TMP/hostB.before/"
mv "$TMP/asof.db" "$PAYBUTTONS_DB"
start_primary "$TMP/hostB-rolled-back.log"
for i in $(seq 10); do create "batch5-$i"; done >"$TMP/batch5"
say "batch 5: $(wc -l <"$TMP/batch5") creates acknowledged by host B on the copy as of T"
stop "$LS_PID"
STARTED=()
use_site "$TMP/after-rollback"
restore_to "$PAYBUTTONS_DB" >/dev/null 2>&1
check=$("$PB" check -db "$PAYBUTTONS_DB" 2>&1) || true
expect "paybuttons check of the newest copy after the rollback" "$check" ok
start_server "$TMP/after-rollback.log"
ids >"$TMP/after-rollback.ids"
stop "$PB_PID"
STARTED=()
expect "batch 1 in the newest copy" "$(count_in "$TMP/batch1" "$TMP/after-rollback.ids")" "$BATCH"
expect "batches 2, 3 and 4 in the newest copy (rolled back)" \
	"$(cat "$TMP/batch2" "$TMP/batch3" "$TMP/batch4" >"$TMP/after-T" && count_in "$TMP/after-T" "$TMP/after-rollback.ids")" 0
expect "batch 5 in the newest copy" "$(count_in "$TMP/batch5" "$TMP/after-rollback.ids")" 10

say ""
say "== summary"
printf '%s\n' "${RESULTS[@]}"
if [ "$FAILED" = 0 ]; then say "drill passed"; else say "drill FAILED"; fi
exit "$FAILED"
