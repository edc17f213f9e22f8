package status

import (
	"io/fs"
	"net/http"
	"path"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/web"
)

// pageCSP lets the status page load only its own script and stylesheet and
// talk only to this server: no inline script, nothing from elsewhere.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// pageHandlers serve the status page (GET /) and its files (GET
// /assets/:name). The page itself holds no data; it asks /v1/status with the
// user's key.
func pageHandlers() (page, assets httprouter.Handle) {
	files := web.Files()
	serve := func(w http.ResponseWriter, r *http.Request, name string) {
		if _, err := fs.Stat(files, name); err != nil || name == "index.html" && r.URL.Path != "/" {
			respond.JSON(w, http.StatusNotFound, respond.Refusal(respond.CodeNotFound, "no such file: "+respond.Truncate(name, 100)))
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, files, name)
	}
	page = func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
		serve(w, r, "index.html")
	}
	assets = func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		serve(w, r, path.Base(ps.ByName("name")))
	}
	return page, assets
}
