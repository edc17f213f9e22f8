#!/bin/sh
# The .deb's postinst (the rpm uses postinstall.sh): creates the data dir,
# enables inferd and starts it on a first install, restarts it on an
# upgrade. Called as `postinst configure [OLD-VERSION]`.
#
# The unit is enabled with deb-systemd-helper, as debhelper's scripts do:
# it works with no systemd running (an image built in a chroot starts
# inferd on its first boot) and keeps an admin's `systemctl disable` across
# upgrades. deb-systemd-invoke honours policy-rc.d.
set -e
[ "$1" = configure ] || exit 0

# 0700: the data dir holds key hashes, call payloads and the admin socket.
install -d -o inferd -g inferd -m 0700 /var/lib/inferd

deb-systemd-helper unmask inferd.service >/dev/null || true
# was-enabled answers yes for a unit it has never seen: a first install enables.
if deb-systemd-helper --quiet was-enabled inferd.service; then
	deb-systemd-helper enable inferd.service >/dev/null || true
else
	deb-systemd-helper update-state inferd.service >/dev/null || true
fi

if [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null || true
	if [ -n "$2" ]; then
		# A restart drains requests and opens the data file with the new
		# binary, which migrates its schema if needed (keeping a copy).
		deb-systemd-invoke restart inferd.service >/dev/null || true
	else
		deb-systemd-invoke start inferd.service >/dev/null || true
	fi
fi
