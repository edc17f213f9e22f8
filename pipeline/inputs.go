package pipeline

import (
	"fmt"

	"inferd/store"
)

// RefusedInput: the request's body or inputs are not what every door
// accepts (Err, an *InputError, says what, for users): text that is not
// UTF-8, inputs nested past Config.MaxInputDepth. The checks are the
// pipeline's, so that no door passes what another refuses (issue 41: the
// OpenAI routes and /run passed bytes that are not UTF-8 to the model,
// /run any depth of nesting).
const RefusedInput Kind = -3

// InputError is what is wrong with a request's body or inputs, a text
// written for users.
type InputError struct{ msg string }

func (e *InputError) Error() string { return e.msg }

// checkInputs checks req's body as the door read it (its offsets are the
// client's) and the model's inputs, or the body where the door set none
// yet (an OpenAI request, whose body is the inputs).
func (p *Pipeline) checkInputs(req Request) *Refusal {
	text := req.Body
	if text == nil {
		text = req.Call.Inputs
	}
	if i := store.InvalidUTF8(text); i >= 0 {
		return &Refusal{Kind: RefusedInput, Err: &InputError{fmt.Sprintf("request body is not valid UTF-8 at byte %d", i)}}
	}
	inputs := req.Call.Inputs
	if len(inputs) == 0 {
		inputs = req.Body
	}
	if max := p.cfg.MaxInputDepth; max > 0 && DepthExceeds(inputs, max) {
		return &Refusal{Kind: RefusedInput, Err: &InputError{fmt.Sprintf("the request's inputs nest deeper than %d levels", max)}}
	}
	return nil
}

// DepthExceeds reports whether the JSON value v nests arrays and objects
// more than max levels deep (the value itself, an object, is level 1). v
// must be valid JSON (a door's decoder has checked it); only brackets
// outside strings count.
func DepthExceeds(v []byte, max int) bool {
	depth := 0
	inString, escaped := false, false
	for _, c := range v {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			if depth > max {
				return true
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return false
}
