package afxdp

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// stateValueLen is the size of a states map value: a word (host order)
// with the family (4 or 6) and anySource, the destination address of an
// inbound state, as XFRM identifies a state by (daddr, SPI), and its
// peer's address (IPv4 in the first four bytes of each).
const stateValueLen = 4 + 16 + 16

// anySource in a value's first word: the state takes any source address.
const anySource = 0x100

// xdpPass is XDP_PASS, also bpf_redirect_map's action when the queue has
// no socket.
const xdpPass = 2

// Offsets in an untagged Ethernet frame.
const (
	ethLen  = 14
	ip4Off  = ethLen
	ip6Off  = ethLen
	ip4L4   = ip4Off + 20 // espd takes only IPv4 headers without options
	ip6L4   = ip6Off + 40 // and IPv6 headers followed by ESP or UDP
	espLen  = 8           // SPI and sequence number
	udpLen  = 8
	ip4Src  = ip4Off + 12
	ip4Dst  = ip4Off + 16
	ip6Src  = ip6Off + 8
	ip6Dst  = ip6Off + 24
	ip6Next = ip6Off + 6
)

// program returns the XDP program of one device. It redirects to the
// device's queue socket in xsks an untagged, unfragmented IPv4 or IPv6
// frame of at most maxFrame bytes that carries ESP (or, if encapPort is
// not 0, non-IKE UDP to encapPort) whose (destination, SPI) is in states;
// whose source is the state's peer; it passes every other frame to the
// kernel, where the firewall sees it. A frame whose queue has no
// socket gets the action noSocket (xdpPass but in tests).
func program(states, xsks *ebpf.Map, encapPort uint16, maxFrame int, noSocket int32) asm.Instructions {
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], encapPort)
	portLE := int32(binary.NativeEndian.Uint16(port[:])) // as a load from the frame reads it
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R9, asm.R1),                // ctx
		asm.LoadMem(asm.R7, asm.R1, 0, asm.Word),   // data
		asm.LoadMem(asm.R8, asm.R1, 4, asm.Word),   // data_end
		asm.Mov.Reg(asm.R4, asm.R7),                // larger than a UMEM frame takes:
		asm.Add.Imm(asm.R4, int32(maxFrame)),       // the kernel's (the IP
		asm.JGT.Reg(asm.R8, asm.R4, "pass"),        // lengths are parseFrame's)
		asm.Mov.Reg(asm.R4, asm.R7),                //
		asm.Add.Imm(asm.R4, ethLen),                //
		asm.JGT.Reg(asm.R4, asm.R8, "pass"),        //
		asm.LoadMem(asm.R5, asm.R7, 12, asm.Half),  // EtherType
		asm.JEq.Imm(asm.R5, ethType(0x0800), "v4"), //
		asm.JEq.Imm(asm.R5, ethType(0x86dd), "v6"), //
		asm.Ja.Label("pass"),
	}
	// IPv4: version 4, no options, not a fragment.
	ins = append(ins,
		asm.Mov.Reg(asm.R4, asm.R7).WithSymbol("v4"),
		asm.Add.Imm(asm.R4, ip4L4),
		asm.JGT.Reg(asm.R4, asm.R8, "pass"),
		asm.LoadMem(asm.R5, asm.R7, ip4Off, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R7, ip4Off+6, asm.Half),
		asm.And.Imm(asm.R5, ethType(0x3fff)), // MF and the fragment offset
		asm.JNE.Imm(asm.R5, 0, "pass"),
		asm.Mov.Imm(asm.R6, 4),
		asm.LoadMem(asm.R5, asm.R7, ip4Off+9, asm.Byte),
	)
	ins = append(ins, transport("v4", ip4L4, encapPort, portLE)...)
	ins = append(ins, lookup("v4", states, ip4Dst, ip4Src, 1)...)
	// IPv6: version 6, ESP or UDP right after the fixed header.
	ins = append(ins,
		asm.Mov.Reg(asm.R4, asm.R7).WithSymbol("v6"),
		asm.Add.Imm(asm.R4, ip6L4),
		asm.JGT.Reg(asm.R4, asm.R8, "pass"),
		asm.LoadMem(asm.R5, asm.R7, ip6Off, asm.Byte),
		asm.And.Imm(asm.R5, 0xf0),
		asm.JNE.Imm(asm.R5, 0x60, "pass"),
		asm.Mov.Imm(asm.R6, 6),
		asm.LoadMem(asm.R5, asm.R7, ip6Next, asm.Byte),
	)
	ins = append(ins, transport("v6", ip6L4, encapPort, portLE)...)
	ins = append(ins, lookup("v6", states, ip6Dst, ip6Src, 4)...)
	ins = append(ins,
		asm.LoadMapPtr(asm.R1, xsks.FD()).WithSymbol("redirect"),
		asm.LoadMem(asm.R2, asm.R9, 16, asm.Word), // rx_queue_index
		asm.Mov.Imm(asm.R3, noSocket),
		asm.FnRedirectMap.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	)
	return ins
}

// transport reads the SPI into R2 for the family fam whose transport
// header is at l4, its protocol in R5: ESP, or UDP to encapPort (then a
// zero SPI is IKE's non-ESP marker, passed on; a keepalive is too short).
func transport(fam string, l4 int32, encapPort uint16, portLE int32) asm.Instructions {
	ins := asm.Instructions{
		asm.JNE.Imm(asm.R5, 50, fam+"udp"),
		asm.Mov.Reg(asm.R4, asm.R7),
		asm.Add.Imm(asm.R4, l4+espLen),
		asm.JGT.Reg(asm.R4, asm.R8, "pass"),
		asm.LoadMem(asm.R2, asm.R7, int16(l4), asm.Word),
		asm.Ja.Label(fam + "lookup"),
	}
	if encapPort == 0 {
		return append(ins, asm.Ja.Label("pass").WithSymbol(fam+"udp"))
	}
	return append(ins,
		asm.JNE.Imm(asm.R5, 17, "pass").WithSymbol(fam+"udp"),
		asm.Mov.Reg(asm.R4, asm.R7),
		asm.Add.Imm(asm.R4, l4+udpLen+espLen),
		asm.JGT.Reg(asm.R4, asm.R8, "pass"),
		asm.LoadMem(asm.R2, asm.R7, int16(l4+2), asm.Half),
		asm.JNE.Imm(asm.R2, portLE, "pass"),
		asm.LoadMem(asm.R2, asm.R7, int16(l4+udpLen), asm.Word),
		asm.JEq.Imm(asm.R2, 0, "pass"),
	)
}

// lookup looks the SPI in R2 up in states and jumps to redirect if the
// state's family is R6, its destination the words words at dst in the
// frame and its peer those at src (or it has anySource).
func lookup(fam string, states *ebpf.Map, dst, src int16, words int) asm.Instructions {
	ins := asm.Instructions{
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word).WithSymbol(fam + "lookup"),
		asm.LoadMapPtr(asm.R1, states.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R3, asm.R0, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R3),
		asm.And.Imm(asm.R1, 0xff),
		asm.JNE.Reg(asm.R1, asm.R6, "pass"),
	}
	for i := range words {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.R0, int16(4+4*i), asm.Word),
			asm.LoadMem(asm.R2, asm.R7, dst+int16(4*i), asm.Word),
			asm.JNE.Reg(asm.R1, asm.R2, "pass"),
		)
	}
	ins = append(ins,
		asm.And.Imm(asm.R3, anySource),
		asm.JNE.Imm(asm.R3, 0, "redirect"),
	)
	for i := range words {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.R0, int16(20+4*i), asm.Word),
			asm.LoadMem(asm.R2, asm.R7, src+int16(4*i), asm.Word),
			asm.JNE.Reg(asm.R1, asm.R2, "pass"),
		)
	}
	return append(ins, asm.Ja.Label("redirect"))
}

// ethType returns v, a 16-bit field in network order, as a half-word load
// from the frame reads it.
func ethType(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

// loadProgram loads the XDP program of one device (program).
func loadProgram(states, xsks *ebpf.Map, encapPort uint16, maxFrame int, noSocket int32) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "espd_esp_rx",
		Type:         ebpf.XDP,
		License:      "MIT",
		Instructions: program(states, xsks, encapPort, maxFrame, noSocket),
	})
	if err != nil {
		return nil, fmt.Errorf("afxdp: load the XDP program: %w", err)
	}
	return p, nil
}
