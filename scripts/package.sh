#!/usr/bin/env bash
# Builds the inferd .deb and .rpm into OUT (default dist/) with nfpm, which
# tools/go.mod pins and the Go module proxy serves: nothing else is downloaded.
#   scripts/package.sh [OUT]
# Prints the paths of the packages it wrote, one a line, last.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath -m "${1:-dist}")

# Version from git: v1.2.3 → 1.2.3; 4 commits after it → 1.2.3+git4.gabc1234;
# no tag yet → 0.0.0+git<commits>.g<hash>. These sort in commit order for both
# dpkg and rpm, so each build upgrades the one before.
pkg_version() {
	local d
	if d=$(git describe --tags --match 'v[0-9]*' --long --abbrev=7 2>/dev/null); then
		# v1.2.3-4-gabc1234
		local tag=${d%-*-g*} rest=${d#"${d%-*-g*}"-}
		local n=${rest%%-*} hash=${rest#*-}
		tag=${tag#v}
		if [ "$n" = 0 ]; then echo "$tag"; else echo "$tag+git$n.$hash"; fi
	else
		echo "0.0.0+git$(git rev-list --count HEAD).g$(git rev-parse --short=7 HEAD)"
	fi
}

export PKG_VERSION=${PKG_VERSION:-$(pkg_version)}
export PKG_ARCH=${PKG_ARCH:-$(go env GOARCH)}
export PKG_DIR=$out/stage
rm -rf "$PKG_DIR"
mkdir -p "$PKG_DIR"

# The maintainer the package names (Debian's Maintainer field and the
# changelog): the project's address, or a site's own for its builds. It must
# be a mail domain (lintian refuses localhost and .local).
export PKG_MAINTAINER=${PKG_MAINTAINER:-inferd developers <maintainers@inferd.example>}
# The package's Homepage field: none unless a site build names one.
export PKG_HOMEPAGE=${PKG_HOMEPAGE:-}

echo "building inferd $PKG_VERSION for $PKG_ARCH"
commit=$(git rev-parse --short HEAD)
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# A position-independent executable, as Debian's hardening flags ask
# (lintian: hardening-no-pie). Not bound now (-z now): go-nvml leaves the
# NVML symbols unresolved until it dlopens the driver's library, so
# resolving every symbol at start would stop inferd on any machine.
CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations} GOARCH=$PKG_ARCH \
	go build -trimpath -buildmode=pie \
	-ldflags "-s -w -X main.version=$PKG_VERSION -X main.commit=$commit -X main.buildDate=$build_date" \
	-o "$PKG_DIR/inferd" .

# The manual page, from the CLI's own help text; the copyright file, with
# the licence of every module linked in; a changelog naming this build
# (a native package: its version has no Debian revision). Dated by the
# commit, so that the same commit packs the same files.
commit_date=$(git log -1 --format=%cs)
packaging/manpage.sh "$PKG_DIR/inferd" "$PKG_VERSION" "$commit_date" | gzip -9n >"$PKG_DIR/inferd.1.gz"
packaging/copyright.sh "$PKG_DIR/inferd" >"$PKG_DIR/copyright"
since=$(git describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null || true)
{
	echo "inferd ($PKG_VERSION) unstable; urgency=medium"
	echo
	echo "  * Built from commit $(git rev-parse --short=12 HEAD). Latest changes${since:+ since $since}:"
	git log --no-merges -n 20 --format='%s' ${since:+"$since..HEAD"} |
		while IFS= read -r subject; do
			fold -s -w 68 <<<"$subject" | sed -e 's/[[:space:]]*$//' -e '1s/^/    - /' -e '1!s/^/      /'
		done
	echo
	echo " -- $PKG_MAINTAINER  $(git log -1 --format=%cD)"
} | gzip -9n >"$PKG_DIR/changelog.gz"

# The packaged config is config.example.yaml with the data dir moved to
# /var/lib/inferd, so the two cannot drift; the .deb install test compares them.
grep -qx 'dataDir: ./data' config.example.yaml || {
	echo "config.example.yaml has no line 'dataDir: ./data'; update scripts/package.sh" >&2
	exit 1
}
sed 's|^dataDir: ./data$|dataDir: /var/lib/inferd|' config.example.yaml >"$PKG_DIR/config.yaml"

# Only the tracked files of the example model (no __pycache__).
git ls-files -z examples/echo | xargs -0 cp --parents -t "$PKG_DIR"

go -C tools build -o "$out/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm
# License is an rpm header; a .deb has no such control field (lintian:
# unknown-field), its copyright file says it. nfpm expands no variable in
# license, so the .deb is packed from a copy of the recipe without it.
sed '/^license:/d' packaging/nfpm.yaml >"$PKG_DIR/nfpm-deb.yaml"
"$out/nfpm" package --config "$PKG_DIR/nfpm-deb.yaml" --packager deb --target "$out/" >&2
"$out/nfpm" package --config packaging/nfpm.yaml --packager rpm --target "$out/" >&2
ls -1 "$out"/inferd*"$PKG_VERSION"*.{deb,rpm} 2>/dev/null || ls -1 "$out"/*.deb "$out"/*.rpm
