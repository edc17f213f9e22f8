// Package storetest is the contract suite of store.Store: the rules of the
// store package's interfaces written as tests, run by every implementation's
// own tests (store/bolt, store/etcd, store/memstore) through Run, in the spirit of
// litestream's RunWithReplicaClient. It covers teams, keys and projects
// (create, read, update, delete), isolation by team, call state
// transitions and their indexes, expiry, concurrent writers, close and
// reopen. What only one implementation has (bbolt's file format, a cache)
// stays in that implementation's tests.
package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"inferd/store"
)

// Opener starts one data set of an implementation for a test and returns a
// function that opens a store over it: the first call opens it empty, and
// each later call, made after the suite has closed the store the previous
// call returned, opens it again with everything committed so far, as a
// daemon restart finds its data. now is the clock the stores must use to
// stamp records (Created, Updated, Revoked, a final call's missing
// Finished). Report a failure to open with t.Fatal.
type Opener func(t *testing.T, now func() time.Time) (open func() store.Store)

// Run runs the whole contract suite against the implementation opened by
// newStore, each case in a subtest of its own with its own data set.
func Run(t *testing.T, newStore Opener) {
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, &env{newStore: newStore, clock: newClock(), reopens: map[store.Store]func() store.Store{}})
		})
	}
}

var suite = []struct {
	name string
	fn   func(*testing.T, *env)
}{
	// Teams and keys.
	{"EnsureTeamAndListTeams", testEnsureTeamAndListTeams},
	{"CreateAuthenticateRevokeKey", testCreateAuthenticateRevokeKey},
	{"AuthenticateRejectsBadSecrets", testAuthenticateRejectsBadSecrets},
	{"CreateKeyValidates", testCreateKeyValidates},
	{"ListKeysSortedByTeamThenCreated", testListKeysSortedByTeamThenCreated},
	{"RevokeTakesEffectDespiteConcurrentAuthentication", testRevokeTakesEffectDespiteConcurrentAuthentication},
	// Tenancy.
	{"TeamQuotaSetGetAndReopen", testTeamQuotaSetGetAndReopen},
	{"ScopedKeyKeepsItsLimits", testScopedKeyKeepsItsLimits},
	{"ProjectCapsAreKeptAndValidated", testProjectCapsAreKeptAndValidated},
	// Projects.
	{"ProjectByModelKeySeesEveryWriteAtOnce", testProjectByModelKeySeesEveryWriteAtOnce},
	{"PutProjectReportsCreatedUpdatedUnchanged", testPutProjectReportsCreatedUpdatedUnchanged},
	{"PutProjectRejectsInvalidAndCreatesTeam", testPutProjectRejectsInvalidAndCreatesTeam},
	{"PutProjectModelKeyConflict", testPutProjectModelKeyConflict},
	{"PutProjectsIsAllOrNothing", testPutProjectsIsAllOrNothing},
	{"PutProjectMovesModelKeyIndex", testPutProjectMovesModelKeyIndex},
	{"ReapplyKeepsWhatTheManifestDidNotChange", testReapplyKeepsWhatTheManifestDidNotChange},
	{"UpdateProject", testUpdateProject},
	{"UpdateProjectConcurrentIncrementsAllApply", testUpdateProjectConcurrentIncrementsAllApply},
	{"OnProjectChangeFiresAfterCommit", testOnProjectChangeFiresAfterCommit},
	{"DeleteAndListProjects", testDeleteAndListProjects},
	{"RecordsHandedOutAreCopies", testRecordsHandedOutAreCopies},
	// Isolation by team.
	{"ReadsByTeamSeeOnlyThatTeam", testReadsByTeamSeeOnlyThatTeam},
	// Calls.
	{"CallStateTransitions", testCallStateTransitions},
	{"SaveCallAsyncAppliesInQueueOrder", testSaveCallAsyncAppliesInQueueOrder},
	{"SaveCallRejectsBadIDAndHonoursContext", testSaveCallRejectsBadIDAndHonoursContext},
	{"PendingCallsOldestFirst", testPendingCallsOldestFirst},
	{"RecentCallsNewestFirstByTeamWithoutInputsOrOutputs", testRecentCallsNewestFirstByTeamWithoutInputsOrOutputs},
	{"RecentCallsFollowStateChangesAcrossPolls", testRecentCallsFollowStateChangesAcrossPolls},
	// Payloads.
	{"PayloadsRoundTripByteForByte", testPayloadsRoundTripByteForByte},
	{"WriteWithoutInputsKeepsThemOutputsReplaced", testWriteWithoutInputsKeepsThemOutputsReplaced},
	{"FinalWriteWithPayloadsReadsBackEverywhere", testFinalWriteWithPayloadsReadsBackEverywhere},
	{"PayloadReadsOfUnknownOrExpiredCalls", testPayloadReadsOfUnknownOrExpiredCalls},
	// Call control.
	{"IdempotencyKeyFindsCallPerTeamUntilExpiry", testIdempotencyKeyFindsCallPerTeamUntilExpiry},
	{"CallControlFieldsSurviveReopen", testCallControlFieldsSurviveReopen},
	// Webhook outbox.
	{"CallWritesQueueWebhookDeliveriesOnce", testCallWritesQueueWebhookDeliveriesOnce},
	{"WebhookDefaultsToCompleted", testWebhookDefaultsToCompleted},
	{"WebhookSecretStableUntilRotated", testWebhookSecretStableUntilRotated},
	// Expiry.
	{"ExpireCallsDeletesOnlyFinishedBefore", testExpireCallsDeletesOnlyFinishedBefore},
	// The usage ledger.
	{"CallUsageRollsUpOnceWithTheFinalWrite", testCallUsageRollsUpOnceWithTheFinalWrite},
	{"UsageCountsSaturateNeverWrap", testUsageCountsSaturateNeverWrap},
	{"AddUsageSumsByHourTeamAndProject", testAddUsageSumsByHourTeamAndProject},
	{"ExpireUsageDropsOnlyOlderHours", testExpireUsageDropsOnlyOlderHours},
	// Concurrent writers.
	{"ConcurrentWritersAreAllDurable", testConcurrentWritersAreAllDurable},
	// Close and reopen.
	{"CloseDrainsQueuedWrites", testCloseDrainsQueuedWrites},
	{"ReopenKeepsTeamsKeysProjectsAndCalls", testReopenKeepsTeamsKeysProjectsAndCalls},
	{"ReopenKeepsRevocationsAndFinishedCalls", testReopenKeepsRevocationsAndFinishedCalls},
	{"ClosedStoreReturnsErrClosed", testClosedStoreReturnsErrClosed},
}

// env is one test's access to the implementation.
type env struct {
	newStore Opener
	clock    *clock
	mu       sync.Mutex
	reopens  map[store.Store]func() store.Store
}

// open returns a store over a new, empty data set, closed when the test
// ends.
func (e *env) open(t *testing.T) store.Store {
	t.Helper()
	return e.track(t, e.newStore(t, e.clock.Now))
}

// reopen closes s and returns a store over the same data.
func (e *env) reopen(t *testing.T, s store.Store) store.Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close before reopening: %v", err)
	}
	e.mu.Lock()
	open := e.reopens[s]
	e.mu.Unlock()
	return e.track(t, open)
}

func (e *env) track(t *testing.T, open func() store.Store) store.Store {
	s := open()
	t.Cleanup(func() { _ = s.Close() })
	e.mu.Lock()
	e.reopens[s] = open
	e.mu.Unlock()
	return s
}

// clock is the stores' clock: it moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Project returns a valid project with every default, run by
// /usr/bin/model, whose modelKey is "key-"+id: the project of the suite's
// tests and of the implementations' own.
func Project(id, team string) store.Project {
	p := store.NewProject(id, team)
	p.Model.Command = []string{"/usr/bin/model", "--port", "$PORT"}
	p.Model.KeyHash = store.HashModelKey("key-" + id)
	return p
}

// newCallID returns a call id shaped like the scheduler's: "call_" + a
// UUIDv7, so ids sort in creation order.
func newCallID() string { return "call_" + uuid.Must(uuid.NewV7()).String() }

func flip(c byte) string {
	if c == 'a' {
		return "b"
	}
	return "a"
}
