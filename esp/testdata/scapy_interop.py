#!/usr/bin/python3
"""ESP interop peer for esp's TestScapyInterop: scapy's own ESP code (not
espd's) decrypts the packets espd encapsulated and encrypts packets for
espd to decapsulate, in tunnel mode, raw or in UDP (RFC 3948), or in
transport mode.

Reads {"cases": [...]} as JSON on stdin and writes {"results": [...]} on
stdout, one result per case:

  case:   crypt, auth (scapy algorithm names, auth may be null), ckey,
          akey (hex), spi, esn (bool), esn_hi (high 32 bits), src, dst
          (outer), sport, dport (0: raw ESP), transport (bool: no tunnel
          header; inner is then the packet between src and dst),
          decrypt: hex of an outer packet espd built,
          inner: hex of an inner packet, seq: low 32 bits for scapy to use
  result: decrypted: hex of the inner packet scapy recovered,
          encrypted: hex of the outer packet scapy built,
          error: what went wrong, if anything
"""

import json
import sys

from scapy.all import IP, IPv6, UDP, raw
from scapy.layers.ipsec import ESP, SecurityAssociation


def sa_for(c):
    v6 = ":" in c["src"]
    tunnel = IPv6(src=c["src"], dst=c["dst"]) if v6 else IP(src=c["src"], dst=c["dst"])
    if c.get("transport"):
        tunnel = None
    nat_t = UDP(sport=c["sport"], dport=c["dport"]) if c["dport"] else None
    return SecurityAssociation(
        ESP, spi=c["spi"],
        crypt_algo=c["crypt"], crypt_key=bytes.fromhex(c["ckey"]),
        auth_algo=c["auth"], auth_key=bytes.fromhex(c["akey"]) if c["auth"] else None,
        tunnel_header=tunnel, nat_t_header=nat_t,
        esn_en=c["esn"], esn=c["esn_hi"])


def run(c):
    out = {}
    try:
        sa = sa_for(c)
        outer = bytes.fromhex(c["decrypt"])
        pkt = IPv6(outer) if outer[0] >> 4 == 6 else IP(outer)
        inner = sa.decrypt(pkt, esn_en=c["esn"], esn=c["esn_hi"])
        out["decrypted"] = raw(inner).hex()
        ip = IPv6 if bytes.fromhex(c["inner"])[0] >> 4 == 6 else IP
        enc = sa.encrypt(ip(bytes.fromhex(c["inner"])), seq_num=c["seq"],
                         esn_en=c["esn"], esn=c["esn_hi"])
        b = bytearray(raw(enc))
        if c["dport"] and b[0] >> 4 == 4:
            # scapy 2.5 builds the IPv4 NAT-T header before attaching ESP
            # and leaves the UDP length at 8; set it to what it covers.
            # Everything else (ESP included) is scapy's.
            ihl = (b[0] & 0x0F) * 4
            b[ihl + 4:ihl + 6] = (len(b) - ihl).to_bytes(2, "big")
        out["encrypted"] = bytes(b).hex()
    except Exception as e:  # reported to the Go test, which fails
        out["error"] = "%s: %s" % (type(e).__name__, e)
    return out


def main():
    req = json.load(sys.stdin)
    json.dump({"results": [run(c) for c in req["cases"]]}, sys.stdout)


if __name__ == "__main__":
    main()
