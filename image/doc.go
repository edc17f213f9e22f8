// Package image keeps the OCI images projects run in (a project's image:
// field; docs/images.md). An image arrives as a file, never from a
// registry: an OCI image layout (a directory, or a tar of one, as
// `skopeo copy ... oci-archive:` writes) or a `docker save` archive.
// Import reads it through go-containerregistry, verifies every blob
// against its digest (each layer's compressed bytes against the manifest,
// its uncompressed bytes against the config's diff_ids, the manifest and
// config themselves), refuses layers that would write outside the image's
// root (entries named ../ or /, links that climb out, device nodes), and
// only then unpacks the layers, whiteouts and opaque directories applied,
// into one read-only root per distinct layer chain.
//
// On disk, under the Store's directory:
//
//	blobs/sha256/<hex>   the verified blobs: layers as the archive held them, manifests, configs
//	images/<hex>.json    one image: its config's digest names it
//	roots/<chain>/       an unpacked root, named by its layers' chain ID
//	tmp/                 work in progress; emptied by Open
//
// Nothing is visible under blobs/, images/ or roots/ before it is whole:
// each is made under tmp/ and renamed into place, so an import that fails
// (a truncated archive, a digest that does not match, a hostile entry)
// leaves nothing behind. A lock file serialises imports, removals and
// garbage collection between the processes that share the directory (the
// daemon and the CLI).
package image
