package protocol

import (
	"encoding/json"
	"strings"

	"inferd/scheduler/backend"
)

// warmReply is what a warmup call of an http model answers: its replica is
// ready, so it is warm (Potassium itself answers the same).
var warmReply = json.RawMessage(`{"warm":true}`)

// inferPath is the path a call to route goes to: InferPath for no route; a
// potassium app's own route (its handlers are by route), and an OpenAI
// server's path (the API path the client asked for); for http, the
// route under InferPath. Routes come checked from the API: "/" and path
// segments of [A-Za-z0-9._-].
func (c *Client) inferPath(route string) string {
	switch {
	case route == "":
		return c.cfg.InferPath
	case c.potassium, c.openai:
		return route
	case route == "/":
		return c.cfg.InferPath
	default:
		return strings.TrimSuffix(c.cfg.InferPath, "/") + route
	}
}

// answersItself reports whether a call to route is answered without the
// model, and with what: the warmup route of an http or openai model.
func (c *Client) answersItself(route string) (json.RawMessage, bool) {
	if route == backend.WarmupRoute && !c.potassium {
		return warmReply, true
	}
	return nil, false
}
