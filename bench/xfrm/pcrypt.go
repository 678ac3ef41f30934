package xfrm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The kernel's crypto user interface (include/uapi/linux/cryptouser.h):
// x/sys/unix has NETLINK_CRYPTO, CRYPTO_MSG_NEWALG, CRYPTO_MSG_DELALG and
// CRYPTO_MAX_NAME, but not struct crypto_user_alg nor the algorithm type
// (include/linux/crypto.h: CRYPTO_ALG_TYPE_AEAD, CRYPTO_ALG_TYPE_MASK).
const (
	cryptoAlgTypeAEAD = 0x3
	cryptoAlgTypeMask = 0xf
	// sizeofCryptoUserAlg is struct crypto_user_alg: three names of
	// CRYPTO_MAX_NAME bytes, then cru_type, cru_mask, cru_refcnt and
	// cru_flags, each a __u32.
	sizeofCryptoUserAlg = 3*unix.CRYPTO_MAX_NAME + 4*4
)

// cryptoUserAlg is struct crypto_user_alg, the body of CRYPTO_MSG_NEWALG
// and CRYPTO_MSG_DELALG.
type cryptoUserAlg struct {
	name, driver string
	typ, mask    uint32
}

func (a cryptoUserAlg) Len() int { return sizeofCryptoUserAlg }

func (a cryptoUserAlg) Serialize() []byte {
	b := make([]byte, sizeofCryptoUserAlg)
	copy(b[:unix.CRYPTO_MAX_NAME-1], a.name)
	copy(b[unix.CRYPTO_MAX_NAME:2*unix.CRYPTO_MAX_NAME-1], a.driver)
	binary.NativeEndian.PutUint32(b[3*unix.CRYPTO_MAX_NAME:], a.typ)
	binary.NativeEndian.PutUint32(b[3*unix.CRYPTO_MAX_NAME+4:], a.mask)
	return b
}

// cryptoUser sends one request to the kernel's crypto user interface
// (crypto_user, CONFIG_CRYPTO_USER) and returns its answer; priority, if
// not negative, goes with it as CRYPTOCFGA_PRIORITY_VAL.
func cryptoUser(msg int, a cryptoUserAlg, priority int) error {
	if len(a.name) >= unix.CRYPTO_MAX_NAME || len(a.driver) >= unix.CRYPTO_MAX_NAME {
		return fmt.Errorf("xfrm: crypto algorithm name %q (driver %q) longer than %d bytes", a.name, a.driver, unix.CRYPTO_MAX_NAME-1)
	}
	req := nl.NewNetlinkRequest(msg, unix.NLM_F_ACK)
	req.AddData(a)
	if priority >= 0 {
		req.AddData(nl.NewRtAttr(unix.CRYPTOCFGA_PRIORITY_VAL, nl.Uint32Attr(uint32(priority))))
	}
	_, err := req.Execute(unix.NETLINK_CRYPTO, 0)
	return err
}

// GenivName is the name of the algorithm the kernel's ESP allocates for an
// AEAD state: the AEAD wrapped in its IV generator, seqiv for every AEAD
// XFRM knows (net/xfrm/xfrm_algo.c, net/ipv4/esp4.c esp_init_aead).
func GenivName(aead string) string { return "seqiv(" + aead + ")" }

// CryptoAlg is one algorithm of /proc/crypto.
type CryptoAlg struct {
	Name, Driver, Module, Type string
	Priority, Refcnt           int
}

// ProcCrypto reads /proc/crypto.
func ProcCrypto() ([]CryptoAlg, error) {
	f, err := os.Open("/proc/crypto")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseProcCrypto(f)
}

func parseProcCrypto(r io.Reader) ([]CryptoAlg, error) {
	var algs []CryptoAlg
	var cur *CryptoAlg
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "name" {
			algs = append(algs, CryptoAlg{Name: v})
			cur = &algs[len(algs)-1]
			continue
		}
		if cur == nil {
			continue
		}
		switch k {
		case "driver":
			cur.Driver = v
		case "module":
			cur.Module = v
		case "type":
			cur.Type = v
		case "priority":
			cur.Priority, _ = strconv.Atoi(v)
		case "refcnt":
			cur.Refcnt, _ = strconv.Atoi(v)
		}
	}
	return algs, sc.Err()
}

// best returns the algorithm the kernel picks for name (the highest
// priority), and the best one whose driver is not a pcrypt instance.
func best(algs []CryptoAlg, name string) (pick, plain *CryptoAlg) {
	for i := range algs {
		a := &algs[i]
		if a.Name != name {
			continue
		}
		if pick == nil || a.Priority > pick.Priority {
			pick = a
		}
		if !strings.HasPrefix(a.Driver, "pcrypt(") && (plain == nil || a.Priority > plain.Priority) {
			plain = a
		}
	}
	return pick, plain
}

// Pcrypt is a pcrypt instance the kernel's ESP picks for an AEAD.
type Pcrypt struct {
	// Name is the AEAD's name, such as rfc4106(gcm(aes)).
	Name string
	// Driver is the instance's driver, pcrypt(<the AEAD's driver>).
	Driver string
}

// InstantiatePcrypt makes the kernel's ESP run the AEAD named aead (such
// as rfc4106(gcm(aes))) through the pcrypt template, as strongSwan's
// users set it up with crconf ("crconf add driver pcrypt(<driver>) type
// 3"): it instantiates the AEAD if the kernel has not yet, then, through
// the crypto user interface (CRYPTO_MSG_NEWALG), pcrypt(<the driver the
// kernel picks for it>), which takes that driver's priority plus 100.
// Registering it retires the instances built on the plain AEAD (the IV
// generator ESP wraps it in, GenivName), so the next state builds its own
// on pcrypt; states already there keep theirs. It checks in /proc/crypto
// that the kernel now picks the pcrypt instance for the name. An instance
// this process already holds is shared; Release ends each use. An
// *UnavailableError says what the kernel lacks (crypto_user, pcrypt).
func InstantiatePcrypt(aead string) (Pcrypt, error) {
	p := Pcrypt{Name: aead}
	unavailable := func(what string, err error) error {
		return &UnavailableError{Err: err, Reason: fmt.Sprintf("%s: %v", what, err)}
	}
	err := cryptoUser(unix.CRYPTO_MSG_NEWALG, cryptoUserAlg{name: aead, typ: cryptoAlgTypeAEAD, mask: cryptoAlgTypeMask}, -1)
	switch {
	case err == nil, errors.Is(err, syscall.EEXIST):
	case errors.Is(err, syscall.EPROTONOSUPPORT):
		return p, unavailable("kernel has no crypto user interface to instantiate pcrypt with (CONFIG_CRYPTO_USER, module crypto_user)", err)
	case errors.Is(err, syscall.ENOENT):
		return p, unavailable(fmt.Sprintf("kernel crypto lacks %s", aead), err)
	default:
		return p, fmt.Errorf("xfrm: instantiate %s: %w", aead, err)
	}
	// A pcrypt instance left from an earlier key goes first: only a new
	// registration retires what was built on the plain AEAD since.
	if err := RemovePcrypt(aead); err != nil {
		return p, err
	}
	held.Lock()
	defer held.Unlock()
	algs, err := ProcCrypto()
	if err != nil {
		return p, err
	}
	_, plain := best(algs, aead)
	if plain == nil {
		return p, fmt.Errorf("xfrm: %s instantiated but not in /proc/crypto", aead)
	}
	p.Driver = "pcrypt(" + plain.Driver + ")"
	if held.pcrypt[p.Driver] > 0 && find(algs, aead, p.Driver) != nil {
		if err := pickIs(algs, aead, p.Driver); err != nil {
			return p, err
		}
		held.pcrypt[p.Driver]++
		return p, nil
	}
	err = cryptoUser(unix.CRYPTO_MSG_NEWALG, cryptoUserAlg{name: aead, driver: p.Driver, typ: cryptoAlgTypeAEAD, mask: cryptoAlgTypeMask}, -1)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ENOENT):
		return p, unavailable("kernel has no pcrypt template (CONFIG_CRYPTO_PCRYPT, module pcrypt)", err)
	default:
		return p, fmt.Errorf("xfrm: instantiate %s: %w", p.Driver, err)
	}
	held.pcrypt[p.Driver]++
	if err := checkPick(aead, p.Driver); err != nil {
		return p, errors.Join(err, p.release())
	}
	return p, nil
}

// Release ends this use of the pcrypt instance; the last one removes it
// (as RemovePcrypt does).
func (p Pcrypt) Release() error {
	held.Lock()
	defer held.Unlock()
	return p.release()
}

func (p Pcrypt) release() error {
	if held.pcrypt[p.Driver] == 0 {
		return nil
	}
	if held.pcrypt[p.Driver]--; held.pcrypt[p.Driver] > 0 {
		return nil
	}
	delete(held.pcrypt, p.Driver)
	return removePcrypt(p.Name, func(driver string) bool { return driver == p.Driver })
}

// Refcnt returns the instance's reference count in /proc/crypto: one per
// transform (state) that uses it, above a base.
func (p Pcrypt) Refcnt() (int, error) {
	algs, err := ProcCrypto()
	if err != nil {
		return 0, err
	}
	for _, a := range algs {
		if a.Driver == p.Driver {
			return a.Refcnt, nil
		}
	}
	return 0, fmt.Errorf("xfrm: %s is not in /proc/crypto", p.Driver)
}

// Geniv returns the driver of the IV generator's instance the kernel's ESP
// now picks for the AEAD (GenivName): one built on the pcrypt instance,
// seqiv(pcrypt(...)), once states use it.
func (p Pcrypt) Geniv() (string, error) {
	algs, err := ProcCrypto()
	if err != nil {
		return "", err
	}
	pick, _ := best(algs, GenivName(p.Name))
	if pick == nil {
		return "", fmt.Errorf("xfrm: no %s in /proc/crypto", GenivName(p.Name))
	}
	return pick.Driver, nil
}

// RemovePcrypt removes every pcrypt instance of the AEAD named aead that
// this process does not hold (InstantiatePcrypt), so that states added
// afterwards use the plain AEAD: it drops the instance's priority to 0
// (CRYPTO_MSG_UPDATEALG, which also retires the instances built on it) and
// then deletes it (CRYPTO_MSG_DELALG). The kernel refuses the deletion
// while a state still uses it (EBUSY): the states of a flush go away
// asynchronously, so it retries for up to ten seconds; at priority 0 it no
// longer serves new states meanwhile.
func RemovePcrypt(aead string) error {
	held.Lock()
	defer held.Unlock()
	return removePcrypt(aead, func(driver string) bool { return held.pcrypt[driver] == 0 })
}

// removePcrypt removes the pcrypt instances of aead whose driver remove
// selects; held is locked.
func removePcrypt(aead string, remove func(driver string) bool) error {
	deadline := time.Now().Add(10 * time.Second)
	lowered := map[string]bool{}
	for {
		algs, err := ProcCrypto()
		if err != nil {
			return err
		}
		var errs []error
		for _, a := range algs {
			if a.Name != aead || !strings.HasPrefix(a.Driver, "pcrypt(") || !remove(a.Driver) {
				continue
			}
			alg := cryptoUserAlg{name: aead, driver: a.Driver, typ: cryptoAlgTypeAEAD, mask: cryptoAlgTypeMask}
			if !lowered[a.Driver] {
				if err := cryptoUser(unix.CRYPTO_MSG_UPDATEALG, alg, 0); err != nil && !errors.Is(err, syscall.ENOENT) {
					return fmt.Errorf("xfrm: lower %s: %w", a.Driver, err)
				}
				lowered[a.Driver] = true
			}
			if err := cryptoUser(unix.CRYPTO_MSG_DELALG, alg, -1); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("xfrm: remove %s: %w", a.Driver, err))
			}
		}
		if len(errs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errs...)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
