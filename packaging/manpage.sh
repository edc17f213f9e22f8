#!/usr/bin/env bash
# Writes the inferd(1) manual page, in roff, from the CLI's own help text, so
# that the page says what `inferd help` says and never drifts from it.
#   packaging/manpage.sh BINARY VERSION DATE > inferd.1
# The help text's shape is what it reads: a first line "inferd: SUMMARY",
# section headers flush left and ending in ":" ("Usage:", "Global flags:"),
# indented lines inside a section (kept as written), and flush-left prose
# (the description). Each section becomes a .SH, its lines a no-fill block.
set -euo pipefail
bin=$1 version=$2 date=$3

help=$("$bin" help)

awk -v version="$version" -v date="$date" '
# roff escapes: a backslash, and a line that would start with a control
# character (. or '\'').
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
/^[^ \t].*:$/ {
	close_block()
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
	next
}
{
	close_block()
	if (!indesc) { print ".SH DESCRIPTION"; indesc = 1 }
	else if (blank) print ".PP"
	blank = 0
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
	print "/usr/share/doc/inferd/operations.md, /usr/share/doc/inferd/configuration.md,"
	print "/usr/share/doc/inferd/metrics.md"
}
' <<<"$help"
