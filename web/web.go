// Package web holds the status page: one HTML file, its stylesheet and its
// script, embedded in the binary. No build step and nothing fetched from
// elsewhere: the page reads the JSON under /v1/status with the API key the
// user types in, which it keeps in the tab's sessionStorage.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files returns the page's files: index.html, app.js and style.css.
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // "static" is embedded above: cannot happen
	}
	return sub
}
