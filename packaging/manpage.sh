#!/usr/bin/env bash
# Writes the inferd(1) manual page, in roff, from the CLI's own help texts
# (`inferd help` and `inferd help COMMAND` for each command it lists), so
# that the page says what the help says and never drifts from it.
#   packaging/manpage.sh BINARY VERSION DATE > inferd.1
# The help's shape is what it reads: a first line "inferd: SUMMARY", section
# headers flush left, capitalised, ending in ":" ("Usage:", "Global flags:"), indented
# lines (kept as written, in a no-fill block) and flush-left prose (filled).
# The global help gives NAME, SYNOPSIS, OPTIONS and DESCRIPTION; each
# command's help a subsection of COMMANDS.
set -euo pipefail
bin=$1 version=$2 date=$3

help=$("$bin" help)
# The commands, in the order the usage lists them: the word after "inferd"
# and its global flags on each usage line ("help" describes only itself).
commands=$(sed -n 's/^  inferd \(\[global flags\] \)\{0,1\}\([a-z][a-z-]*\).*/\2/p' <<<"$help" | awk '$0 != "help" && !seen[$0]++')

{
	printf '%s\n' "$help"
	for c in $commands; do
		printf '@@COMMAND %s\n' "$c"
		"$bin" help "$c"
	done
} | awk -v version="$version" -v date="$date" '
# roff escapes: a backslash, a hyphen (a minus in roff), and a line that
# would start with a control character (. or '\'').
function esc(s) {
	gsub(/\\/, "\\e", s)
	gsub(/-/, "\\-", s)
	if (s ~ /^[.'"'"']/) s = "\\&" s
	return s
}
function close_block() { if (inblock) { print ".fi"; inblock = 0 } }
NR == 1 {
	split($0, a, ": ")
	print ".TH INFERD 1 \"" date "\" \"inferd " version "\" \"User Commands\""
	print ".SH NAME"
	print "inferd \\- " esc(substr($0, length(a[1]) + 3))
	next
}
/^@@COMMAND / {
	close_block()
	if (!incommands) { print ".SH COMMANDS"; incommands = 1 }
	print ".SS " esc($2)
	fresh = 1
	next
}
# A header is a word or three, capitalised: prose can end a line in ":" too.
/^[A-Z][a-z]*( [a-z]+)?( [a-z]+)?:$/ {
	close_block()
	if (incommands) next # a command'"'"'s "Usage:": its subsection says it
	title = toupper(substr($0, 1, length($0) - 1))
	if (title == "USAGE") title = "SYNOPSIS"
	if (title == "GLOBAL FLAGS") title = "OPTIONS"
	print ".SH " title
	next
}
/^$/ { close_block(); blank = 1; next }
/^[ \t]/ {
	if (!inblock) { print ".nf"; inblock = 1 }
	sub(/^  /, "")
	print esc($0)
	fresh = 0
	next
}
{
	close_block()
	if (!incommands && !indesc) { print ".SH DESCRIPTION"; indesc = 1 }
	else if (blank && !fresh) print ".PP"
	blank = 0
	fresh = 0
	print esc($0)
}
END {
	close_block()
	print ".SH FILES"
	print ".TP"
	print ".I /etc/inferd/config.yaml"
	print "the packaged configuration; every setting with its default and a comment"
	print ".TP"
	print ".I /var/lib/inferd"
	print "the data directory: the data file, the admin socket and the replica logs"
	print ".SH SEE ALSO"
	print ".nf"
	print "/usr/share/doc/inferd/operations.md"
	print "/usr/share/doc/inferd/configuration.md"
	print "/usr/share/doc/inferd/metrics.md"
	print ".fi"
}
'
