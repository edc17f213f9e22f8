#!/bin/sh
# Creates the inferd system user and group before the files are unpacked.
# The user is kept on removal and purge (Debian policy: uids are not reused).
set -e
if ! getent group inferd >/dev/null; then
	groupadd --system inferd
fi
if ! getent passwd inferd >/dev/null; then
	useradd --system --gid inferd --home-dir /var/lib/inferd --no-create-home \
		--shell /usr/sbin/nologin --comment "inferd inference appliance" inferd
fi
