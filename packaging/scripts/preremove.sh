#!/bin/sh
# The rpm's %preun (the .deb has deb-prerm.sh): stops and disables inferd
# when the package is removed, not on an upgrade. Called as `%preun N`
# (N=0 on removal).
set -e
case "$1" in
0) ;;
*) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now inferd.service || true
fi
