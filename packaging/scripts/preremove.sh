#!/bin/sh
# Stops and disables inferd when the package is removed, not on an upgrade.
# Called as `prerm remove|upgrade ...` (deb) or `%preun N` (rpm, N=0 on removal).
set -e
case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now inferd.service || true
fi
