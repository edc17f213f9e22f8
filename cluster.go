package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/httpapi"
	"inferd/store"
	"inferd/store/bolt"
	"inferd/store/etcd"
)

// daemonStore is what serve needs of its store; the bbolt and etcd stores
// both have it.
type daemonStore interface {
	store.Store
	httpapi.StoreStats
	RunSweeper(ctx context.Context, ttl, every time.Duration) error
}

// openedStore is the daemon's store, with what else was started for it.
type openedStore struct {
	daemonStore
	member *etcd.Member // this node's etcd member; nil when it runs none
}

// Close closes the store, then the member it talked to.
func (o openedStore) Close() error {
	err := o.daemonStore.Close()
	if o.member != nil {
		o.member.Close()
	}
	return err
}

// finals tells the scheduler of calls made final through any node (the
// etcd store's OnCallFinal: a scheduler.FinalFeed), so that a long poll
// here on a call run on another node wakes when it is final; nil on a
// single box.
func (o openedStore) finals() interface{ OnCallFinal(fn func(id string)) } {
	if f, ok := o.daemonStore.(interface{ OnCallFinal(fn func(id string)) }); ok {
		return f
	}
	return nil
}

// memberErr is the channel of the member's fatal errors; nil (never ready)
// when the node runs no member.
func (o openedStore) memberErr() <-chan error {
	if o.member == nil {
		return nil
	}
	return o.member.Err()
}

// openStore opens the single box's bbolt file, or with a cluster: section
// the etcd store, starting this node's etcd member first when it runs one.
func openStore(cfg config.Config, log zerolog.Logger) (openedStore, error) {
	if cfg.Cluster == nil {
		st, err := bolt.Open(cfg.StorePath(), bolt.Options{})
		if err != nil {
			return openedStore{}, withRestoreHint(err)
		}
		if m := st.Migration(); m.Migrated() {
			log.Warn().Int("from", m.From).Int("to", m.To).Str("copy", m.Copy).
				Msg("migrated the data file to a newer schema; the copy holds the old data for a downgrade")
		}
		return openedStore{daemonStore: st}, nil
	}
	c := cfg.Cluster
	tlsFiles := etcd.TLSFiles(c.Etcd.TLS)
	var clientTLS *tls.Config
	if tlsFiles != (etcd.TLSFiles{}) {
		var err error
		if clientTLS, err = etcd.ClientTLS(tlsFiles); err != nil {
			return openedStore{}, fmt.Errorf("cluster.etcd.tls: %w", err)
		}
	}
	var o openedStore
	endpoints := c.Etcd.Endpoints
	if e := c.Etcd.Embed; e != nil {
		m, err := etcd.StartMember(etcd.MemberConfig{
			Name: c.Name, DataDir: cfg.EtcdDataDir(),
			PeerURL: e.PeerURL, ClientURL: e.ClientURL,
			InitialCluster: e.InitialCluster, Join: e.Join,
			ClientTLS: tlsFiles, PeerTLS: etcd.TLSFiles(e.PeerTLS),
			Log: etcdLog{log.With().Str("source", "etcd").Logger()},
		})
		if err != nil {
			return openedStore{}, err
		}
		o.member = m
		endpoints = m.Endpoints() // a learner's node talks to the voters
	}
	st, err := etcd.Open(etcd.Options{Endpoints: endpoints, TLS: clientTLS, Prefix: c.Etcd.Prefix, Node: c.Name,
		DialTimeout: c.Etcd.DialTimeout})
	if err != nil {
		if o.member != nil {
			o.member.Close()
		}
		return openedStore{}, err
	}
	o.daemonStore = st
	log.Info().Str("node", c.Name).Strs("etcd", endpoints).Bool("member", o.member != nil).
		Msg("cluster mode: records in etcd")
	return o, nil
}

// etcdLog passes the etcd member's error lines (JSON from its zap logger)
// to the daemon's log.
type etcdLog struct{ log zerolog.Logger }

func (l etcdLog) Write(p []byte) (int, error) {
	l.log.Error().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
