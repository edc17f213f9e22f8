package httpapi

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"inferd/batches"
	"inferd/store"
)

// GET /v1/files pages the key's files as OpenAI does: newest first, limit a
// page, after the last id of the page before, has_more, first_id and
// last_id; another team's files are not listed.
func TestListFilesPagesNewestFirst(t *testing.T) {
	env, _ := batchEnv(t, Options{})
	var ids []string
	for range 5 {
		rec := upload(env, keyAcme, `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"echo"}}`)
		ids = append(ids, decode[batches.File](t, rec).ID)
	}
	upload(env, keyOther, `{}`) // another team's
	list := func(query string) listPage[batches.File] {
		rec := serve(env.h, http.MethodGet, "/v1/files"+query, "", bearer(keyAcme)...)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET /v1/files%s: %d %s", query, rec.Code, rec.Body)
		}
		return decode[listPage[batches.File]](t, rec)
	}
	idsOf := func(p listPage[batches.File]) []string {
		var out []string
		for _, f := range p.Data {
			out = append(out, f.ID)
		}
		return out
	}
	all := list("")
	if len(all.Data) != 5 || all.HasMore || all.Object != "list" {
		t.Fatalf("all: %+v", all)
	}
	// Created within the same second, they are ordered by id then: walk
	// the pages and find every file once, in the listing's order.
	var walked []string
	after := ""
	for pages := 0; ; pages++ {
		q := "?limit=2"
		if after != "" {
			q += "&after=" + after
		}
		p := list(q)
		walked = append(walked, idsOf(p)...)
		if len(p.Data) > 0 && (*p.FirstID != p.Data[0].ID || *p.LastID != p.Data[len(p.Data)-1].ID) {
			t.Errorf("page %d: first_id %v, last_id %v of %v", pages, *p.FirstID, *p.LastID, idsOf(p))
		}
		if !p.HasMore {
			break
		}
		after = *p.LastID
	}
	if !slices.Equal(walked, idsOf(all)) {
		t.Errorf("pages walked %v, want %v", walked, idsOf(all))
	}
	slices.Sort(ids)
	got := slices.Clone(idsOf(all))
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Errorf("listed %v, uploaded %v", got, ids)
	}
	reversed := slices.Clone(idsOf(all))
	slices.Reverse(reversed)
	if asc := idsOf(list("?order=asc")); !slices.Equal(asc, reversed) {
		t.Errorf("order=asc: %v", asc)
	}
	for _, q := range []string{"?limit=0", "?limit=x", "?after=file-nope", "?order=sideways"} {
		oaiErrorReply(t, serve(env.h, http.MethodGet, "/v1/files"+q, "", bearer(keyAcme)...), http.StatusBadRequest, "invalid_request_error", "")
	}
}

// GET /v1/batches lists the key's batches, newest first, paged.
func TestListBatchesPages(t *testing.T) {
	env, _ := batchEnv(t, Options{})
	var made []string
	for range 3 {
		f := decode[batches.File](t, upload(env, keyAcme, `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"echo","messages":[]}}`))
		rec := serve(env.h, http.MethodPost, "/v1/batches", `{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`, bearer(keyAcme)...)
		made = append(made, decode[batches.Batch](t, rec).ID)
	}
	rec := serve(env.h, http.MethodGet, "/v1/batches?limit=2", "", bearer(keyAcme)...)
	p := decode[listPage[batches.Batch]](t, rec)
	if rec.Code != http.StatusOK || len(p.Data) != 2 || !p.HasMore {
		t.Fatalf("first page: %d %s", rec.Code, rec.Body)
	}
	rec = serve(env.h, http.MethodGet, "/v1/batches?limit=2&after="+*p.LastID, "", bearer(keyAcme)...)
	q := decode[listPage[batches.Batch]](t, rec)
	if len(q.Data) != 1 || q.HasMore {
		t.Fatalf("second page: %s", rec.Body)
	}
	got := []string{p.Data[0].ID, p.Data[1].ID, q.Data[0].ID}
	slices.Sort(got)
	slices.Sort(made)
	if !slices.Equal(got, made) {
		t.Errorf("listed %v, made %v", got, made)
	}
	if rec := serve(env.h, http.MethodGet, "/v1/batches", "", bearer(keyOther)...); len(decode[listPage[batches.Batch]](t, rec).Data) != 0 {
		t.Errorf("another team sees %s", rec.Body)
	}
}

// GET /v1/models/{model} answers a model the key may call, by id or alias
// (a "/" in it included), named as asked; anything else is 404 in OpenAI's
// shape, as a request naming it would be. A project made later is found
// at once.
func TestGetModelResolvesAsARequestWould(t *testing.T) {
	env := openaiEnv(t, Options{})
	for _, tc := range []struct {
		path, want, owner string
	}{
		{"/v1/models/llm", "llm", "acme"},
		{"/v1/models/llama", "llama", "acme"},
	} {
		rec := serve(env.h, http.MethodGet, tc.path, "", bearer(keyAcme)...)
		m := decode[modelEntry](t, rec)
		if rec.Code != http.StatusOK || m.ID != tc.want || m.OwnedBy != tc.owner || m.Object != "model" {
			t.Errorf("GET %s: %d %s", tc.path, rec.Code, rec.Body)
		}
	}
	for _, path := range []string{"/v1/models/secret-llm", "/v1/models/nope", "/v1/models/org/model"} {
		oaiErrorReply(t, serve(env.h, http.MethodGet, path, "", bearer(keyAcme)...), http.StatusNotFound, "invalid_request_error", "model_not_found")
	}
	p := testProject("new-llm", "acme")
	p.Model.Protocol, p.Model.Aliases = store.ProtocolOpenAI, []string{"org/model"}
	env.store.addProject(t, p, "mk-new-llm")
	if rec := serve(env.h, http.MethodGet, "/v1/models/org/model", "", bearer(keyAcme)...); rec.Code != http.StatusOK || decode[modelEntry](t, rec).ID != "org/model" {
		t.Errorf("an alias with a slash, of a project made after the first request: %d %s", rec.Code, rec.Body)
	}
}

// A path of the OpenAI routes that no route takes, or a method none
// answers, is answered in OpenAI's error shape, as the SDKs read only it.
func TestUnknownOpenAIRoutesAnswerInOpenAIsShape(t *testing.T) {
	env := openaiEnv(t, Options{})
	oaiErrorReply(t, serve(env.h, http.MethodGet, "/v1/chat/nothing", "", bearer(keyAcme)...), http.StatusNotFound, "invalid_request_error", codeNotFound)
	oaiErrorReply(t, serve(env.h, http.MethodDelete, "/v1/chat/completions", "", bearer(keyAcme)...), http.StatusMethodNotAllowed, "invalid_request_error", codeMethodNotAllowed)
	if rec := serve(env.h, http.MethodGet, "/v1/nothing", "", bearer(keyAcme)...); rec.Code != http.StatusNotFound || decode[errorBody](t, rec).Error.Code != codeNotFound {
		t.Errorf("a path of the project API: %d %s", rec.Code, rec.Body)
	}
}

// A project of protocol http that the key's team owns, named as a model,
// is refused saying what it is and how to call it, not as a model that
// does not exist; another team's is still one that does not exist.
func TestAnHTTPProjectNamedAsAModelSaysHowToCallIt(t *testing.T) {
	env := openaiEnv(t, Options{})
	rec := serve(env.h, http.MethodPost, "/v1/chat/completions", `{"model":"echo","messages":[]}`, bearer(keyAcme)...)
	e := oaiErrorReply(t, rec, http.StatusBadRequest, "invalid_request_error", "model_not_supported")
	if msg, _ := e["message"].(string); !strings.Contains(msg, "protocol http") || !strings.Contains(msg, "/run/echo/") {
		t.Errorf("message %q", msg)
	}
	oaiErrorReply(t, serve(env.h, http.MethodPost, "/v1/chat/completions", `{"model":"echo","messages":[]}`, bearer(keyOther)...),
		http.StatusNotFound, "invalid_request_error", "model_not_found")
	oaiErrorReply(t, serve(env.h, http.MethodGet, "/v1/models/echo", "", bearer(keyAcme)...), http.StatusNotFound, "invalid_request_error", "model_not_found")
}
