#!/bin/sh
# The rpm's %postun (the .deb has deb-postrm.sh): removal keeps /etc/inferd
# and the data in /var/lib/inferd (rpm has no purge) and the inferd user.
# Called as `%postun N`.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
