package sa

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
)

// keyLeaks returns a description of the key pattern's first form found in
// s: raw, hex (either case), decimal bytes or base64.
func keyLeaks(s string) string {
	k := string(testKey(8))
	forms := map[string]string{
		"raw":     string(keyPattern),
		"hex":     hex.EncodeToString(keyPattern),
		"HEX":     strings.ToUpper(hex.EncodeToString(keyPattern)),
		"decimal": strings.Trim(fmt.Sprint(keyPattern), "[]"),
		"base64":  base64.StdEncoding.EncodeToString([]byte(k))[:8],
		"quoted":  fmt.Sprintf("%q", keyPattern),
		"\\x":     `\x53\x65`,
	}
	for name, f := range forms {
		if strings.Contains(s, f) {
			return name
		}
	}
	return ""
}

func TestKeysNeverShown(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x4100, DirOut, 1)
	c.Suite, c.EncKey, c.IntegKey = cbcSHA256, testKey(cbcSHA256.EncKeyLen()), testKey(cbcSHA256.IntegKeyLen())
	s := mustAdd(t, db, c)
	if got := s.Config(); got.EncKey != nil || got.IntegKey != nil {
		t.Error("Config() returns keys")
	}
	var texts []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%d", "%q"} {
		texts = append(texts,
			fmt.Sprintf(verb, c), fmt.Sprintf(verb, &c), fmt.Sprintf(verb, []Config{c}),
			fmt.Sprintf(verb, s), fmt.Sprintf(verb, []*SA{s}), fmt.Sprintf(verb, s.Config()))
	}
	texts = append(texts, c.String(), s.String())
	// Every error AddSA and UpdateSA return for a keyed config.
	bad := []func(*Config){
		func(c *Config) { c.EncKey = c.EncKey[:5] },
		func(c *Config) { c.IntegKey = append(c.IntegKey, keyPattern...) },
		func(c *Config) { c.Suite = crypto.Suite{Encryption: crypto.Encr3DES} },
		func(c *Config) { c.DSCP = 99 },
		func(c *Config) { c.SPI = 0 },
	}
	for _, f := range bad {
		cc := c
		f(&cc)
		if _, err := db.AddSA(cc); err != nil {
			texts = append(texts, err.Error())
		} else {
			t.Errorf("AddSA accepted %v", cc)
		}
	}
	if _, err := db.AddSA(c); err != nil { // duplicate
		texts = append(texts, err.Error())
	}
	cc := c
	cc.EncKey = append([]byte("X"), c.EncKey[1:]...)
	if err := db.UpdateSA(cc); err != nil {
		texts = append(texts, err.Error())
	} else {
		t.Error("UpdateSA changed the key")
	}
	for _, txt := range texts {
		if form := keyLeaks(txt); form != "" {
			t.Errorf("key (%s) appears in %q", form, txt)
		}
	}
	if !strings.Contains(c.String(), "redacted") {
		t.Errorf("Config.String() does not say the keys are redacted: %s", c)
	}
	// The check itself finds keys.
	if keyLeaks(fmt.Sprintf("%v", c.EncKey)) == "" || keyLeaks(fmt.Sprintf("%x", c.EncKey)) == "" {
		t.Fatal("keyLeaks misses a plain key")
	}
}
