#!/bin/sh
# Removal keeps /etc/inferd and the data in /var/lib/inferd. A deb purge
# deletes both (take a backup first: `inferd backup FILE`); rpm has no purge.
# The inferd user is kept either way.
# Called as `postrm remove|purge|upgrade ...` (deb) or `%postun N` (rpm).
set -e
if [ "$1" = purge ]; then
	rm -rf /etc/inferd /var/lib/inferd
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
