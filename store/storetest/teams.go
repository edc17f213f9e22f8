package storetest

import (
	"errors"
	"testing"

	"inferd/store"
)

func testEnsureTeamAndListTeams(t *testing.T, e *env) {
	s := e.open(t)
	for _, tc := range []struct {
		id      string
		created bool
	}{{"b", true}, {"a", true}, {"b", false}} {
		created, err := s.EnsureTeam(tc.id)
		if err != nil || created != tc.created {
			t.Errorf("EnsureTeam(%s) = %v, %v; want %v", tc.id, created, err, tc.created)
		}
	}
	var ve *store.ValidationError
	if _, err := s.EnsureTeam("Not A Team"); !errors.As(err, &ve) || ve.Field != "teamId" {
		t.Errorf("EnsureTeam(invalid) = %v, want a validation error on teamId", err)
	}
	teams, err := s.ListTeams()
	if err != nil || len(teams) != 2 || teams[0].ID != "a" || teams[1].ID != "b" || !teams[0].Created.Equal(e.clock.Now()) {
		t.Errorf("ListTeams = %+v, %v; want a then b, stamped now", teams, err)
	}
}
