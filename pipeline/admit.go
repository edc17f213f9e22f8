package pipeline

import (
	"sync/atomic"

	"inferd/store"
)

// Hold is what a request holds open while its call runs, which the
// admission hooks count per key.
type Hold int

// Holds.
const (
	HoldNone   Hold = iota // answered at once (a startOnly start)
	HoldWait               // waits for the result (a sync start, /run, an OpenAI request)
	HoldStream             // streams the result as it comes (an OpenAI stream)
)

// Admission is what a hook decides on.
type Admission struct {
	Key     store.APIKey
	Project store.Project // zero for the key's hooks (Config.KeyHooks)
	Hold    Hold
	// MayDegrade says a HoldWait request may go on holding nothing when a
	// hook has no room for its wait (a Banana start is then answered at
	// once with its call's state, as a startOnly is): the hook returns a
	// nil release and no error, and the request's Hold becomes HoldNone.
	MayDegrade bool
	// FromNode: the request was forwarded by another node of the cluster,
	// which ran the key's hooks (its rate) where the client sent it.
	FromNode bool
}

// Hook is one named admission rule (a key's rate, its waits, its
// streams). Admit lets the request in, returning what frees what it took
// (nil: nothing), or refuses it with an error written for users. Its
// refusals are counted under Name (Pipeline.Refusals).
type Hook struct {
	Name  string
	Admit func(a *Admission) (release func(), err error)
}

// admit runs hooks in order on a, which they may degrade; the first
// refusal ends it, and what the hooks before it took is given back.
// release frees what all took.
func (p *Pipeline) admit(hooks []Hook, a *Admission) (release func(), ref *Refusal) {
	var taken []func()
	release = func() {
		for i := len(taken) - 1; i >= 0; i-- {
			taken[i]()
		}
	}
	for _, h := range hooks {
		free, err := h.Admit(a)
		if err != nil {
			release()
			p.refusals[h.Name].Add(1)
			if p.cfg.OnRefusal != nil {
				p.cfg.OnRefusal(h.Name, err)
			}
			return nil, &Refusal{Kind: RefusedBudget, Hook: h.Name, Err: err}
		}
		if free != nil {
			taken = append(taken, free)
		}
	}
	return release, nil
}

// Refusals calls fn with each hook's name and how many requests it has
// refused, in the hooks' order (the metrics' inferd_admission_refusals_total).
func (p *Pipeline) Refusals(fn func(hook string, n uint64)) {
	for _, hooks := range [][]Hook{p.cfg.KeyHooks, p.cfg.CallHooks} {
		for _, h := range hooks {
			fn(h.Name, p.refusals[h.Name].Load())
		}
	}
}

// counters makes one refusal counter per hook name.
func counters(hookLists ...[]Hook) map[string]*atomic.Uint64 {
	m := map[string]*atomic.Uint64{}
	for _, hooks := range hookLists {
		for _, h := range hooks {
			if m[h.Name] == nil {
				m[h.Name] = new(atomic.Uint64)
			}
		}
	}
	return m
}
