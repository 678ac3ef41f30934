package sa

import (
	"errors"
	"testing"

	"github.com/espd/espd/crypto"
)

// TestUpdateSAFixedFields: UpdateSA refuses to change each setting a
// state keeps for life, on both ESN settings and both directions, with a
// *FieldError naming it, and the state is unchanged afterwards.
func TestUpdateSAFixedFields(t *testing.T) {
	cbc, err := crypto.ParseSuite("aes128-sha256")
	if err != nil {
		t.Fatal(err)
	}
	for _, esn := range []bool{false, true} {
		for _, dir := range []Direction{DirIn, DirOut} {
			db, _ := newTestDB(t)
			base := testConfig(0x1200, dir, 4)
			base.Suite.ESN = esn
			s := mustAdd(t, db, base)
			for _, tc := range []struct {
				field  string
				change func(*Config)
			}{
				{FieldESN, func(c *Config) { c.Suite.ESN = !esn }},
				{FieldSuite, func(c *Config) { c.Suite = cbc; c.Suite.ESN = esn }},
				{FieldSuite, func(c *Config) { c.Suite = cbc; c.Suite.ESN = !esn }},
				{FieldKeys, func(c *Config) { c.EncKey = testStateKey(gcm128.EncKeyLen(), 0x9999, dir) }},
				{FieldReqID, func(c *Config) { c.ReqID = 5 }},
				{FieldReplayWindow, func(c *Config) { c.ReplayWindow = 128 }},
				{FieldNegotiated, func(c *Config) { c.Negotiated = true }},
			} {
				if tc.field == FieldReplayWindow && dir == DirOut {
					continue // an outbound state has no replay window
				}
				c := s.Config()
				tc.change(&c)
				err := db.UpdateSA(c)
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Errorf("esn %v dir %v: changing %s: %v, want a FieldError naming it", esn, dir, tc.field, err)
				}
				if got := s.Config(); got.Suite != base.Suite || got.ReqID != 4 || got.ReplayWindow != 64 || got.Negotiated {
					t.Errorf("esn %v dir %v: the refused change of %s changed the state: %v", esn, dir, tc.field, got)
				}
			}
		}
	}
}
