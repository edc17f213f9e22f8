// Package pipeline is the one path every call takes, whatever door it came
// in by (the Banana API, /run, the OpenAI routes):
//
//	door (decode) → resolve key + project → admit (ordered hooks) → place
//	             → start → await | stream → outcome → door (render)
//
// A door decodes its dialect into a Request and renders the Outcome (or the
// Refusal) in its dialect; it never talks to the scheduler's admission, the
// cluster or the budgets itself. Resolve is one lookup of key and project
// however the door names the project (a modelKey, a project id, an OpenAI
// model name or alias), the last from a per-team index kept until a project
// changes, so that its cost does not grow with the team's projects. Admit
// runs the hooks in order, each named and counting its own refusals
// (Counts). Place is a Placer: Local on one box, the cluster's forwarder in
// cluster mode, which answers the request on the node that runs it; no door
// knows which it has. Start makes the durable call; Await waits on its
// completion signal, bounded, and says why it stopped.
//
// The package knows HTTP only as far as a forward needs it (the request and
// its writer travel to the Placer); it imports nothing of httpapi.
package pipeline
