package local

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"syscall"
)

// RunAs is a user model processes run as when inferd may switch users, so
// that a model cannot read the data file, other teams' logs or inferd's
// keys, nor signal inferd: a uid of the project's own (see identity.go), or
// replica.user's named user. The process is started with this uid, gid and
// supplementary groups (a named user's device groups, such as video or
// render, come with it), and USER and LOGNAME name it; HOME is the replica's
// private directory, not Home.
type RunAs struct {
	Name     string
	UID, GID uint32
	Groups   []uint32
	Home     string
}

// LookupRunAs resolves a user name (or numeric uid) from the system's user
// database.
func LookupRunAs(name string) (*RunAs, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if _, nerr := strconv.Atoi(name); nerr == nil && errors.As(err, &unknown) {
			u, err = user.LookupId(name)
		}
		if err != nil {
			return nil, fmt.Errorf("model user %q: %w", name, err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("model user %q: uid/gid %s/%s: %w", name, u.Uid, u.Gid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("model user %q is root; name an unprivileged user", name)
	}
	r := &RunAs{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("model user %q: groups: %w", name, err)
	}
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("model user %q: group %s: %w", name, id, err)
		}
		r.Groups = append(r.Groups, uint32(g))
	}
	return r, nil
}

// Credential is what a process started as this user is given.
func (r *RunAs) Credential() *syscall.Credential { return r.credential() }

func (r *RunAs) credential() *syscall.Credential {
	return &syscall.Credential{Uid: r.UID, Gid: r.GID, Groups: r.Groups}
}
