package main

import (
	"strings"
	"testing"
)

// Two samples as perf script -F tid,ip,sym prints them: one in sendmmsg
// whose softirq delivered to a raw socket, one in a TUN read.
const script = `   17600 
	ffffffff8100 raw_local_deliver
	ffffffff8101 net_rx_action
	ffffffff8102 do_softirq
	ffffffff8103 raw_sendmsg
	ffffffff8104 __sys_sendmmsg
	4a1b2c syscall.RawSyscall6.abi0

   17600 
	ffffffff8200 tun_do_read
	ffffffff8201 ksys_read

`

func TestCount(t *testing.T) {
	res, err := count(strings.NewReader(script), []string{"raw_sendmsg", "tun_do_read", "syscall.RawSyscall6", "io_write"})
	if err != nil {
		t.Fatal(err)
	}
	if res.samples != 2 {
		t.Fatalf("%d samples, want 2", res.samples)
	}
	for fn, want := range map[string]int{"raw_sendmsg": 1, "tun_do_read": 1, "syscall.RawSyscall6": 1, "io_write": 0} {
		if res.in[fn] != want {
			t.Errorf("%s in %d samples, want %d", fn, res.in[fn], want)
		}
	}
	if n := res.softirq[[2]string{"raw_sendmsg", "raw_local_deliver"}]; n != 1 || len(res.softirq) != 1 {
		t.Errorf("softirq counts %v, want one in raw_sendmsg delivering raw_local_deliver", res.softirq)
	}
	var b strings.Builder
	res.print(&b)
	if !strings.Contains(b.String(), "raw_sendmsg               50.0%") {
		t.Errorf("output:\n%s", b.String())
	}
}
