package control

import (
	"fmt"
	"slices"
	"strings"

	"github.com/espd/espd/control/wire"
)

// Software is what the server reports in its HELLO reply.
const Software = "espd"

// chooseVersion returns the highest version both sides speak.
func chooseVersion(offered []uint8) (uint8, bool) {
	var best uint8
	found := false
	for _, v := range offered {
		if slices.Contains(wire.SupportedVersions, v) && (!found || v > best) {
			best, found = v, true
		}
	}
	return best, found
}

// versionError is the EPROTONOSUPPORT error naming the versions supported.
func versionError(offered []uint8) *wire.Error {
	return &wire.Error{
		Code:     wire.EPROTONOSUPPORT,
		Msg:      fmt.Sprintf("protocol version %s not supported; this server speaks %s", versionList(offered), versionList(wire.SupportedVersions)),
		Versions: wire.SupportedVersions,
	}
}

func versionList(vs []uint8) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

// replyVersion is the version a reply carries: the request's if supported,
// else ours.
func replyVersion(v uint8) uint8 {
	for _, s := range wire.SupportedVersions {
		if s == v {
			return v
		}
	}
	return wire.Version
}
