#!/bin/sh
# The .deb's prerm (the rpm uses preremove.sh): stops inferd when the
# package is removed, not on an upgrade (postinst restarts it then).
# Called as `prerm remove|upgrade|...`.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	deb-systemd-invoke stop inferd.service >/dev/null || true
fi
