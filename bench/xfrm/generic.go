package xfrm

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CRYPTO_ALG_TYPE_SKCIPHER and CRYPTO_ALG_TYPE_SKCIPHER_MASK
// (include/linux/crypto.h): the mask also takes an lskcipher (type 0x4),
// which the CBC template builds since 6.7.
const (
	cryptoAlgTypeSkcipher     = 0x5
	cryptoAlgTypeSkcipherMask = 0xe
)

// ForcedPriority is the priority ForceGeneric gives a generic driver: above
// every driver the kernel registers itself (their priorities stay below a
// few thousand), so that the kernel picks it; a pcrypt instance on it takes
// 100 more. An instance found at this priority that this process does not
// hold is left from a killed run.
const ForcedPriority = 9000

// genericDriver is the generic (C) form of an algorithm ESP allocates.
type genericDriver struct {
	// drivers are its names, tried in order until one is not refused:
	// 6.1 and 6.12 both build cbc(aes-generic) (as an lskcipher since
	// 6.7), and cbc(ecb(aes-generic)) is what 6.7+ name their own.
	drivers []string
	typ     uint32
	mask    uint32
	// parts are the generic drivers it is built from, named in the
	// reason when the kernel cannot build it.
	parts []string
}

// genericDrivers maps the kernel names Algorithms gives ESP to their
// generic drivers: no AES-NI, PCLMULQDQ, SSSE3 or AVX code.
var genericDrivers = map[string]genericDriver{
	"rfc4106(gcm(aes))":             {[]string{"rfc4106(gcm_base(ctr(aes-generic),ghash-generic))"}, cryptoAlgTypeAEAD, cryptoAlgTypeMask, []string{"aes-generic", "ghash-generic"}},
	"rfc4543(gcm(aes))":             {[]string{"rfc4543(gcm_base(ctr(aes-generic),ghash-generic))"}, cryptoAlgTypeAEAD, cryptoAlgTypeMask, []string{"aes-generic", "ghash-generic"}},
	"rfc7539esp(chacha20,poly1305)": {[]string{"rfc7539esp(chacha20-generic,poly1305-generic)"}, cryptoAlgTypeAEAD, cryptoAlgTypeMask, []string{"chacha20-generic", "poly1305-generic"}},
	"cbc(aes)":                      {[]string{"cbc(aes-generic)", "cbc(ecb(aes-generic))"}, cryptoAlgTypeSkcipher, cryptoAlgTypeSkcipherMask, []string{"aes-generic"}},
	"cbc(des3_ede)":                 {[]string{"cbc(des3_ede-generic)", "cbc(ecb(des3_ede-generic))"}, cryptoAlgTypeSkcipher, cryptoAlgTypeSkcipherMask, []string{"des3_ede-generic"}},
	"cbc(camellia)":                 {[]string{"cbc(camellia-generic)", "cbc(ecb(camellia-generic))"}, cryptoAlgTypeSkcipher, cryptoAlgTypeSkcipherMask, []string{"camellia-generic"}},
}

// GenericDriverOf returns the generic driver of a kernel algorithm name
// (rfc4106(gcm(aes)) -> rfc4106(gcm_base(ctr(aes-generic),ghash-generic))),
// or "" if there is none known. (Some kernels name it otherwise:
// ForceGeneric tries each name and says which it took.)
func GenericDriverOf(name string) string {
	if d := genericDrivers[name].drivers; len(d) > 0 {
		return d[0]
	}
	return ""
}

// ESPName is the name of the transform the kernel's ESP allocates for a
// state (net/ipv4/esp4.c): the AEAD in its IV generator, seqiv(<aead>), or
// echainiv(authenc(<auth>,<crypt>)) for a CBC cipher with an HMAC.
func ESPName(aead, crypt, auth string) string {
	if aead != "" {
		return GenivName(aead)
	}
	return "echainiv(authenc(" + auth + "," + crypt + "))"
}

// held is what this process has put in the kernel's crypto registry and
// still uses: several systems of one run share it, as the kernel's
// registry is shared by every namespace.
var held = struct {
	sync.Mutex
	pcrypt map[string]int      // pcrypt driver -> users
	forced map[string]*forcing // algorithm name -> its forced driver
}{pcrypt: map[string]int{}, forced: map[string]*forcing{}}

type forcing struct {
	driver   string
	typ      uint32
	mask     uint32
	users    int
	created  bool
	priority int // the driver's priority before
}

// Generic is a generic driver the kernel picks for an algorithm name
// while it is held (ForceGeneric, Release).
type Generic struct {
	// Name is the algorithm's name, such as rfc4106(gcm(aes)).
	Name string
	// Driver is its generic driver.
	Driver string
}

// ForceGeneric makes the kernel's ESP use the generic driver of the
// algorithm name (GenericDriverOf) for the states added next, as on a CPU
// without AES-NI: it instantiates the driver through the crypto user
// interface (CRYPTO_MSG_NEWALG) unless it is there, gives it ForcedPriority
// (CRYPTO_MSG_UPDATEALG), retires the instances built on the name's other
// drivers (seqiv(...), authenc(...): states already there keep theirs) and
// checks in /proc/crypto that the kernel picks it. Calls for one name
// share the work; the last Release undoes it. An *UnavailableError says
// what the kernel lacks (crypto_user, a generic driver).
func ForceGeneric(name string) (Generic, error) {
	g := Generic{Name: name}
	gd, ok := genericDrivers[name]
	if !ok {
		return g, &UnavailableError{Reason: fmt.Sprintf("no generic kernel driver known for %s", name)}
	}
	held.Lock()
	defer held.Unlock()
	if f := held.forced[name]; f != nil {
		g.Driver = f.driver
		if err := checkPick(name, g.Driver); err != nil {
			return g, err
		}
		f.users++
		return g, nil
	}
	if err := removeStaleForced(name, gd); err != nil {
		return g, err
	}
	f := &forcing{typ: gd.typ, mask: gd.mask, users: 1}
	var alg cryptoUserAlg
	var err error
	for _, d := range gd.drivers {
		g.Driver, f.driver = d, d
		alg = cryptoUserAlg{name: name, driver: d, typ: gd.typ, mask: gd.mask}
		err = cryptoUser(unix.CRYPTO_MSG_NEWALG, alg, -1)
		// EINVAL: the template does not take this form of the cipher.
		if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			break
		}
	}
	switch {
	case err == nil:
		f.created = true
	case errors.Is(err, syscall.EEXIST):
	case errors.Is(err, syscall.EPROTONOSUPPORT):
		return g, &UnavailableError{Err: err, Reason: fmt.Sprintf(
			"kernel has no crypto user interface to pick %s with (CONFIG_CRYPTO_USER, module crypto_user): %v", g.Driver, err)}
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EINVAL):
		algs, _ := ProcCrypto()
		return g, &UnavailableError{Err: err, Reason: missingReason(algs, gd, err)}
	default:
		return g, fmt.Errorf("xfrm: instantiate %s: %w", g.Driver, err)
	}
	algs, err := ProcCrypto()
	if err != nil {
		return g, err
	}
	var retire []string
	if f.priority, retire, err = forcePlan(algs, name, f.driver); err != nil {
		return g, err
	}
	if err := cryptoUser(unix.CRYPTO_MSG_UPDATEALG, alg, ForcedPriority); err != nil {
		return g, fmt.Errorf("xfrm: raise %s's priority: %w", f.driver, err)
	}
	held.forced[name] = f
	// Retire what the other drivers serve: an instance built on one
	// (seqiv(rfc4106-gcm-aesni)) would serve the next state.
	for _, d := range retire {
		other := cryptoUserAlg{name: name, driver: d, typ: gd.typ, mask: gd.mask}
		if err := cryptoUser(unix.CRYPTO_MSG_UPDATEALG, other, -1); err != nil && !errors.Is(err, syscall.ENOENT) {
			return g, errors.Join(fmt.Errorf("xfrm: retire the instances on %s: %w", d, err), g.release())
		}
	}
	if err := checkPick(name, f.driver); err != nil {
		return g, errors.Join(err, g.release())
	}
	return g, nil
}

// forcePlan reads what ForceGeneric does to make the kernel pick driver
// for name in algs (/proc/crypto): the driver's priority to restore, and
// the name's other drivers, whose instances it retires. It fails if the
// driver is not there or another has ForcedPriority or more.
func forcePlan(algs []CryptoAlg, name, driver string) (priority int, retire []string, err error) {
	own := find(algs, name, driver)
	if own == nil {
		return 0, nil, fmt.Errorf("xfrm: %s instantiated but not in /proc/crypto as %s", driver, name)
	}
	for _, a := range algs {
		if a.Name != name || a.Driver == driver {
			continue
		}
		if a.Priority >= ForcedPriority {
			return 0, nil, fmt.Errorf("xfrm: %s has priority %d, not below the %d %s would take", a.Driver, a.Priority, ForcedPriority, driver)
		}
		retire = append(retire, a.Driver)
	}
	return own.Priority, retire, nil
}

// missingReason says which part of a generic driver the kernel lacks,
// from algs (/proc/crypto after the failed instantiation).
func missingReason(algs []CryptoAlg, gd genericDriver, err error) string {
	var missing []string
	for _, p := range gd.parts {
		found := false
		for _, a := range algs {
			found = found || a.Driver == p
		}
		if !found {
			missing = append(missing, p)
		}
	}
	drivers := strings.Join(gd.drivers, " or ")
	if len(missing) == 0 {
		return fmt.Sprintf("kernel crypto cannot build %s (a template missing?): %v", drivers, err)
	}
	return fmt.Sprintf("kernel crypto has no %s for %s: %v", strings.Join(missing, " or "), drivers, err)
}

// find returns the algorithm of a name with a driver, or nil.
func find(algs []CryptoAlg, name, driver string) *CryptoAlg {
	for i := range algs {
		if algs[i].Name == name && algs[i].Driver == driver {
			return &algs[i]
		}
	}
	return nil
}

// checkPick checks in /proc/crypto that the kernel picks driver for name.
func checkPick(name, driver string) error {
	algs, err := ProcCrypto()
	if err != nil {
		return err
	}
	return pickIs(algs, name, driver)
}

func pickIs(algs []CryptoAlg, name, driver string) error {
	pick, _ := best(algs, name)
	switch {
	case pick == nil:
		return fmt.Errorf("xfrm: no %s in /proc/crypto", name)
	case pick.Driver != driver:
		return fmt.Errorf("xfrm: the kernel picks %s (priority %d) for %s, not %s", pick.Driver, pick.Priority, name, driver)
	}
	return nil
}

// Uses checks the transform the kernel picks for espName (ESPName) in
// algs, as read from /proc/crypto after states were added: built on each
// driver of on (a generic driver, a pcrypt instance), and through pcrypt
// only if pcrypt. It returns its driver, such as
// seqiv(rfc4106(gcm_base(ctr(aes-generic),ghash-generic))).
func Uses(algs []CryptoAlg, espName string, pcrypt bool, on ...string) (string, error) {
	pick, _ := best(algs, espName)
	if pick == nil {
		return "", fmt.Errorf("xfrm: no %s in /proc/crypto", espName)
	}
	if !pcrypt && strings.Contains(pick.Driver, "pcrypt(") {
		return pick.Driver, fmt.Errorf("xfrm: the kernel's ESP picks %s for %s: it would run through pcrypt", pick.Driver, espName)
	}
	for _, d := range on {
		if !strings.Contains(pick.Driver, d) {
			return pick.Driver, fmt.Errorf("xfrm: the kernel's ESP picks %s for %s, not one on %s", pick.Driver, espName, d)
		}
	}
	return pick.Driver, nil
}

// Release ends this use of the forced driver; the last one restores its
// priority (which retires the instances built on it) and deletes it if
// ForceGeneric instantiated it.
func (g Generic) Release() error {
	held.Lock()
	defer held.Unlock()
	return g.release()
}

func (g Generic) release() error {
	f := held.forced[g.Name]
	if f == nil {
		return nil
	}
	if f.users--; f.users > 0 {
		return nil
	}
	delete(held.forced, g.Name)
	alg := cryptoUserAlg{name: g.Name, driver: f.driver, typ: f.typ, mask: f.mask}
	if err := cryptoUser(unix.CRYPTO_MSG_UPDATEALG, alg, f.priority); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("xfrm: restore %s's priority %d: %w", f.driver, f.priority, err)
	}
	if !f.created {
		return nil
	}
	return deleteAlg(alg)
}

// deleteAlg deletes an instance (CRYPTO_MSG_DELALG). The kernel refuses
// while a state still uses it (EBUSY): the states of a flush go away
// asynchronously, so it retries for up to ten seconds.
func deleteAlg(alg cryptoUserAlg) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cryptoUser(unix.CRYPTO_MSG_DELALG, alg, -1)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("xfrm: remove %s: %w", alg.driver, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// RemoveStaleGeneric deletes a generic driver of name left at
// ForcedPriority by a killed run, so that the normal drivers serve the
// states added next; one this process holds stays.
func RemoveStaleGeneric(name string) error {
	gd, ok := genericDrivers[name]
	if !ok {
		return nil
	}
	held.Lock()
	defer held.Unlock()
	if held.forced[name] != nil {
		return nil
	}
	return removeStaleForced(name, gd)
}

func removeStaleForced(name string, gd genericDriver) error {
	algs, err := ProcCrypto()
	if err != nil {
		return err
	}
	for _, d := range gd.drivers {
		a := find(algs, name, d)
		if a == nil || a.Priority < ForcedPriority {
			continue
		}
		if err := deleteAlg(cryptoUserAlg{name: name, driver: d, typ: gd.typ, mask: gd.mask}); err != nil {
			return fmt.Errorf("%s is left at priority %d from an earlier run: %w", d, a.Priority, err)
		}
	}
	return nil
}
