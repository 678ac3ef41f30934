package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
)

// agreementPages are the pages the agreement tests read: README.md and
// every page of docs/.
func agreementPages(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{}
	for _, n := range append(names, "../README.md") {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		pages[strings.TrimPrefix(n, "../")] = string(b)
	}
	return pages
}

// proposalToken is a backticked or listed word that names an ESP
// algorithm in strongSwan's syntax (aes128gcm16, aes256-sha384-esn,
// 3des-sha1, ...): the words suiteClaims checks against crypto.ParseSuite.
var proposalToken = regexp.MustCompile(`^(aes|chacha|null|3des|des|camellia|blowfish|cast|serpent|twofish)[a-z0-9_]*(-[a-z0-9_]+)*$`)

// suiteClaim is one proposal a page names, and whether it says espd takes it.
type suiteClaim struct {
	suite string
	ok    bool
}

// suiteClaims returns, line by line, the ESP proposals a page lists as
// supported (ok) and as refused (!ok). Supported: every proposal of an
// `esp_proposals = ...` or `suite = "..."` line, and the backticked
// proposals of a table row whose first cell is `suite` or `esp_proposals`
// and whose last cell starts with "yes". Refused: the backticked proposals
// of a table row whose last cell starts with "refused". Prose elsewhere
// says nothing here.
func suiteClaims(page string) []suiteClaim {
	var claims []suiteClaim
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(page, "\n") {
		trim := strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(trim, "esp_proposals = "); ok {
			for _, p := range strings.Split(v, ",") {
				claims = append(claims, suiteClaim{strings.TrimSpace(p), true})
			}
			continue
		}
		if v, ok := strings.CutPrefix(trim, "suite = "); ok {
			claims = append(claims, suiteClaim{strings.Trim(v, `"`), true})
			continue
		}
		if !strings.HasPrefix(trim, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(trim, "|"), "|")
		last := strings.TrimSpace(cells[len(cells)-1])
		first := cells[0]
		var claim, set bool
		switch {
		case strings.HasPrefix(last, "refused"):
			claim, set = false, true
		case strings.HasPrefix(last, "yes") && (strings.Contains(first, "`esp_proposals`")):
			claim, set = true, true
		case strings.TrimSpace(first) == "`suite`":
			first, claim, set = trim, true, true
		}
		if !set {
			continue
		}
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			if proposalToken.MatchString(m[1]) {
				claims = append(claims, suiteClaim{m[1], claim})
			}
		}
	}
	return claims
}

// TestDocSuites: every ESP proposal a page lists as supported parses with
// crypto.ParseSuite, and every one it lists as refused does not.
func TestDocSuites(t *testing.T) {
	n := map[bool]int{}
	for name, page := range agreementPages(t) {
		for _, c := range suiteClaims(page) {
			s, ok := c.suite, c.ok
			n[ok]++
			_, err := crypto.ParseSuite(s)
			if ok && err != nil {
				t.Errorf("%s lists %q as supported, but espd refuses it: %v", name, s, err)
			}
			if !ok && err == nil {
				t.Errorf("%s lists %q as refused, but espd accepts it", name, s)
			}
		}
	}
	if n[true] < 5 || n[false] < 3 {
		t.Errorf("found %d supported and %d refused proposals in the pages: the markup the test reads has changed", n[true], n[false])
	}
}

// TestSuiteClaims pins what suiteClaims reads and what it leaves alone.
func TestSuiteClaims(t *testing.T) {
	page := "esp_proposals = aes128gcm16,aes256-sha256\n" +
		"suite = \"chacha20poly1305\"\n" +
		"| `esp_proposals`: AES-GCM (`aes128gcm12`) | yes |\n" +
		"| AES-GCM with an 8-byte ICV (`aes128gcm8`), `mode = beet` | refused |\n" +
		"| `suite` | yes | `aes128-sha512`, `null-sha256` |\n" +
		"Prose with `aes128gcm8` and `3des` says nothing.\n" +
		"| `copy_dscp = in` (`aes192gcm16` aside) | yes |\n"
	want := []suiteClaim{{"aes128gcm16", true}, {"aes256-sha256", true}, {"chacha20poly1305", true},
		{"aes128gcm12", true}, {"aes128gcm8", false}, {"aes128-sha512", true}, {"null-sha256", true}}
	if got := suiteClaims(page); !slices.Equal(got, want) {
		t.Errorf("suiteClaims = %v, want %v", got, want)
	}
}
