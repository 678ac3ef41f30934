package strongswantest

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// rwPKI is the test's certificate authority, made with strongSwan's pki:
// a root CA (ca.pem, the docs' cacerts) with two chains of two
// intermediate CAs below it, one for servers (it issues the gateway's
// certificate for vpn.example.com) and one for users (it issues the
// clients'). Each side sends its chain along in IKE_AUTH: the gateway
// asks for certificates from the CAs it knows (the root and its own
// chain), so a client's chain up to the root goes with its certificate.
// RSA 4096 throughout: a certificate with two intermediates and an RSA
// signature make each IKE_AUTH message about 5 KB.
type rwPKI struct {
	t   *testing.T
	dir string
}

// pki runs strongSwan's pki with stdin and returns its standard output.
func (p *rwPKI) pki(stdin []byte, args ...string) []byte {
	p.t.Helper()
	cmd := exec.Command("pki", args...)
	cmd.Env = append(os.Environ(), "STRONGSWAN_CONF="+filepath.Join(p.dir, "strongswan.conf"))
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		p.t.Fatalf("pki %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// file returns the named file of the CA's directory.
func (p *rwPKI) file(name string) []byte {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dir, name))
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

func (p *rwPKI) write(name string, b []byte) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.dir, name), b, 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// issue makes a key name.key and a certificate name.pem for it, signed by
// the CA ca (self-signed if ca is empty), with pki's further options.
func (p *rwPKI) issue(name, ca, dn string, opts ...string) {
	p.t.Helper()
	key := p.pki(nil, "--gen", "--type", "rsa", "--size", "4096", "--outform", "pem")
	p.write(name+".key", key)
	var cert []byte
	if ca == "" {
		cert = p.pki(nil, append([]string{"--self", "--in", filepath.Join(p.dir, name+".key"),
			"--lifetime", "30", "--dn", dn, "--outform", "pem"}, opts...)...)
	} else {
		pub := p.pki(nil, "--pub", "--in", filepath.Join(p.dir, name+".key"))
		cert = p.pki(pub, append([]string{"--issue", "--cacert", filepath.Join(p.dir, ca+".pem"),
			"--cakey", filepath.Join(p.dir, ca+".key"), "--lifetime", "30", "--dn", dn, "--outform", "pem"}, opts...)...)
	}
	p.write(name+".pem", cert)
}

// newRWPKI makes the CA, its intermediates, the gateway's certificate and
// the clients' (rw1.example.com, ...).
func newRWPKI(t *testing.T, clients int) *rwPKI {
	t.Helper()
	p := &rwPKI{t: t, dir: t.TempDir()}
	p.write("strongswan.conf", []byte(pkiConf))
	p.issue("ca", "", "C=CH, O=espd test, CN=espd test root CA", "--ca")
	p.issue("server-ca", "ca", "C=CH, O=espd test, CN=espd test server CA", "--ca")
	p.issue("gateway-ca", "server-ca", "C=CH, O=espd test, CN=espd test gateway CA", "--ca")
	p.issue("vpn.example.com", "gateway-ca", "C=CH, O=espd test, CN=vpn.example.com",
		"--san", "dns:vpn.example.com", "--flag", "serverAuth", "--flag", "ikeIntermediate")
	p.issue("user-ca", "ca", "C=CH, O=espd test, CN=espd test user CA", "--ca")
	p.issue("road-warrior-ca", "user-ca", "C=CH, O=espd test, CN=espd test road-warrior CA", "--ca")
	for i := 1; i <= clients; i++ {
		name := fmt.Sprintf("rw%d.example.com", i)
		p.issue(name, "road-warrior-ca", "C=CH, O=espd test, CN="+name, "--san", "dns:"+name, "--flag", "clientAuth")
	}
	return p
}

// install puts credentials into the gateway's swanctl directory (its
// x509/, x509ca/ and private/) under the given names: files maps the
// directory and name there to the CA's file.
func (p *rwPKI) install(g *gateway, files map[string]string) {
	p.t.Helper()
	for dst, src := range files {
		path := filepath.Join(g.dir, dst)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			p.t.Fatal(err)
		}
		if err := os.WriteFile(path, p.file(src), 0o600); err != nil {
			p.t.Fatal(err)
		}
	}
}

// rwClientConf is a road-warrior client's swanctl.conf: certificate
// authentication with its chain sent along, virtual IPs of both
// families, all traffic to the gateway's side requested (narrowed to
// its local_ts) and no IKE fragmentation, so that its IKE_AUTH goes as one
// datagram of about 5 KB.
func rwClientConf(name, ike, esp string) string {
	return fmt.Sprintf(`connections {
    home {
        version = 2
        remote_addrs = %s
        vips = 0.0.0.0,::
        proposals = %s
        fragmentation = no
        send_cert = always
        local {
            auth = pubkey
            certs = %s.pem
            id = %s
        }
        remote {
            auth = pubkey
            id = vpn.example.com
            cacerts = ca.pem
        }
        children {
            home {
                remote_ts = 0.0.0.0/0,::/0
                esp_proposals = %s
            }
        }
    }
}
`, rwGateway.Addr(), ike, name, name, esp)
}

// ikeDatagram is one IKE datagram that crossed a link, reassembled (by
// size) from its captured IP fragments.
type ikeDatagram struct {
	src, dst netip.Addr // the first fragment's
	out      bool
	size     int // IP datagram: header and all fragments' payloads
	frags    int
}

// ikeDatagrams finds the fragmented IKE datagrams of a capture (IPv4,
// which is what crosses the NAT) and adds up their fragments. Fragments
// are matched by direction, source and ID, not by destination: the
// capture shares the frames' data with the next hop, and when the NAT
// router there reassembles, translates and fragments a datagram again
// (reusing the fragments' buffers), the copy of the capture shows the
// later fragments with the translated destination, the client's private
// address. First fragments are copied by the translation and keep theirs.
func ikeDatagrams(frames []testbed.Frame) []ikeDatagram {
	type key struct {
		out bool
		src netip.Addr
		id  uint32
	}
	m := map[key]*ikeDatagram{}
	var order []key
	for _, f := range frames {
		if f.Fragment && f.FirstFragment && f.Class == testbed.ClassIKE && f.Src.Is4() {
			k := key{f.Outgoing, f.Src, f.FragID}
			if _, ok := m[k]; !ok {
				m[k] = &ikeDatagram{src: f.Src, dst: f.Dst, out: f.Outgoing, size: 20}
				order = append(order, k)
			}
		}
	}
	for _, f := range frames {
		if !f.Fragment || !f.Src.Is4() || len(f.Data) < 20 {
			continue
		}
		if d, ok := m[key{f.Outgoing, f.Src, f.FragID}]; ok {
			d.size += f.Len - int(f.Data[0]&0x0f)*4
			d.frags++
		}
	}
	var list []ikeDatagram
	for _, k := range order {
		list = append(list, *m[k])
	}
	return list
}
