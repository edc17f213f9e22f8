#!/usr/bin/env bash
# Writes the package's copyright file (/usr/share/doc/inferd/copyright):
# inferd's own notice, then the licence of every Go module linked into
# BINARY, read from the module cache that built it, and Go's own.
#   packaging/copyright.sh BINARY > copyright
# A module whose licence file cannot be found stops the build: the package
# must not ship code without its notice. Apache-2.0 texts are referred to
# in /usr/share/common-licenses, as Debian policy asks.
set -euo pipefail
bin=$1
modcache=$(go env GOMODCACHE)

cat <<'EOF'
inferd: a one-box serverless inference appliance

Copyright: the inferd developers
License: proprietary
 inferd is not free software. Use, copying and distribution are governed
 by the agreement under which you received it.

The inferd binary links the Go standard library and the Go modules below,
each under its own licence, reproduced here (or, for the Apache License 2.0,
referred to in /usr/share/common-licenses/Apache-2.0).
EOF

# section TITLE FILE: one module's notice, indented as the rest of the file.
section() {
	local title=$1 file=$2
	printf '\n%s\n' "$title"
	# The full Apache text, not a file that only cites it beside another
	# licence (yaml's LICENSE holds MIT text and an Apache notice).
	if grep -q 'TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION' "$file" &&
		grep -q 'Version 2.0' "$file"; then
		printf ' Licensed under the Apache License, Version 2.0; on Debian systems its\n'
		printf ' full text is in /usr/share/common-licenses/Apache-2.0.\n'
	else
		indent "$file"
	fi
	# An Apache-licensed module's NOTICE must travel with it.
	if [ -f "$(dirname "$file")/NOTICE" ]; then
		indent "$(dirname "$file")/NOTICE"
	fi
}

# indent FILE: the text without leading blank lines, each line one space
# in, an empty line as " ." (the copyright file's paragraph syntax).
indent() {
	sed -e 's/[[:space:]]*$//' -e '/./,$!d' -e 's/^$/./' -e 's/^/ /' "$1"
}

section "Go standard library ($(go version -m "$bin" | head -1 | awk '{print $2}'))" "$(go env GOROOT)/LICENSE"

# `go version -m` lists each linked module as "dep PATH VERSION SUM", and a
# replaced one with a following "=> PATH VERSION SUM" line.
# A replacement's own path and version are where its files are.
go version -m "$bin" |
	awk '$1 == "dep" { if (p) print p, v; p = $2; v = $3 } $1 == "=>" { p = $2; v = $3 } END { if (p) print p, v }' |
	while read -r path version; do
		# The module cache spells upper-case letters as !lower-case.
		dir="$modcache/$(sed 's/[A-Z]/!\L&/g' <<<"$path")@$version"
		lic=
		for f in LICENSE LICENSE.txt LICENSE.md LICENCE COPYING; do
			if [ -f "$dir/$f" ]; then
				lic=$dir/$f
				break
			fi
		done
		if [ -z "$lic" ]; then
			echo "copyright.sh: no licence file for $path $version in $dir" >&2
			exit 1
		fi
		section "$path $version" "$lic"
	done
