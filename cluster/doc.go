// Package cluster makes several inferd nodes one service on etcd (cluster
// mode, docs/cluster.md): node membership under a lease, one leader by etcd
// election that places each project's replicas on nodes and hands the calls
// of a lost node to others, routing of starts to the nodes a project is
// placed on, and the authenticated API between nodes.
//
// The records every node shares live in store/etcd; this package adds the
// keys below, under the same prefix:
//
//	nodes/<name>        NodeInfo, put under the node's lease (TTL LeaseTTL): a node is
//	                    alive while its key exists
//	election/           the leader election (client/v3/concurrency)
//	placement/<project> Placement, written by the leader, fenced on its election key
//	assign/<node>/<id>  "" : the leader handed call <id> to <node> (it also rewrote
//	                    pending/<id> to name <node>); the node adopts the call and
//	                    deletes the key
//
// A node's own call writes are fenced on its lease (store/etcd compares
// nodes/<name>'s lease with the one the call was taken under), so a node
// that was cut off and came back cannot write the result of a call that
// was meanwhile handed to another node.
package cluster
