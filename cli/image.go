package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"inferd/image"
	"inferd/store"
)

// imageCommand imports, lists and removes the images projects run in.
type imageCommand struct{ env *env }

func (c *imageCommand) Usage() string {
	return `Usage:
  inferd [global flags] image import FILE
  inferd [global flags] image list
  inferd [global flags] image rm ID
  inferd [global flags] image gc

image import takes an image into this node's data directory: FILE is an OCI
image layout (a directory, or a tar of one: skopeo copy docker://... 
oci-archive:FILE) or a docker save archive. Every blob is checked against
its digest, and an archive with an entry that would write outside the
image's root (../, absolute names, links that climb out, device nodes) is
refused, leaving nothing behind. It prints the image's ID, which a project's
image: may name (apply imports a path it names itself).

image list prints each image with its ID, size and the projects that use it.
image rm ID removes an image no project uses, and the layers no other image
shares; image gc removes the layers and roots no image uses.

In cluster mode each node keeps its own images: import the file on every
node that may run the project (docs/images.md).
`
}

func (c *imageCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "image", args,
		subcommand{"import", c.importFile}, subcommand{"list", c.list},
		subcommand{"rm", c.remove}, subcommand{"gc", c.gc})
}

// images opens this node's image store.
func (c *imageCommand) images() (*image.Store, error) {
	cfg, err := c.env.dataConfig()
	if err != nil {
		return nil, err
	}
	return image.Open(cfg.ImageDir())
}

func (c *imageCommand) importFile(ctx context.Context, args []string) error {
	files, err := parseSub(subFlags("image import"), args)
	if err != nil {
		return err
	}
	if len(files) != 1 {
		return fmt.Errorf("%w: image import needs exactly one FILE", errUsage)
	}
	s, err := c.images()
	if err != nil {
		return err
	}
	im, err := s.Import(ctx, files[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "imported %s: %s (%d layers, %s unpacked)\n", files[0], im.ID, len(im.Layers), humanBytes(uint64(im.RootBytes)))
	return nil
}

func (c *imageCommand) list(ctx context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("image list"), args); err != nil {
		return err
	}
	cfg, err := c.env.dataConfig()
	if err != nil {
		return err
	}
	// Read as it is: no lock to wait for while an import runs.
	all, err := image.Peek(cfg.ImageDir()).List()
	if err != nil {
		return err
	}
	users, err := c.users(ctx)
	if err != nil {
		users = nil // no daemon, no data file: list without the projects
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLAYERS\tBLOBS\tUNPACKED\tIMPORTED\tSOURCE\tPROJECTS")
	for _, im := range all {
		projects := "-"
		if users != nil {
			projects = strings.Join(users[im.ID], ",")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", im.Short(), len(im.Layers), humanBytes(uint64(im.Bytes())), humanBytes(uint64(im.RootBytes)),
			im.Imported.Format(time.DateTime), im.Source, projects)
	}
	return tw.Flush()
}

func (c *imageCommand) remove(ctx context.Context, args []string) error {
	ids, err := parseSub(subFlags("image rm"), args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("%w: image rm needs exactly one image ID", errUsage)
	}
	s, err := c.images()
	if err != nil {
		return err
	}
	im, err := s.Get(ids[0])
	if err != nil {
		return err
	}
	users, err := c.users(ctx)
	if err != nil {
		return fmt.Errorf("cannot tell which projects use %s, so it stays: %w", im.Short(), err)
	}
	if ps := users[im.ID]; len(ps) > 0 {
		return fmt.Errorf("image %s is used by project %s: point them at another image (or delete them) first", im.Short(), strings.Join(ps, ", "))
	}
	_, freed, err := s.Remove(im.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "removed image %s; freed %d blobs (%s) and %d roots (%s)\n", im.Short(), freed.Blobs, humanBytes(uint64(freed.BlobBytes)), freed.Roots, humanBytes(uint64(freed.RootBytes)))
	return nil
}

func (c *imageCommand) gc(ctx context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("image gc"), args); err != nil {
		return err
	}
	s, err := c.images()
	if err != nil {
		return err
	}
	freed, err := s.GC()
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "freed %d blobs (%s) and %d roots (%s)\n", freed.Blobs, humanBytes(uint64(freed.BlobBytes)), freed.Roots, humanBytes(uint64(freed.RootBytes)))
	return nil
}

// users maps each image ID to the projects (team/project) whose image:
// names it, as the daemon (or the data file) has them.
func (c *imageCommand) users(ctx context.Context) (map[string][]string, error) {
	var out struct {
		Results []store.Project `json:"results"`
	}
	if err := c.env.withAdmin(func(a *adminClient) error { return a.call(ctx, "GET", "/admin/projects", nil, &out) }); err != nil {
		return nil, err
	}
	cfg, err := c.env.dataConfig()
	if err != nil {
		return nil, err
	}
	s := image.Peek(cfg.ImageDir())
	users := map[string][]string{}
	for _, p := range out.Results {
		ref := p.Model.Image
		if ref == "" {
			continue
		}
		id := ref
		if im, err := s.Get(ref); err == nil {
			id = im.ID
		} else if !strings.HasPrefix(ref, "sha256:") {
			continue // a path not imported yet: its first replica imports it
		}
		users[id] = append(users[id], p.TeamID+"/"+p.ID)
	}
	return users, nil
}

// importImages imports the images the projects name by path into this
// node's store and names them by ID instead, so that the daemon starts
// their replicas from what was checked here; it says so on stdout.
func importImages(ctx context.Context, e *env, projects []store.Project) error {
	var s *image.Store
	for i := range projects {
		m := &projects[i].Model
		if m.Image == "" || strings.HasPrefix(m.Image, "sha256:") {
			continue
		}
		if s == nil {
			cfg, err := e.dataConfig()
			if err != nil {
				return err
			}
			if s, err = image.Open(cfg.ImageDir()); err != nil {
				return err
			}
		}
		im, err := s.Import(ctx, m.Image)
		if err != nil {
			return fmt.Errorf("project %s: %w", projects[i].ID, err)
		}
		fmt.Fprintf(e.stdout, "project %s: image %s from %s\n", projects[i].ID, im.Short(), m.Image)
		m.Image = im.ID
	}
	return nil
}
