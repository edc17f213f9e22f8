#!/bin/sh
# The rpm's %post (the .deb has deb-postinst.sh): creates the data dir and,
# where systemd runs, enables and starts inferd on a first install and
# restarts it on an upgrade. Called as `%post N` (N=1 on install, 2 on
# upgrade).
set -e
case "$1" in
1 | 2) ;;
*) exit 0 ;;
esac

# 0700: the data dir holds key hashes, call payloads and the admin socket.
install -d -o inferd -g inferd -m 0700 /var/lib/inferd

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ "$1" = 2 ]; then
		# A restart drains requests and opens the data file with the new
		# binary, which migrates its schema if needed (keeping a copy).
		systemctl try-restart inferd.service || true
	else
		systemctl enable --now inferd.service || true
	fi
fi
