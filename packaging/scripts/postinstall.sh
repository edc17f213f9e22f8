#!/bin/sh
# Creates the data dir and, where systemd runs, enables and starts inferd on a
# first install and restarts it on an upgrade.
# Called as `postinst configure [OLD-VERSION]` (deb) or `%post N` (rpm, N=1
# on install, 2 on upgrade).
set -e
case "$1" in
configure | 1 | 2) ;;
*) exit 0 ;;
esac
upgrade=no
if [ "$1" = 2 ] || { [ "$1" = configure ] && [ -n "$2" ]; }; then
	upgrade=yes
fi

# 0700: the data dir holds key hashes, call payloads and the admin socket.
install -d -o inferd -g inferd -m 0700 /var/lib/inferd

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ "$upgrade" = yes ]; then
		# A restart drains requests and opens the data file with the new
		# binary, which migrates its schema if needed (keeping a copy).
		systemctl try-restart inferd.service || true
	else
		systemctl enable --now inferd.service || true
	fi
fi
