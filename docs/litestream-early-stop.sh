#!/usr/bin/env bash
# Reproduces the one way found in which a clean stop leaves acknowledged writes
# off the replica, and shows that the 2 s start delay of deploy/paybuttons.service
# prevents it. docs/litestream.md, "Shutdown", explains it.
#
#   docs/litestream-early-stop.sh
#
# Litestream opens the database at its first monitor tick, 1 s after it starts;
# until then it holds no read lock. paybuttons, started at once by -exec, takes
# writes; stopped within that second, it is the last process with the file open,
# so SQLite checkpoints the WAL when paybuttons closes its last connection: the
# writes move into the database file and the WAL is deleted before Litestream has
# read it. Litestream then stops cleanly, and the replica lacks those writes until
# Litestream next runs on this host (it notices then and uploads them). If the host
# is lost in between, they are lost although the stop was clean.
#
# For each command line: a host with a replicated database (10 creates, a clean
# stop), then a start with that command line, 3 creates as soon as paybuttons
# answers, an immediate SIGTERM, and a restore from the replica; then one more
# start and stop, and another restore.
set -euo pipefail
source "$(dirname "$0")/litestream-lib.sh"
find_binaries

# restored_count FILE_OF_IDS: how many of them a fresh restore of the replica has.
restored_count() {
	local site=$PAYBUTTONS_DB n
	use_site "$TMP/restore.$RANDOM"
	restore_to "$PAYBUTTONS_DB" >/dev/null 2>&1
	start_server "$TMP/restore.log"
	ids >"$TMP/restore.ids"
	n=$(grep -cxFf "$1" "$TMP/restore.ids" || true)
	stop "$PB_PID"
	STARTED=()
	use_site "$(dirname "$site")"
	echo "$n"
}

for variant in "paybuttons serve" "sh -c 'sleep 2 && exec paybuttons serve'"; do
	say ""
	say "== -exec \"$variant\""
	rm -rf "$TMP/replica" "$TMP/host"
	use_site "$TMP/host"
	start_primary "$TMP/first.log"
	KEY=$(new_key)
	wait_log "$TMP/first.log" 'msg="snapshot complete"'
	for i in $(seq 10); do create "before-$i"; done >/dev/null
	sleep 3
	stop "$LS_PID"
	STARTED=()

	exec_line=${variant//paybuttons serve/$PB serve -addr 127.0.0.1:0}
	started=$EPOCHREALTIME
	"$LS" replicate -config "$CONFIG" -exec "$exec_line" >"$TMP/early.log" 2>&1 &
	LS_PID=$!
	STARTED+=("$LS_PID")
	PORT=$(port_of "$TMP/early.log")
	for i in 1 2 3; do create "early-$i"; done >"$TMP/early"
	stop "$LS_PID"
	STARTED=()
	took=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	# Litestream keeps the WAL file when it closes (it sets SQLite's PERSIST_WAL);
	# paybuttons, when it closes last, checkpoints the WAL and deletes it. A WAL
	# after the stop: Litestream had the file open when paybuttons closed it.
	if [ -s "$PAYBUTTONS_DB-wal" ]; then
		how="the WAL was kept (Litestream had the file open when paybuttons closed it)"
	else
		how="paybuttons' close checkpointed and deleted the WAL (Litestream had not opened the file yet)"
	fi
	say "3 creates acknowledged, SIGTERM, stopped $took s after Litestream started; $how"
	grep -E 'msg=(litestream|listening|"shutting down"|stopped|"litestream shut down")' "$TMP/early.log" | sed "s|$TMP|\$TMP|g" | cut -c1-110 | indent
	say "acknowledged creates on the replica right after the clean stop: $(restored_count "$TMP/early") of 3"

	start_primary "$TMP/again.log"
	sleep 3
	stop "$LS_PID"
	STARTED=()
	say "after one more start and stop of Litestream on this host: $(restored_count "$TMP/early") of 3"
done
