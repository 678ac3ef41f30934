package sa

import (
	"errors"
	"testing"
)

// TestPolicyIfIDIsolation: a policy of interface N matches only lookups of
// interface N; one selector exists once per interface ID; deleting needs
// the ID.
func TestPolicyIfIDIsolation(t *testing.T) {
	db := NewDB(Options{})
	any4 := Selector{Src: pfx("0.0.0.0/0"), Dst: pfx("0.0.0.0/0")}
	for _, id := range []uint32{1, 2} {
		if _, err := db.AddPolicy(Policy{Selector: any4, Dir: DirOut, ReqID: 10 + id, IfID: id}); err != nil {
			t.Fatalf("if_id %d: %v", id, err)
		}
	}
	f := flow("198.18.0.1", "198.19.0.1", 6, 1, 2)
	if p, ok := db.LookupPolicy(0, DirOut, f); ok {
		t.Errorf("interface 0 matched %v: route-based policies must not apply outside their interface", p)
	}
	for _, id := range []uint32{1, 2} {
		p, ok := db.LookupPolicy(id, DirOut, f)
		if !ok || p.IfID != id || p.ReqID != 10+id {
			t.Errorf("interface %d: lookup = %v, %v", id, p, ok)
		}
	}
	if _, ok := db.LookupPolicy(3, DirOut, f); ok {
		t.Error("interface 3 (no policy) matched")
	}
	if _, err := db.AddPolicy(Policy{Selector: any4, Dir: DirOut, IfID: 2}); !errors.Is(err, ErrPolicyExists) {
		t.Errorf("second 0/0 on if_id 2: %v, want ErrPolicyExists", err)
	}
	// A policy-based 0/0 coexists and serves interface 0 only.
	if _, err := db.AddPolicy(Policy{Selector: any4, Dir: DirOut, ReqID: 9}); err != nil {
		t.Fatal(err)
	}
	if p, ok := db.LookupPolicy(0, DirOut, f); !ok || p.ReqID != 9 {
		t.Errorf("interface 0: %v, %v", p, ok)
	}
	if err := db.DeletePolicy(PolicyID{Selector: any4, Dir: DirOut, IfID: 3}); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete on if_id 3: %v, want ErrNotFound", err)
	}
	if err := db.DeletePolicy(PolicyID{Selector: any4, Dir: DirOut, IfID: 1}); err != nil {
		t.Fatal(err)
	}
	if _, ok := db.LookupPolicy(1, DirOut, f); ok {
		t.Error("interface 1 matched after its policy was deleted")
	}
	if p, ok := db.LookupPolicy(2, DirOut, f); !ok || p.IfID != 2 {
		t.Errorf("interface 2 lost its policy: %v, %v", p, ok)
	}
	if _, ok := db.GetPolicy(PolicyID{Selector: any4, Dir: DirOut, IfID: 2}); !ok {
		t.Error("GetPolicy if_id 2 failed")
	}
	if n := len(db.Policies()); n != 2 {
		t.Errorf("%d policies, want 2", n)
	}
}

// TestSAIfID: a state keeps its interface ID, and an update cannot
// change it.
func TestSAIfID(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x3000, DirOut, 5)
	c.IfID = 42
	s := mustAdd(t, db, c)
	if s.IfID() != 42 {
		t.Fatalf("IfID() = %d", s.IfID())
	}
	u := testConfig(0x3000, DirOut, 5)
	u.EncKey, u.IntegKey = nil, nil
	u.IfID = 43
	var fe *FieldError
	if err := db.UpdateSA(u); !errors.As(err, &fe) || fe.Field != FieldIfID {
		t.Errorf("UpdateSA changing if_id: %v, want FieldError %q", err, FieldIfID)
	}
}
