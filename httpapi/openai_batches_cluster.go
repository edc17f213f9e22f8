package httpapi

// The Batch API in cluster mode (docs/cluster.md, "The Batch API"). A file
// or batch stays on the node that made it (in its data dir), and its id
// names that node (batches.Holder). A request naming an id that another
// live node holds is forwarded to it, unchanged and signed (forward), so
// the holder authenticates the client's key and checks its team as it
// would the client's own request; a holder that is not live, or cannot be
// reached, is a 503 naming it, never a 404. A list gathers the lists of
// every live node over /cluster/v1/openai/list, so that it is the same
// through every node. On a single box (Routing nil) all of it is local.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/batches"
	"inferd/cluster"
	"inferd/openai"
)

// Bounds of the Batch API's requests to other nodes.
const (
	// batchForwardWait is what a forwarded request of the Batch API may
	// take on its holder (a create reads its input file through), before
	// forwardGrace.
	batchForwardWait = time.Minute
	// batchContentWait is the same for a file's content, streamed through
	// this node (up to openai.maxFileBytes).
	batchContentWait = 10 * time.Minute
	// batchListTimeout bounds asking one node for its part of a list.
	batchListTimeout = 15 * time.Second
	// batchListBytes bounds a node's answer to it: 10,000 files (OpenAI's
	// page, ten times a team's openai.maxFilesPerTeam) of about 200 bytes,
	// or a page of 100 batches with their metadata.
	batchListBytes = 32 << 20
)

// batchListPath is the route between nodes that a list gathers through.
const batchListPath = clusterPrefix + "openai/list"

// holderUnavailable is the answer for id held by node, which is not live
// or did not answer: a 503 to retry, as the node may come back (its files
// are on its disk), never a 404, which would say the id does not exist.
func holderUnavailable(node, id string) error {
	return &oaiError{status: http.StatusServiceUnavailable, typ: openai.TypeUnavailable, code: "node_unavailable", retryAfter: "5",
		msg: fmt.Sprintf("%s is held by node %s of the cluster, which is unavailable now; retry later", id, node)}
}

// batchHolder says where a request naming id goes: nil here (a single
// box, a request another node forwarded, an id this node made or one that
// names no node); otherwise the live node that holds it.
func (a *api) batchHolder(r *http.Request, id string) ([]cluster.NodeInfo, error) {
	rt := a.opts.Routing
	if rt == nil {
		return nil, nil
	}
	node := batches.Holder(id)
	if node == "" || node == rt.Signer.Node() {
		return nil, nil
	}
	if fwd, err := a.forwarded(r); fwd || err != nil {
		return nil, err // the holder runs it here, never sends it on
	}
	n, ok := rt.Router.Node(node)
	if !ok {
		return nil, holderUnavailable(node, id)
	}
	return []cluster.NodeInfo{n}, nil
}

// batchElsewhere answers r through the node holding id when another node
// holds it, waiting up to wait there, and reports whether it answered
// (passed the holder's answer on, or refused); false: r is this node's.
func (a *api) batchElsewhere(w http.ResponseWriter, r *http.Request, id string, body []byte, wait time.Duration) bool {
	nodes, err := a.batchHolder(r, id)
	switch {
	case err != nil:
		a.openaiError(w, r, err)
		return true
	case nodes == nil:
		return false
	}
	if !a.forward(w, r, body, nodes, a.opts.Routing.forwardLimit(wait)) {
		a.openaiError(w, r, holderUnavailable(nodes[0].Name, id))
	}
	return true
}

// batchListRequest asks a node for its part of a list: its files (What
// "files"), its batches' entries ("batches"), or the batches named by IDs
// ("read"), of those Access reaches. The asking node authenticated the key
// Access is of.
type batchListRequest struct {
	What    string         `json:"what"`
	Access  batches.Access `json:"access"`
	Purpose string         `json:"purpose,omitempty"`
	IDs     []string       `json:"ids,omitempty"`
}

// batchListAnswer is a node's part of a list.
type batchListAnswer struct {
	Files   []batches.File       `json:"files,omitempty"`
	Entries []batches.BatchEntry `json:"entries,omitempty"`
	Batches []batches.Batch      `json:"batches,omitempty"`
}

// clusterBatchList handles POST /cluster/v1/openai/list: this node's part
// of another node's list (batchListRequest).
func (a *api) clusterBatchList(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	if a.opts.Batches == nil {
		a.openaiError(w, r, errNoBatchAPI)
		return
	}
	var req batchListRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, createBodyBytes)).Decode(&req); err != nil {
		a.openaiError(w, r, malformedJSON(err))
		return
	}
	var out batchListAnswer
	switch req.What {
	case "files":
		out.Files = a.opts.Batches.Files(req.Access, req.Purpose)
	case "batches":
		out.Entries = a.opts.Batches.BatchEntries(req.Access)
	case "read":
		var err error
		if out.Batches, err = a.localBatches(req.Access, req.IDs); err != nil {
			a.openaiError(w, r, err)
			return
		}
	default:
		a.openaiError(w, r, badRequest("what must be files, batches or read"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// localBatches reads the batches of ids that acc reaches here, leaving out
// those removed meanwhile (or not acc's).
func (a *api) localBatches(acc batches.Access, ids []string) ([]batches.Batch, error) {
	var out []batches.Batch
	for _, id := range ids {
		b, err := a.opts.Batches.Batch(acc, id)
		switch {
		case errors.Is(err, batches.ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// batchPeers are the live nodes other than this one, whose parts a list
// gathers; none on a single box.
func (a *api) batchPeers() []cluster.NodeInfo {
	rt := a.opts.Routing
	if rt == nil || rt.Nodes == nil {
		return nil
	}
	var out []cluster.NodeInfo
	for _, n := range rt.Nodes() {
		if n.Name != rt.Signer.Node() {
			out = append(out, n)
		}
	}
	return out
}

// gatherBatchLists asks each of nodes for its part of a list, at once,
// and returns their answers in the nodes' order. A node that does not
// answer fails the list (503 naming it): a list without its part would
// say that its files and batches do not exist.
func (a *api) gatherBatchLists(ctx context.Context, nodes []cluster.NodeInfo, req batchListRequest) ([]batchListAnswer, error) {
	out := make([]batchListAnswer, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { out[i], errs[i] = a.askBatchList(ctx, n, req) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			a.log.Warn().Err(err).Str("node", nodes[i].Name).Msg("a node's part of a Batch API list failed")
			return nil, &oaiError{status: http.StatusServiceUnavailable, typ: openai.TypeUnavailable, code: "node_unavailable", retryAfter: "5",
				msg: fmt.Sprintf("node %s of the cluster, which holds part of this list, did not answer; retry later", nodes[i].Name)}
		}
	}
	return out, nil
}

// askBatchList asks node n for its part of a list.
func (a *api) askBatchList(ctx context.Context, n cluster.NodeInfo, req batchListRequest) (batchListAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, batchListTimeout)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return batchListAnswer{}, err
	}
	u := strings.TrimSuffix(n.Advertise, "/") + batchListPath
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return batchListAnswer{}, fmt.Errorf("list on node %s: %w", n.Name, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	a.opts.Routing.Signer.Sign(hr)
	resp, err := (&http.Client{Transport: a.opts.Routing.transport()}).Do(hr)
	if err != nil {
		return batchListAnswer{}, fmt.Errorf("list on node %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, batchListBytes))
	if err != nil {
		return batchListAnswer{}, fmt.Errorf("list on node %s: %w", n.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return batchListAnswer{}, fmt.Errorf("list on node %s: HTTP %d: %s", n.Name, resp.StatusCode, truncate(string(b), 200))
	}
	var out batchListAnswer
	if err := json.Unmarshal(b, &out); err != nil {
		return batchListAnswer{}, fmt.Errorf("list on node %s: %w", n.Name, err)
	}
	return out, nil
}

// allFiles is Batches.Files through every live node, newest first.
func (a *api) allFiles(r *http.Request, acc batches.Access, purpose string) ([]batches.File, error) {
	files := a.opts.Batches.Files(acc, purpose)
	peers := a.batchPeers()
	if len(peers) == 0 {
		return files, nil
	}
	parts, err := a.gatherBatchLists(r.Context(), peers, batchListRequest{What: "files", Access: acc, Purpose: purpose})
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		files = append(files, p.Files...)
	}
	slices.SortFunc(files, func(x, y batches.File) int { return batches.NewestFirst(x.CreatedAt, y.CreatedAt, x.ID, y.ID) })
	return files, nil
}

// batchEntry is a batch of a list and the node that listed it ("": this
// one).
type batchEntry struct {
	batches.BatchEntry
	node cluster.NodeInfo
}

// allBatchEntries is Batches.BatchEntries through every live node, newest
// first, each with the node that holds it.
func (a *api) allBatchEntries(r *http.Request, acc batches.Access) ([]batchEntry, error) {
	var out []batchEntry
	for _, e := range a.opts.Batches.BatchEntries(acc) {
		out = append(out, batchEntry{BatchEntry: e})
	}
	peers := a.batchPeers()
	if len(peers) == 0 {
		return out, nil
	}
	parts, err := a.gatherBatchLists(r.Context(), peers, batchListRequest{What: "batches", Access: acc})
	if err != nil {
		return nil, err
	}
	for i, p := range parts {
		for _, e := range p.Entries {
			out = append(out, batchEntry{e, peers[i]})
		}
	}
	slices.SortFunc(out, func(x, y batchEntry) int { return batches.NewestFirst(x.CreatedAt, y.CreatedAt, x.ID, y.ID) })
	return out, nil
}

// readBatches reads the batches of a page, each from the node that listed
// it, in the page's order; one removed meanwhile is left out.
func (a *api) readBatches(r *http.Request, acc batches.Access, page []batchEntry) ([]batches.Batch, error) {
	var local []string
	remote := map[string][]string{}
	var nodes []cluster.NodeInfo
	for _, e := range page {
		switch {
		case e.node.Name == "":
			local = append(local, e.ID)
		default:
			if _, ok := remote[e.node.Name]; !ok {
				nodes = append(nodes, e.node)
			}
			remote[e.node.Name] = append(remote[e.node.Name], e.ID)
		}
	}
	found := map[string]batches.Batch{}
	mine, err := a.localBatches(acc, local)
	if err != nil {
		return nil, err
	}
	for _, b := range mine {
		found[b.ID] = b
	}
	for _, n := range nodes {
		parts, err := a.gatherBatchLists(r.Context(), []cluster.NodeInfo{n}, batchListRequest{What: "read", Access: acc, IDs: remote[n.Name]})
		if err != nil {
			return nil, err
		}
		for _, b := range parts[0].Batches {
			found[b.ID] = b
		}
	}
	out := make([]batches.Batch, 0, len(page))
	for _, e := range page {
		if b, ok := found[e.ID]; ok {
			out = append(out, b)
		}
	}
	return out, nil
}
