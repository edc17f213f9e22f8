package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPromisesNameTestsThatExist holds the pages that point each promise
// at its test (docs/promises.md, docs/reliability.md, docs/security.md) to
// tests that exist: a test renamed or deleted must take its line along, or
// the promise is left guarded by nothing while the page says otherwise.
func TestPromisesNameTestsThatExist(t *testing.T) {
	defined := map[string]bool{}
	testFunc := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	suite, err := os.ReadFile("store/storetest/storetest.go")
	if err != nil {
		t.Fatal(err)
	}
	contractCase := regexp.MustCompile(`\{"([A-Za-z0-9]+)", test`)
	cases := map[string]bool{}
	for _, m := range contractCase.FindAllStringSubmatch(string(suite), -1) {
		cases[m[1]] = true
	}
	if len(defined) < 100 || len(cases) < 10 {
		t.Fatalf("found %d tests and %d contract cases: the walk or the patterns are wrong", len(defined), len(cases))
	}

	named := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)")
	contract := regexp.MustCompile("contract `([A-Z][A-Za-z0-9]*)`")
	for _, page := range []string{"docs/promises.md", "docs/reliability.md", "docs/security.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !defined[m[1]] && !slices.Contains(missing, m[1]) {
				missing = append(missing, m[1])
			}
		}
		for _, m := range contract.FindAllStringSubmatch(string(b), -1) {
			if !cases[m[1]] && !slices.Contains(missing, "contract "+m[1]) {
				missing = append(missing, "contract "+m[1])
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s names tests that no _test.go defines: %s", page, strings.Join(missing, ", "))
		}
	}
}
