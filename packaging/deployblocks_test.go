package packaging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// markedBlock returns the text of the one fenced block of file whose info
// string is lang and marker (internal/docblock), and fails the test if
// there is not exactly one.
func markedBlock(t *testing.T, file, lang, marker string) string {
	t.Helper()
	text, err := docblock.One(file, lang, marker)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// sudoLess is a shell block with "sudo " taken off the start of each line,
// for a root shell without sudo.
func sudoLess(block string) string {
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "sudo ")
	}
	return strings.Join(lines, "\n")
}

// deployBlock is a fenced block of docs/deploy.md that names the gateways
// it runs on.
type deployBlock struct {
	gateways []string // "A", "B"
	text     string
}

// deployBlocks returns the blocks of docs/deploy.md between the headings
// that begin with from and to whose info string is `sh gateway A`, `sh
// gateway B` or `sh both gateways` (what docs/deploy_test.go runs).
func deployBlocks(t *testing.T, from, to string) []deployBlock {
	t.Helper()
	b, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []deployBlock
	var cur *deployBlock
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case cur != nil:
			if l == "```" {
				blocks = append(blocks, *cur)
				cur = nil
			} else {
				cur.text += l + "\n"
			}
		case strings.HasPrefix(l, "## "):
			in = strings.HasPrefix(l, from) || (in && !strings.HasPrefix(l, to))
		case in && strings.HasPrefix(l, "```sh "):
			switch strings.TrimPrefix(l, "```sh ") {
			case "gateway A":
				cur = &deployBlock{gateways: []string{"A"}}
			case "gateway B":
				cur = &deployBlock{gateways: []string{"B"}}
			case "both gateways":
				cur = &deployBlock{gateways: []string{"A", "B"}}
			}
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("docs/deploy.md has no gateway block between %q and %q", from, to)
	}
	return blocks
}

// runDeployBlock runs the block on its gateways, in the container, with
// sh -e; two kinds of line are carried out by the test, because the
// containers have neither SSH nor ping: `scp -p FILES root@ADDRESS:DIR`
// copies the files with their mode to the gateway with that address, and
// `ping` runs the machine's ping in the gateway's network namespace.
func runDeployBlock(t *testing.T, gw map[string]*container, top *testbed.Topology, b deployBlock) {
	t.Helper()
	nodes := map[string]*testbed.Node{"A": top.GwA, "B": top.GwB}
	byAddr := map[string]string{testbed.GwATransitV4.Addr().String(): "A", testbed.GwBTransitV4.Addr().String(): "B"}
	for _, name := range b.gateways {
		c := gw[name]
		var script strings.Builder
		flush := func() {
			if script.Len() == 0 {
				return
			}
			if out, err := c.run([]byte(script.String()), "sh", "-e"); err != nil {
				t.Fatalf("gateway %s: docs/deploy.md's block failed: %v\n%s\n%s", name, err, script.String(), out)
			}
			script.Reset()
		}
		for _, l := range strings.Split(strings.TrimSuffix(b.text, "\n"), "\n") {
			switch {
			case strings.HasPrefix(l, "scp -p "):
				flush()
				f := strings.Fields(l)[2:]
				dest, dir, ok := strings.Cut(f[len(f)-1], ":")
				to := gw[byAddr[strings.TrimPrefix(dest, "root@")]]
				if !ok || to == nil {
					t.Fatalf("gateway %s: %q: no gateway %s", name, l, dest)
				}
				for _, file := range f[:len(f)-1] {
					content := c.must(t, "cat", file)
					mode := strings.TrimSpace(c.must(t, "stat", "-c", "%a", file))
					if out, err := to.run([]byte(content), "install", "-m", mode, "/dev/stdin", filepath.Join(dir, filepath.Base(file))); err != nil {
						t.Fatalf("gateway %s: %q: %v\n%s", name, l, err, out)
					}
				}
			case strings.HasPrefix(l, "ping "):
				flush()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				out, err := nodes[name].Run(ctx, strings.Fields(l)...)
				cancel()
				if err != nil {
					t.Fatalf("gateway %s: %s: %v\n%s", name, l, err, out)
				}
			default:
				fmt.Fprintln(&script, l)
			}
		}
		flush()
	}
}
