package sa

import (
	"errors"
	"strings"
	"testing"
)

// isField reports whether err is of class kind and a *FieldError for field.
func isField(err, kind error, field string) bool {
	var fe *FieldError
	return errors.Is(err, kind) && errors.As(err, &fe) && fe.Field == field
}

// TestErrorClasses: a classed error keeps its message and matches its
// class, the error it carries and nothing else; a nil error stays nil.
func TestErrorClasses(t *testing.T) {
	if classed(ErrInvalid, nil) != nil {
		t.Fatal("classed(nil) is not nil")
	}
	inner := errors.New("inner")
	err := kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x: %w", 0x100, inner)
	if err.Error() != "sa: state spi 0x00000100: inner" {
		t.Errorf("message %q", err)
	}
	if !errors.Is(err, ErrKeyReuse) || !errors.Is(err, inner) {
		t.Errorf("%v does not match its class and its cause", err)
	}
	for _, other := range []error{ErrInvalid, ErrImmutable, ErrKeyExhausted, ErrStateExists, ErrNotFound} {
		if errors.Is(err, other) {
			t.Errorf("%v matches %v", err, other)
		}
	}
	if err := (Policy{Dir: numDirections}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Policy.Validate of a bad direction: %v, want ErrInvalid", err)
	}
	if err := (Config{Dir: DirIn}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Config.Validate of an SPI of 0: %v, want ErrInvalid", err)
	}
	fe := immutable(FieldKeys, "sa: keys")
	if !isField(fe, ErrImmutable, FieldKeys) || isField(fe, ErrInvalid, FieldKeys) || strings.Contains(fe.Error(), "cannot change on update") {
		t.Errorf("immutable: %v", fe)
	}
}
