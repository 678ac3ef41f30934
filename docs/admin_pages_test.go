package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// adminPages are the pages an administrator reads (shipped in
// /usr/share/doc/espd); optionalAdminPages are held to the same rules once
// they exist. How espd is tested, its measurements and its history belong
// on the contributor page, contributorPage, which is not shipped.
var (
	adminPages = []string{"../README.md", "deploy.md", "config.md", "strongswan.md", "ha.md",
		"transport.md", "safety.md", "afxdp.md", "dataplane.md", "reference.md", "firewall.md", "upgrade.md",
		"migrate.md"}
	optionalAdminPages = []string{"getting-started.md"}
	contributorPage    = "../CONTRIBUTING.md"
	// contributorDir holds contributor pages that sit beside the docs
	// they describe (the XFRM interop guests); build.sh copies only
	// docs/*.md, not this directory.
	contributorDir = "dev"
)

// readmeMaxWords is the length README.md stays under.
const readmeMaxWords = 1500

// pageLine is one line of a page, with whether it is inside a fenced block.
type pageLine struct {
	n     int
	text  string
	block bool
}

// pageLines splits a Markdown page into its lines, fences as
// internal/docblock reads them (the fence lines themselves are prose).
func pageLines(text string) []pageLine {
	var out []pageLine
	in := false
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case in && t == "```":
			in = false
		case !in && strings.HasPrefix(t, "```"):
			in = true
		default:
			out = append(out, pageLine{i + 1, l, in})
			continue
		}
		out = append(out, pageLine{i + 1, l, false})
	}
	return out
}

var (
	// An issue reference: "issue 37", "issues 12 and 14", "#12"; a "#"
	// that starts a comment in a block ("# 1. first") or names an entry
	// of a configuration file in espd's messages ("sa #2") is none.
	issueWord = regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)
	issueHash = regexp.MustCompile(`(^|[^\w&/])#\d+\b`)
	entryHash = regexp.MustCompile(`\b(sa|policy|interface)\s+#\d+\b`)
	// A commit hash: 7 to 40 lowercase hex digits with a letter and a
	// digit among them, standing alone (not in an IPv6 address, a MAC, a
	// 0x number, a longer hex string or a word).
	hexRun = regexp.MustCompile(`[0-9A-Za-z_:.]*[0-9a-f]{7,40}[0-9A-Za-z_:]*`)
	hexish = regexp.MustCompile(`^[0-9a-f]{7,40}$`)
	// Key material in a block: a swanctl or strongswan.conf secret given
	// as a literal (one with a printf's %s or a shell expansion in it is
	// generated), an ipsec.secrets PSK, a pppd password, a base64 key
	// (0s...) or 32 hex digits and more.
	secretLit = regexp.MustCompile(`\bsecret\s*=\s*("[^"%$]+"|'[^'%$]+'|[^\s%$"'][^\s%$]*(\s|$))`)
	pskLit    = regexp.MustCompile(`\bPSK\s+["'][^"']+["']`)
	passLit   = regexp.MustCompile(`\bpassword\s*=?\s*"[^"%$]+"`)
	base64Key = regexp.MustCompile(`\b0s[A-Za-z0-9+/]{12,}=*`)
	longHex   = regexp.MustCompile(`[0-9a-fA-F]{32,}`)
	// Where a test lives, in prose: a test function or a _test.go file.
	testName = regexp.MustCompile(`\b(Test|Benchmark|Fuzz)[A-Z0-9]\w*|\w+_test\.go\b`)
	// The machine the page was written or tested on.
	thisMachine = regexp.MustCompile(`(?i)\bthis machine\b`)
	// An exported identifier of one of espd's packages ("sa.DefaultConfig",
	// "conn.Bind"), or a field of a Config ("Config.Workers").
	goIdent = regexp.MustCompile(`\b(sa|conn|dataplane|daemon|tun|routing|esp|crypto|config|control|wire|seqstore|pairsync|statefile|testbed|packet|Config)\.[A-Z]\w*`)
)

// adminProblems returns what an admin page must not contain, one string
// per finding, "LINE: what".
func adminProblems(text string) []string {
	var out []string
	add := func(l pageLine, f string, a ...any) {
		out = append(out, fmt.Sprintf("%d: %s", l.n, fmt.Sprintf(f, a...)))
	}
	for _, l := range pageLines(text) {
		if m := issueWord.FindString(l.text); m != "" {
			add(l, "issue reference %q", m)
		}
		for _, m := range issueHash.FindAllStringSubmatch(entryHash.ReplaceAllString(l.text, ""), -1) {
			if l.block && strings.TrimSpace(m[1]) == "" {
				continue // a comment in a block: "#12 tunnels", "cmd #2"
			}
			add(l, "issue reference %q", strings.TrimSpace(m[0]))
		}
		for _, m := range hexRun.FindAllString(l.text, -1) {
			if hexish.MatchString(m) && strings.ContainsAny(m, "abcdef") && strings.ContainsAny(m, "0123456789") {
				add(l, "commit hash %q", m)
			}
		}
		if m := testName.FindString(l.text); m != "" {
			add(l, "names the test %q (how it is tested belongs in CONTRIBUTING.md)", m)
		}
		if m := thisMachine.FindString(l.text); m != "" {
			add(l, "says %q: the reader's machine is not the one the page was written on", m)
		}
		if m := goIdent.FindString(l.text); m != "" {
			add(l, "names the Go identifier %q (say what it does, or name the flag or key)", m)
		}
		if !l.block {
			continue
		}
		for _, re := range []*regexp.Regexp{secretLit, pskLit, passLit, base64Key, longHex} {
			if m := re.FindString(l.text); m != "" {
				add(l, "fixed key in a block: %q (give the command that generates it)", m)
				break
			}
		}
	}
	return out
}

// TestAdminPages holds the pages an administrator reads to what they are
// for: README.md under readmeMaxWords words, and no issue references,
// commit hashes, test names, or keys written into a copy-paste block.
func TestAdminPages(t *testing.T) {
	pages := append([]string{}, adminPages...)
	for _, p := range optionalAdminPages {
		if _, err := os.Stat(p); err == nil {
			pages = append(pages, p)
		}
	}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, f := range adminProblems(text) {
			t.Errorf("%s:%s", strings.TrimPrefix(p, "../"), f)
		}
	}
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(string(b))); n >= readmeMaxWords {
		t.Errorf("README.md has %d words, want fewer than %d: move the rest to docs/ or %s", n, readmeMaxWords, contributorPage)
	}
}

// TestAdminProblems pins what adminProblems finds and what it leaves alone.
func TestAdminProblems(t *testing.T) {
	bad := []string{
		"Fixed in issue 37.", "See #12 for that.", "Measured at 5c55ef0.", "(`TestQuickStart` runs it)",
		"see e2e/quickstart_test.go", "defined in `sa.DefaultConfig`", "(Config.Workers)", "which this machine's kernel lacks", "```conf\n    secret = \"presharedkey\"\n```",
		"```conf\nsecret = 0sc2VjcmV0IGtleSBvZiB0aGUgZXNwZCB0ZXN0cw==\n```",
		"```text\n: PSK \"s3cret\"\n```", "```text\nname alice\npassword \"Hz3vR8kYp2sWq5Nm\"\n```", "```sh\necho \"#1\"\n```", "```sh\necho 00112233445566778899aabbccddeeff0011 > k\n```",
	}
	for _, s := range bad {
		if len(adminProblems(s)) == 0 {
			t.Errorf("adminProblems(%q) found nothing", s)
		}
	}
	good := []string{
		"```sh\n# 1. the keys\nhead -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > k\n```",
		"`gw.toml:14: sa #2: enc_key is 16 bytes`", "ip 2001:db8:ff00:16b::1, mac 52:54:00:12:34:56, mark 0xe5d0",
		"```sh\nprintf 'secret = 0s%s\\n' \"$(head -c 32 /dev/urandom | base64 -w0)\"\n```",
		"```conf\n    secret = $PSK\n```", "`[sa.encap]`, `[[sa.selector]]`", "chacha20poly1305, aes128gcm16, sha256, 1234567 packets, a decade",
		"```sh\n#1 first\necho hi #2\n```",
	}
	for _, s := range good {
		if p := adminProblems(s); len(p) != 0 {
			t.Errorf("adminProblems(%q) = %q, want nothing", s, p)
		}
	}
}

// TestContributorPageNotShipped: the contributor page exists, outside docs/
// (whose *.md build.sh copies), and neither build.sh nor the nfpm
// configuration of espd names it or copies the repository's top-level
// Markdown files wholesale.
func TestContributorPageNotShipped(t *testing.T) {
	if _, err := os.Stat(contributorPage); err != nil {
		t.Fatalf("the contributor page: %v", err)
	}
	if dir := filepath.Dir(contributorPage); dir != ".." {
		t.Fatalf("%s is under %s", contributorPage, dir)
	}
	if fi, err := os.Stat(contributorDir); err != nil || !fi.IsDir() {
		t.Fatalf("the contributor directory docs/%s: %v", contributorDir, err)
	}
	name := filepath.Base(contributorPage)
	for _, f := range []string{"../packaging/build.sh", "../packaging/espd.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, name) || strings.Contains(s, "docs/"+contributorDir) {
			t.Errorf("%s names %s or docs/%s: the contributor pages must not be shipped", f, name, contributorDir)
		}
		if regexp.MustCompile(`cp\s+(-\w*[rRa]\w*\s+)\S*docs`).MatchString(s) {
			t.Errorf("%s copies docs/ recursively, docs/%s with it", f, contributorDir)
		}
		if regexp.MustCompile(`"\$repo"/\*\.md|\$repo/\*\.md|\$repo/\*"? `).MatchString(s) {
			t.Errorf("%s copies the repository's top-level files wholesale, %s with them", f, name)
		}
	}
	b, err := os.ReadFile("../packaging/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `cp "$repo/README.md" "$s/doc/"`) || !strings.Contains(string(b), `cp "$repo"/docs/*.md "$s/doc/docs/"`) {
		t.Errorf("build.sh no longer ships README.md and docs/*.md as this test expects: check that %s stays out", name)
	}
}
