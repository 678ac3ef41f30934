package load

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

func TestSummarize(t *testing.T) {
	us := time.Microsecond
	r := summarize([]time.Duration{41 * us, 44 * us, 101 * us})
	// mean 62 us; squares' mean (1681+1936+10201)/3 = 4606, minus 62^2 = 762, sqrt ~ 27.6 us
	if r.Min != 41*us || r.Avg != 62*us || r.Max != 101*us || r.Mdev.Round(100*time.Nanosecond) != 27600*time.Nanosecond || r.Received != 3 {
		t.Errorf("summarize = %+v", r)
	}
	if r := summarize(nil); r.Received != 0 || r.Min != 0 || r.Avg != 0 || r.Max != 0 || r.Mdev != 0 {
		t.Errorf("summarize(nil) = %+v", r)
	}
}

func TestParseIPerf3(t *testing.T) {
	report := `{"start":{"tcp_mss":488,"tcp_mss_default":0},
	"end":{"sum_sent":{"bytes":1250000000,"seconds":5.0,"retransmits":17},
	"sum_received":{"bytes":1200000000,"seconds":5.0,"bits_per_second":1.92e9}}}`
	r, err := parseIPerf3([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes != 1200000000 || r.Elapsed != 5*time.Second || r.Retransmits != 17 || r.MSS != 488 {
		t.Errorf("parseIPerf3 = %+v", r)
	}
	if got := r.Bitrate(); got != 1.92e9 {
		t.Errorf("Bitrate = %v", got)
	}
	if _, err := parseIPerf3([]byte(`{"error":"unable to connect to server"}`)); err == nil {
		t.Error("parseIPerf3 accepted an error report")
	}
	if _, err := parseIPerf3([]byte(`{"end":{}}`)); err == nil {
		t.Error("parseIPerf3 accepted a report without a receiver summary")
	}
}

// TestRoutedLine runs each generator briefly over a plain routed line in
// both families and checks that the window counted traffic and that the
// MSS asked for was used.
func TestRoutedLine(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	top := testbed.NewT(t, testbed.Options{Prefix: "eblt", RouteLANs: true})
	for _, dst := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		server := testbed.Pick(dst, testbed.ServerV4.Addr(), testbed.ServerV6.Addr())
		var marks []bool
		r, err := TCP(ctx, TCPOptions{From: top.Client, To: top.Server, Dst: server, MSS: 500,
			Omit: 100 * time.Millisecond, Duration: 400 * time.Millisecond,
			Window: func(start bool) { marks = append(marks, start) }})
		if err != nil {
			t.Fatalf("%v TCP: %v", dst, err)
		}
		if r.Bytes <= 0 || r.Elapsed < 400*time.Millisecond || r.MSS == 0 || r.MSS > 500 {
			t.Errorf("%v TCP: %+v", dst, r)
		}
		if len(marks) != 2 || !marks[0] || marks[1] {
			t.Errorf("%v TCP window marks %v, want [true false]", dst, marks)
		}
		t.Logf("%v TCP mss 500: %.0f Mbit/s, %d retransmits, mss %d", dst, r.Bitrate()/1e6, r.Retransmits, r.MSS)

		u, err := UDP(ctx, UDPOptions{From: top.Client, To: top.Server, Dst: server,
			Omit: 100 * time.Millisecond, Duration: 300 * time.Millisecond})
		if err != nil {
			t.Fatalf("%v UDP: %v", dst, err)
		}
		if u.Received == 0 || u.Sent == 0 || u.Size != 64 {
			t.Errorf("%v UDP: %+v", dst, u)
		}
		t.Logf("%v UDP 64: %.0f kpps received, %.1f%% loss", dst, u.PacketRate()/1e3, 100*u.Loss())

		rtt, err := Ping(ctx, top.Client, server, 5)
		if err != nil {
			t.Fatalf("%v ping: %v", dst, err)
		}
		if rtt.Avg <= 0 || rtt.Min > rtt.Avg || rtt.Avg > rtt.Max || rtt.Received != 5 {
			t.Errorf("%v ping: %+v", dst, rtt)
		}
		// An address nobody has: no reply, so an error that says so.
		nobody := testbed.Pick(dst, netip.MustParseAddr("198.18.2.99"), netip.MustParseAddr("2001:db8:2::99"))
		if rtt, err := Ping(ctx, top.Client, nobody, 2); err == nil || rtt.Received != 0 || rtt.Transmitted != 2 {
			t.Errorf("%v ping to %v, which nobody has: %+v, %v", dst, nobody, rtt, err)
		}
	}
	if IPerf3Available() == nil {
		dir := t.TempDir()
		r, err := IPerf3TCP(ctx, TCPOptions{From: top.Client, To: top.Server, Dst: testbed.ServerV4.Addr(), MSS: 1000,
			Omit: 0, Duration: time.Second}, dir)
		if err != nil {
			b, _ := os.ReadFile(dir + "/iperf3-server.log")
			t.Fatalf("iperf3: %v\n%s", err, b)
		}
		if r.Bytes <= 0 || r.MSS == 0 || r.MSS > 1000 {
			t.Errorf("iperf3: %+v", r)
		}
		t.Logf("iperf3 mss 1000: %.0f Mbit/s, %d retransmits, mss %d", r.Bitrate()/1e6, r.Retransmits, r.MSS)
	}
}
