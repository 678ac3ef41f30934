#!/usr/bin/python3
"""Write scapy_vectors.json: ESP packets made by an implementation that is
not espd's, for crypto's TestScapyVectors to open byte for byte.

Run from anywhere with Debian's python3-scapy and python3-cryptography:

    /usr/bin/python3 crypto/testdata/scapy_vectors.py

Everything is deterministic (keys, IVs and payloads derive from fixed
labels), so re-running reproduces the committed file.

Sources, per packet ("source" in the JSON):
  scapy            scapy.layers.ipsec.SecurityAssociation did it all.
  scapy+truncate   AES-GCM with a 12-byte ICV: scapy 2.5 always emits the
                   16-byte GCM tag, and a 12-byte GCM tag is by definition
                   its first 12 bytes (NIST SP 800-38D, MSB_t), so the
                   packet is scapy's with the last 4 bytes dropped.
  scapy+hmac       AES-CBC or NULL with ESN: scapy 2.5 does not add the
                   high sequence bits to ESP's HMAC, so scapy encrypts and
                   Python's hmac computes the ICV over the packet followed
                   by the high 32 bits (RFC 4303 section 3.3.2.1).
  cryptography     AES-GMAC (RFC 4543), which scapy 2.5 lacks: the GCM tag
                   from python3-cryptography's AESGCM with an empty
                   plaintext and the packet (SPI, [seq high], seq, IV,
                   payload, padding, pad length, next header) as AAD.
"""

import hashlib
import hmac
import json
import os
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from scapy.all import IP, IPv6, UDP, ICMP, Raw, raw
from scapy.layers.ipsec import ESP, SecurityAssociation

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scapy_vectors.json")


def det(label, n):
    """n deterministic bytes for label."""
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"espd-scapy-%d-%s" % (i, label.encode())).digest()
        i += 1
    return out[:n]


def inner_packets(label):
    """Inner packets for tunnel mode: IPv4 and IPv6, short and long."""
    return [
        IP(src="198.18.0.1", dst="198.18.0.2") / ICMP(id=7, seq=1) / Raw(det(label + "a", 5)),
        IP(src="198.18.0.1", dst="198.18.0.2") / UDP(sport=4500, dport=5201) / Raw(det(label + "b", 333)),
        IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=53, dport=53) / Raw(det(label + "c", 1350)),
    ]


TUNNEL = IP(src="198.18.1.1", dst="198.18.1.2")

# (low, high) 32-bit halves of the sequence numbers used; without ESN the
# high half is 0.
SEQS_PLAIN = [1, 0x12345678, 0xFFFFFFFF]
SEQS_ESN = [(5, 1), (0xFFFFFFFF, 0xDEADBEEF), (1, 0x7FFFFFFF)]

SCAPY_AUTH = {"sha1": "HMAC-SHA1-96", "sha256": "SHA2-256-128",
              "sha384": "SHA2-384-192", "sha512": "SHA2-512-256"}
HASH = {"sha1": hashlib.sha1, "sha256": hashlib.sha256,
        "sha384": hashlib.sha384, "sha512": hashlib.sha512}
ICV = {"sha1": 12, "sha256": 16, "sha384": 24, "sha512": 32}
KEYLEN = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}


def esp_plaintext(inner, block):
    """payload | padding 1, 2, ... | pad length | next header, aligned to
    lcm(block, 4), the RFC 4303 default padding scapy also uses."""
    data = raw(inner)
    align = 16 if block == 16 else 4
    padlen = -(len(data) + 2) % align
    nh = 4 if inner.version == 4 else 41
    return data + bytes(range(1, padlen + 1)) + bytes([padlen, nh])


def seal_scapy(sa, inner, seq_lo, iv):
    out = sa.encrypt(inner, seq_num=seq_lo, iv=iv)
    esp = raw(out[ESP])
    back = sa.decrypt(out)  # scapy checks its own work
    assert raw(back) == raw(inner), "scapy round trip"
    return esp


vectors = []


def add(name, source, suite, enc_key, integ_key, seq, iv, plaintext, packet):
    vectors.append(dict(name=name, source=source, suite=suite,
                        enc_key=enc_key.hex(), integ_key=integ_key.hex(),
                        seq="%016x" % seq, iv=iv.hex(), plaintext=plaintext.hex(),
                        packet=packet.hex()))


def seqs(esn):
    if esn:
        return [(lo, hi) for lo, hi in SEQS_ESN]
    return [(lo, 0) for lo in SEQS_PLAIN]


def aead_suites():
    for bits in (128, 256):
        for esn in (False, True):
            yield "aes%dgcm16" % bits, "AES-GCM", bits // 8, esn
    for esn in (False, True):
        yield "chacha20poly1305", "CHACHA20-POLY1305", 32, esn


for base, algo, klen, esn in aead_suites():
    suite = base + ("-esn" if esn else "")
    key = det(suite + "key", klen + 4)
    spi = struct.unpack("!L", det(suite + "spi", 4))[0] | 0x100
    for (lo, hi), inner in zip(seqs(esn), inner_packets(suite)):
        seq = hi << 32 | lo
        iv = struct.pack("!Q", seq)  # espd's IV rule: the 64-bit sequence number
        sa = SecurityAssociation(ESP, spi=spi, crypt_algo=algo, crypt_key=key,
                                 tunnel_header=TUNNEL, esn_en=esn, esn=hi)
        pkt = seal_scapy(sa, inner, lo, iv)
        pt = esp_plaintext(inner, 1)
        add("%s seq %#x %d bytes" % (suite, seq, len(pt)), "scapy", suite, key, b"", seq, iv, pt, pkt)
        if base.startswith("aes"):
            # The same packet with a 12-byte ICV: the tag's first 12 bytes.
            s12 = suite.replace("gcm16", "gcm12")
            add("%s seq %#x %d bytes" % (s12, seq, len(pt)), "scapy+truncate", s12, key, b"",
                seq, iv, pt, pkt[:-4])

for bits in (128, 192, 256):
    for integ in ("sha1", "sha256", "sha384", "sha512"):
        for esn in (False, True):
            suite = "aes%d-%s%s" % (bits, integ, "-esn" if esn else "")
            key = det(suite + "key", bits // 8)
            ikey = det(suite + "ikey", KEYLEN[integ])
            spi = struct.unpack("!L", det(suite + "spi", 4))[0] | 0x100
            for (lo, hi), inner in zip(seqs(esn), inner_packets(suite)):
                seq = hi << 32 | lo
                iv = det(suite + "iv%d" % seq, 16)
                pt = esp_plaintext(inner, 16)
                if not esn:
                    sa = SecurityAssociation(ESP, spi=spi, crypt_algo="AES-CBC", crypt_key=key,
                                             auth_algo=SCAPY_AUTH[integ], auth_key=ikey,
                                             tunnel_header=TUNNEL)
                    pkt = seal_scapy(sa, inner, lo, iv)
                    source = "scapy"
                else:
                    sa = SecurityAssociation(ESP, spi=spi, crypt_algo="AES-CBC", crypt_key=key,
                                             tunnel_header=TUNNEL)
                    body = seal_scapy(sa, inner, lo, iv)
                    mac = hmac.new(ikey, body + struct.pack("!L", hi), HASH[integ]).digest()
                    pkt = body + mac[:ICV[integ]]
                    source = "scapy+hmac"
                add("%s seq %#x %d bytes" % (suite, seq, len(pt)), source, suite, key, ikey,
                    seq, iv, pt, pkt)

for integ in ("sha1", "sha256", "sha512"):
    for esn in (False, True):
        suite = "null-%s%s" % (integ, "-esn" if esn else "")
        ikey = det(suite + "ikey", KEYLEN[integ])
        spi = struct.unpack("!L", det(suite + "spi", 4))[0] | 0x100
        for (lo, hi), inner in zip(seqs(esn), inner_packets(suite)):
            seq = hi << 32 | lo
            pt = esp_plaintext(inner, 1)
            if not esn:
                sa = SecurityAssociation(ESP, spi=spi, auth_algo=SCAPY_AUTH[integ], auth_key=ikey,
                                         tunnel_header=TUNNEL)
                pkt = seal_scapy(sa, inner, lo, b"")
                source = "scapy"
            else:
                sa = SecurityAssociation(ESP, spi=spi, tunnel_header=TUNNEL)
                body = seal_scapy(sa, inner, lo, b"")
                mac = hmac.new(ikey, body + struct.pack("!L", hi), HASH[integ]).digest()
                pkt = body + mac[:ICV[integ]]
                source = "scapy+hmac"
            add("%s seq %#x %d bytes" % (suite, seq, len(pt)), source, suite, b"", ikey,
                seq, b"", pt, pkt)

for bits in (128, 192, 256):
    for esn in (False, True):
        suite = "aes%dgmac%s" % (bits, "-esn" if esn else "")
        key = det(suite + "key", bits // 8 + 4)
        spi = struct.unpack("!L", det(suite + "spi", 4))[0] | 0x100
        for (lo, hi), inner in zip(seqs(esn), inner_packets(suite)):
            seq = hi << 32 | lo
            iv = struct.pack("!Q", seq)
            pt = esp_plaintext(inner, 1)
            if esn:
                aad = struct.pack("!LLL", spi, hi, lo) + iv + pt
            else:
                aad = struct.pack("!LL", spi, lo) + iv + pt
            tag = AESGCM(key[:-4]).encrypt(key[-4:] + iv, b"", aad)
            pkt = struct.pack("!LL", spi, lo) + iv + pt + tag
            add("%s seq %#x %d bytes" % (suite, seq, len(pt)), "cryptography", suite, key, b"",
                seq, iv, pt, pkt)

with open(OUT, "w") as f:
    json.dump(vectors, f, indent=1)
    f.write("\n")
print("wrote %d vectors to %s" % (len(vectors), OUT))
