// Package scheduler runs inference calls on replicas of each project's model
// server: it queues calls per project, boots and stops replicas within the
// project's bounds and the machine's CPU slots and GPUs, dispatches calls,
// enforces the boot, inference and idle timeouts, and records every call's
// life in the store.
//
// # Ownership
//
// One goroutine, the loop started by [Scheduler.Run], owns all scheduler
// state: the per-project queues, the replicas, the CPU slots and GPU
// assignments, the timers and the table of live calls. Nothing else reads or
// writes that state, so none of it is locked. Callers reach the loop through
// request/reply channels (Submit, Lookup, Snapshot, LiveCalls); everything
// that can block (launching, watching and stopping processes, inference
// requests, store reads, store commits) runs in goroutines that report back
// as events through an inbox that never blocks its sender. Every such
// goroutine is started by the loop, tracked by one WaitGroup and ends on its
// own or when the loop cancels it, and Run returns only after all of them
// have ended. Time comes from an injected [Clock] so that every timing rule
// can be tested without sleeping.
//
// # Durability
//
// The writes of one call (its first, running, final) are all queued from the
// loop through Store.SaveCallAsync, which applies writes in the order queued,
// so they can never be reordered. A call's states and the moves between them
// are in lifecycle.go. Both starts, Submit and SubmitWait, go through one
// admission path (start.go) and return a call that is not finished only after
// its first write has committed; a queued call is dispatched only after that;
// and a call's done channel is closed only after its final write has
// committed. A synchronous start's call is written first when its wait ends,
// or only once, with its result, if it finishes within the wait.
//
// # Cluster mode
//
// On a node of a cluster (cluster.go) the store refuses the writes of a
// call that is no longer this node's (store.ErrFenced): the loop then
// forgets the call without another write, as it forgets every live call
// when the node's lease lapses (Abandon); the leader's handed calls come
// in through Adopt; and Config.Share bounds each project's replicas on
// this node by the leader's placement.
package scheduler
