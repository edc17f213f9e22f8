// Package openai is the wire format of OpenAI-compatible servers as inferd
// needs it (docs/openai.md): a request's model and stream options, the
// token usage of a reply or a stream, Server-Sent Events as such servers
// send them, and the error body. It holds no state and speaks to nothing:
// httpapi reads requests and writes errors with it, the protocol client
// reads replies with it, package batches reads batch lines with it.
package openai
