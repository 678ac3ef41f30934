package control

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// replyBound is how long a request may go unanswered before the extreme
// value tests call it hung: far above any real duration, even under -race.
const replyBound = 10 * time.Second

// Values every integer attribute is sent with: the wrap points, and the
// other width (a u32 attribute given 8 bytes, a u64 given 4).
var (
	extremeU32 = []uint32{0, 1, 1<<31 - 1, 1 << 31, 1<<32 - 1}
	extremeU64 = []uint64{0, 1, 1<<32 - 2, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, 1<<64 - 2, 1<<64 - 1}
)

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// rawAttr encodes one attribute with its padding, for nested values.
func rawAttr(t wire.AttrType, v []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(wire.AttrHeaderLen+len(v)))
	b = binary.BigEndian.AppendUint16(b, uint16(t))
	b = append(b, v...)
	return append(b, make([]byte, (len(b)+3)&^3-len(b))...)
}

// extremeCase replaces the top-level attributes of set's types in a
// request with set.
type extremeCase struct {
	name string
	set  []wire.Attr
}

// u32Values returns an attribute's extreme u32 values and 2^64-1 as 8
// bytes.
func u32Values(v func([]byte) []wire.Attr) [][]wire.Attr {
	var out [][]wire.Attr
	for _, x := range extremeU32 {
		out = append(out, v(be32(x)))
	}
	return append(out, v(be64(1<<64-1)))
}

// u64Values returns an attribute's extreme u64 values and 2^32-1 as 4
// bytes.
func u64Values(v func([]byte) []wire.Attr) [][]wire.Attr {
	var out [][]wire.Attr
	for _, x := range extremeU64 {
		out = append(out, v(be64(x)))
	}
	return append(out, v(be32(1<<32-1)))
}

// extremeCases returns every integer SA_ADD and SA_UPDATE attribute,
// nested ones included, at each extreme value, and the replay state at
// its edges: REPLAY_BITMAP of every length up to one byte past a window
// of 128 and past the largest window, with REPLAY_SEQ at the wrap points.
func extremeCases() []extremeCase {
	var cs []extremeCase
	add := func(name string, vals [][]wire.Attr) {
		for _, set := range vals {
			cs = append(cs, extremeCase{fmt.Sprintf("%s=%x", name, set[len(set)-1].Value), set})
		}
	}
	top := func(t wire.AttrType) func([]byte) []wire.Attr {
		return func(v []byte) []wire.Attr { return []wire.Attr{{Type: t, Value: v}} }
	}
	nest := func(t, inner wire.AttrType) func([]byte) []wire.Attr {
		return func(v []byte) []wire.Attr { return []wire.Attr{{Type: t, Value: rawAttr(inner, v)}} }
	}
	for _, t := range []wire.AttrType{wire.AttrSPI, wire.AttrDir, wire.AttrProto, wire.AttrMode, wire.AttrReqID, wire.AttrEncAlg, wire.AttrEncKeyLen,
		wire.AttrIntegAlg, wire.AttrESN, wire.AttrReplayWindow, wire.AttrEncap, wire.AttrTTL, wire.AttrDSCP, wire.AttrCopyDSCP, wire.AttrECN, wire.AttrDF,
		wire.AttrTFCPad, wire.AttrNegotiated} {
		add(wire.AttrName(0, t), u32Values(top(t)))
	}
	for _, t := range []wire.AttrType{wire.AttrOSeq, wire.AttrReplaySeq} {
		add(wire.AttrName(0, t), u64Values(top(t)))
	}
	for _, lt := range []wire.AttrType{wire.AttrLifeSoft, wire.AttrLifeHard} {
		for _, t := range []wire.AttrType{wire.LtBytes, wire.LtPackets, wire.LtAddTime, wire.LtUseTime} {
			add(wire.AttrName(0, lt)+"/"+wire.AttrName(lt, t), u64Values(nest(lt, t)))
		}
	}
	for _, t := range []wire.AttrType{wire.SelProto, wire.SelSrcPorts, wire.SelDstPorts} {
		add("SELECTOR/"+wire.AttrName(wire.AttrSelector, t), u32Values(nest(wire.AttrSelector, t)))
	}
	withSeq := func(seq uint64, window uint32, bm []byte) []wire.Attr {
		set := []wire.Attr{{Type: wire.AttrReplaySeq, Value: be64(seq)}}
		if window != 0 {
			set = append(set, wire.Attr{Type: wire.AttrReplayWindow, Value: be32(window)})
		}
		return append(set, wire.Attr{Type: wire.AttrReplayBitmap, Value: bm})
	}
	for n := range 128/8 + 2 {
		for _, fill := range []byte{0, 0xff} {
			bm := make([]byte, n)
			for i := range bm {
				bm[i] = fill
			}
			add("REPLAY_BITMAP alone", [][]wire.Attr{{{Type: wire.AttrReplayBitmap, Value: bm}}})
			for _, seq := range []uint64{1, 1<<32 - 1, 1<<64 - 1} {
				add(fmt.Sprintf("REPLAY_SEQ=%#x REPLAY_BITMAP", seq), [][]wire.Attr{withSeq(seq, 0, bm)})
			}
		}
	}
	for _, n := range []int{65536/8 - 1, 65536 / 8, 65536/8 + 1} {
		bm := make([]byte, n)
		for i := range bm {
			bm[i] = 0xa5
		}
		for _, seq := range []uint64{1, 1<<32 - 1, 1 << 32, 1<<64 - 1} {
			add(fmt.Sprintf("REPLAY_WINDOW=65536 REPLAY_SEQ=%#x REPLAY_BITMAP[%d]", seq, n), [][]wire.Attr{withSeq(seq, 65536, bm)})
		}
	}
	return cs
}

// extremeBases are the states the cases are applied to: inbound and
// outbound, with ESN and without.
func extremeBases(t *testing.T) []sa.Config {
	inESN := gcmConfig(t, 0x1000)
	inESN.Suite.ESN = true
	inESN.ReplayWindow = 128
	in32 := gcmConfig(t, 0x1001)
	outESN := fullConfig(t)
	out32 := fullConfig(t)
	out32.SPI++
	out32.Suite = mustSuite(t, "aes256-sha384")
	return []sa.Config{inESN, in32, outESN, out32}
}

// request builds a message of type typ from base with the attributes of
// set in place of base's of the same types.
func request(t *testing.T, typ wire.MsgType, seq uint32, base []wire.Attr, set []wire.Attr) []byte {
	t.Helper()
	b := wire.NewBuilder(wire.Version, typ, 0, seq)
	replaced := map[wire.AttrType]bool{}
	for _, a := range set {
		replaced[a.Type] = true
	}
	for _, a := range base {
		if !replaced[a.Type] {
			b.Raw(a.Type, a.Value)
		}
	}
	for _, a := range set {
		b.Raw(a.Type, a.Value)
	}
	msg, err := b.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// serverChildEnv makes the test binary serve a Server over a fresh sa.DB
// on the socket named, print "ready", and serve until standard input
// closes: a request that hangs it (a goroutine in runtime/secret.Do is not
// preempted, so a hung handler stalls the whole runtime at its next
// collection, as it stalled espd) cannot hang the test that drives it.
const serverChildEnv = "ESPD_CONTROL_SERVER_CHILD"

func serverChild(path string) int {
	s, err := Listen(dbBackend{sa.NewDB(sa.Options{AcquireInterval: -1})}, ServerConfig{Path: path, Logf: func(string, ...any) {}})
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	go s.Serve()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	s.Close()
	return 0
}

// startChild starts cmd, a copy of the test binary, with pipes to its
// standard input and output and its standard error on the test's.
func startChild(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return stdin, stdout
}

// startServerChild starts serverChild and returns its socket. The child is
// killed if it has not exited within replyBound of the test's end.
func startServerChild(t *testing.T) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "espd.sock")
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), serverChildEnv+"="+path)
	stdin, stdout := startChild(t, cmd)
	exited := make(chan error, 1)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line)
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("server child: %v", err)
			}
		case <-time.After(replyBound):
			t.Errorf("the server child did not exit within %v: a request is still running; killed", replyBound)
			cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case line := <-ready:
		if line != "ready" {
			t.Fatalf("server child: %q", line)
		}
	case <-time.After(replyBound):
		t.Fatalf("server child not ready within %v", replyBound)
	}
	return path
}

// exchange sends msg and returns the reply to it, failing the test if none
// comes within replyBound or the reply is not OK or a clear error (a
// known code other than EIO, which is a panic, and a message).
func exchange(t *testing.T, rc *rawConn, what string, msg []byte) *wire.Error {
	t.Helper()
	seq := binary.BigEndian.Uint32(msg[12:])
	rc.send(msg)
	rc.nc.SetReadDeadline(time.Now().Add(replyBound))
	var m *wire.Message
	for {
		var err error
		if m, _, _, err = ReadMessage(rc.nc, nil); err != nil {
			t.Fatalf("%s: no reply within %v: %v", what, replyBound, err)
		}
		if m.Seq != seq || m.Flags&wire.FlagReply == 0 {
			t.Fatalf("%s: got %v flags %d seq %d, want the reply to seq %d", what, m.Type, m.Flags, m.Seq, seq)
		}
		if m.Flags&wire.FlagMulti == 0 { // a single reply, DONE or ERROR
			break
		}
	}
	if m.Type != wire.MsgError {
		return nil
	}
	e, err := wire.ReadError(m.Attrs)
	if err != nil {
		t.Fatalf("%s: unreadable ERROR: %v", what, err)
	}
	if e.Code == wire.EIO || e.Msg == "" || e.Code.String() == fmt.Sprintf("errno %d", uint32(e.Code)) {
		t.Fatalf("%s: ERROR %v is not a clear error", what, e)
	}
	return e
}

// TestSAAttrsExtremes sends SA_ADD and SA_UPDATE with every integer
// attribute at extreme values (and the replay state at its edges) to a
// server over a real sa.DB, on inbound and outbound states with and
// without ESN. Each request gets its reply (OK or a clear error) within
// replyBound, the state can still be read, and the server answers the
// next request: no value makes espd hang or crash (issue 19: REPLAY_SEQ
// 2^64-1 on an ESN state hung the replay merge for good).
func TestSAAttrsExtremes(t *testing.T) {
	rc := rawDial(t, startServerChild(t))
	seq := uint32(0)
	next := func() uint32 { seq++; return seq }
	cases := extremeCases()
	for bi, base := range extremeBases(t) {
		for ci, c := range cases {
			for _, typ := range []wire.MsgType{wire.MsgSAAdd, wire.MsgSAUpdate} {
				what := fmt.Sprintf("%v of %v with %s", typ, base, c.name)
				// A key of its own for each state: an outbound key's
				// sequence numbers are remembered after its state.
				cfg := base
				binary.BigEndian.PutUint32(cfg.EncKey, uint32(bi<<24|ci<<1)|uint32(typ&1))
				exchange(t, rc, what+": SA_FLUSH", encode(t, wire.MsgSAFlush, 0, next(), nil))
				add := decodeOK(t, encode(t, wire.MsgSAAdd, 0, 0, func(b *wire.Builder) { wire.PutSAAdd(b, cfg) })).Attrs
				if typ == wire.MsgSAAdd {
					exchange(t, rc, what, request(t, wire.MsgSAAdd, next(), add, c.set))
				} else {
					if e := exchange(t, rc, what+": adding the state", request(t, wire.MsgSAAdd, next(), add, nil)); e != nil {
						t.Fatalf("%s: adding the state: %v", what, e)
					}
					id := decodeOK(t, encode(t, wire.MsgSAUpdate, 0, 0, func(b *wire.Builder) { wire.PutSAID(b, cfg.SPI, cfg.Dst) })).Attrs
					exchange(t, rc, what, request(t, wire.MsgSAUpdate, next(), id, c.set))
				}
				exchange(t, rc, what+": SA_GET", encode(t, wire.MsgSAGet, 0, next(), func(b *wire.Builder) {
					b.U32(wire.AttrSPI, cfg.SPI)
					b.Addr(wire.AttrDst, cfg.Dst)
				}))
				exchange(t, rc, what+": STATS", encode(t, wire.MsgStats, 0, next(), nil))
			}
		}
	}
}

// TestSPIAllocExtremes: SPI_ALLOC answers every range of extreme bounds.
func TestSPIAllocExtremes(t *testing.T) {
	rc := rawDial(t, startServerChild(t))
	seq := uint32(0)
	for _, lo := range u32Values(func(v []byte) []wire.Attr { return []wire.Attr{{Type: wire.AttrSPIMin, Value: v}} }) {
		for _, hi := range u32Values(func(v []byte) []wire.Attr { return []wire.Attr{{Type: wire.AttrSPIMax, Value: v}} }) {
			seq++
			exchange(t, rc, fmt.Sprintf("SPI_ALLOC %x-%x", lo[0].Value, hi[0].Value), request(t, wire.MsgSPIAlloc, seq, nil, append(lo, hi...)))
		}
	}
}
