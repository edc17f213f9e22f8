#!/bin/sh
# The .deb's postrm (the rpm uses postremove.sh). Removal keeps /etc/inferd
# and the data in /var/lib/inferd and masks the unit, whose file is gone;
# purge deletes both (take a backup first: `inferd backup FILE`) and forgets
# the unit's enablement. The inferd user is kept either way (Debian policy:
# uids are not reused). Called as `postrm remove|purge|upgrade|...`.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null; then
	deb-systemd-helper mask inferd.service >/dev/null || true
fi
if [ "$1" = purge ]; then
	if command -v deb-systemd-helper >/dev/null; then
		deb-systemd-helper purge inferd.service >/dev/null || true
		deb-systemd-helper unmask inferd.service >/dev/null || true
	fi
	rm -rf /etc/inferd /var/lib/inferd
fi
