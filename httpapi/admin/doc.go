// Package admin is the admin API that inferd call, key, team, apply,
// project, logs, usage, backup and call cancel talk to: the daemon serves it
// on <dataDir>/inferd.sock (mode 0600), and the CLI runs the same handler
// in-process on the opened store when no daemon runs. It has no
// authentication of its own: the socket's mode is its lock. What takes more
// than the store (the replicas' logs, the model and capacity checks,
// cancels, the teams' use, running a call) is handed in as options, the
// daemon's or, with no daemon, the CLI's own; a route without its option
// says what it needs.
package admin
