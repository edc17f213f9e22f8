package storetest

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

func testCreateAuthenticateRevokeKey(t *testing.T, e *env) {
	s := e.open(t)
	secret, k, err := s.CreateKey("acme", "")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^ik_[0-9a-f]{10}_[A-Za-z0-9_-]{43}$`).MatchString(secret) {
		t.Errorf("secret %q has the wrong shape", secret)
	}
	if k.Scope != store.ScopeTeam || k.TeamID != "acme" || k.Hash != store.HashKeySecret(secret) || strings.Contains(k.Hash, secret) {
		t.Errorf("key = %+v", k)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 || teams[0].ID != "acme" {
		t.Errorf("CreateKey did not create the team: %+v", teams)
	}
	for range 2 { // the second time from the cache
		got, err := s.Authenticate(secret)
		if err != nil || got.ID != k.ID {
			t.Fatalf("Authenticate = %+v, %v", got, err)
		}
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(secret); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Authenticate after revoke = %v, want ErrInvalidKey", err)
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Errorf("second RevokeKey = %v, want nil", err)
	}
	if err := s.RevokeKey("0123456789"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
	keys, err := s.ListKeys("acme")
	if err != nil || len(keys) != 1 || !keys[0].IsRevoked() {
		t.Errorf("ListKeys = %+v, %v; want one revoked key", keys, err)
	}
}

func testCreateKeyValidates(t *testing.T, e *env) {
	s := e.open(t)
	for _, tc := range []struct {
		name  string
		team  string
		scope store.KeyScope
		field string
	}{
		{"empty team", "", store.ScopeTeam, "teamId"},
		{"bad team", "Acme", store.ScopeTeam, "teamId"},
		{"bad scope", "acme", "root", "scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.CreateKey(tc.team, tc.scope)
			var ve *store.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Errorf("CreateKey = %v, want a validation error on %s", err, tc.field)
			}
		})
	}
}

func testListKeysSortedByTeamThenCreated(t *testing.T, e *env) {
	clock := e.clock
	s := e.open(t)
	for _, team := range []string{"b", "a", "b", "a"} {
		clock.Advance(time.Second)
		if _, _, err := s.CreateKey(team, store.ScopeTeam); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		team  string
		teams []string
	}{
		{"all", "", []string{"a", "a", "b", "b"}},
		{"one team", "b", []string{"b", "b"}},
		{"unknown team", "zzz", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := s.ListKeys(tc.team)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != len(tc.teams) {
				t.Fatalf("got %d keys, want %d", len(keys), len(tc.teams))
			}
			for i, k := range keys {
				if k.TeamID != tc.teams[i] {
					t.Errorf("key %d team = %s, want %s", i, k.TeamID, tc.teams[i])
				}
				if i > 0 && k.TeamID == keys[i-1].TeamID && !k.Created.After(keys[i-1].Created) {
					t.Errorf("key %d not after key %d", i, i-1)
				}
			}
		})
	}
}

func testAuthenticateRejectsBadSecrets(t *testing.T, e *env) {
	s := e.open(t)
	secret, k, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	rest := secret[len("ik_")+10:]
	for _, tc := range []struct {
		name   string
		secret string
	}{
		{"empty", ""},
		{"prefix only", "ik_"},
		{"no secret part", "ik_" + k.ID + "_"},
		{"wrong prefix", "xk_" + k.ID + rest},
		{"uppercase id", "ik_" + strings.ToUpper(k.ID) + rest},
		{"short id", "ik_" + k.ID[:9] + rest},
		{"unknown id", "ik_ffffffffff" + rest},
		{"wrong secret", secret[:len(secret)-1] + flip(secret[len(secret)-1])},
		{"extra character", secret + "a"},
		{"bad character", secret[:len(secret)-1] + "!"},
		{"too long", secret + strings.Repeat("a", 200)},
		{"whitespace", " " + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := s.Authenticate(tc.secret); !errors.Is(err, store.ErrInvalidKey) {
				t.Errorf("Authenticate(%q) = %+v, %v; want ErrInvalidKey", tc.secret, got, err)
			}
		})
	}
}

// A revocation must win over a concurrent authentication that filled the
// cache from a read made before the revocation committed.
func testRevokeTakesEffectDespiteConcurrentAuthentication(t *testing.T, e *env) {
	s := e.open(t)
	for range 20 {
		secret, k, err := s.CreateKey("acme", store.ScopeTeam)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					_, _ = s.Authenticate(secret)
				}
			}
		}()
		if err := s.RevokeKey(k.ID); err != nil {
			t.Fatal(err)
		}
		// Let the racing goroutine finish any lookup it started, then check.
		close(stop)
		<-done
		if _, err := s.Authenticate(secret); !errors.Is(err, store.ErrInvalidKey) {
			t.Fatalf("revoked key still authenticates: %v", err)
		}
	}
}
