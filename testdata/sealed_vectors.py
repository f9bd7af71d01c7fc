#!/usr/bin/env python3
"""Writes the `sealed` section of vectors.json from a second implementation.

The sealed cookie format (tether_core::cookie::sealed) rebuilt here with
Python's `cryptography` (OpenSSL's AES-GCM-SIV) and the standard library's
HMAC-SHA256, independently of the Rust code: every build's tests then hold
tether to these bytes. Fixed secrets and nonces make the values
deterministic. Run it after changing the format: python3 testdata/sealed_vectors.py
"""

import base64
import hashlib
import hmac
import json
import pathlib

from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

FORMAT_BYTE = 0x07
NOW = 1800000000

# Three secrets of 32 bytes: the ring is [new, old]; foreign is no one's.
NEW = bytes(range(0x00, 0x20))
OLD = bytes(range(0x20, 0x40))
FOREIGN = bytes(range(0x40, 0x60))


def b64(b):
    return base64.b64encode(b).decode()


def derive(secret):
    """(AES-256 key, 4-byte key id), each an HMAC-SHA256 under the secret."""
    key = hmac.new(secret, b"tether-sealed-v1 key\0", hashlib.sha256).digest()
    key_id = hmac.new(secret, b"tether-sealed-v1 key id\0", hashlib.sha256).digest()[:4]
    return key, key_id


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def envoy_payload(addresses, cluster, expires):
    """The `envoy` protobuf: 1 address, 2 expires, 100 cluster, 101 extra addresses."""
    out = field(1, addresses[0].encode())
    if expires:
        out += varint(2 << 3) + varint(expires)
    if cluster:
        out += field(100, cluster.encode())
    for a in addresses[1:]:
        out += field(101, a.encode())
    return out


def seal_bytes(secret, nonce, cookie):
    key, key_id = derive(secret)
    header = bytes([FORMAT_BYTE]) + key_id
    plain = envoy_payload(cookie["addresses"], cookie["cluster"], cookie["expires"])
    # cryptography returns ciphertext || tag.
    return header + nonce + AESGCMSIV(key).encrypt(nonce, plain, header)


def seal(secret, nonce, cookie):
    return b64(seal_bytes(secret, nonce, cookie))


def flip(value, at):
    raw = bytearray(base64.b64decode(value))
    raw[at] ^= 0x01
    return b64(bytes(raw))


def main():
    cookies = {
        "v4": {"addresses": ["10.0.0.1:8080"], "cluster": "backends/session", "expires": NOW + 120},
        "list": {
            "addresses": ["[2001:db8::1]:443", "10.0.0.2:443"],
            "cluster": "api/session",
            "expires": NOW + 3600,
        },
        "bare": {"addresses": ["127.0.0.1:19001"], "cluster": None, "expires": None},
        "expired": {"addresses": ["10.0.0.3:80"], "cluster": "c", "expires": NOW - 1},
    }
    n1, n2, n3 = bytes(range(1, 13)), bytes([0xA5] * 12), bytes(12)
    seal_cases = [
        ("ipv4 with cluster and expiry, first key", 0, n1, "v4"),
        ("ipv6 then ipv4 (A61 list), first key", 0, n2, "list"),
        ("no cluster, no expiry, all-zero nonce (what encode writes)", 0, n3, "bare"),
        ("the old key of the ring", 1, n1, "v4"),
    ]
    ring = [NEW, OLD]
    seals = []
    for name, key, nonce, c in seal_cases:
        seals.append(
            {
                "name": name,
                "key": key,
                "nonce": nonce.hex(),
                "cookie": cookies[c],
                "value": seal(ring[key], nonce, cookies[c]),
            }
        )

    v4 = seal(NEW, n1, cookies["v4"])
    raw_len = len(base64.b64decode(v4))
    opened = lambda c, key, expired=False: {  # noqa: E731
        "addresses": cookies[c]["addresses"],
        "cluster": cookies[c]["cluster"],
        "expires": cookies[c]["expires"],
        "key": key,
        "expired": expired,
    }
    sealed_error = {"error": "sealed"}
    opens = [
        ("opens with the first key", v4, opened("v4", 0)),
        ("quoted, as a cookie jar may send it", '"' + v4 + '"', opened("v4", 0)),
        ("unpadded", v4.rstrip("="), opened("v4", 0)),
        ("sealed by the old key: rotation reads it", seal(OLD, n1, cookies["v4"]), opened("v4", 1)),
        ("an address list", seal(NEW, n2, cookies["list"]), opened("list", 0)),
        ("expired: opens, and is past its expiry", seal(NEW, n1, cookies["expired"]), opened("expired", 0, True)),
        ("a ciphertext byte flipped", flip(v4, 1 + 4 + 12), sealed_error),
        ("a tag byte flipped", flip(v4, raw_len - 1), sealed_error),
        ("a nonce byte flipped", flip(v4, 1 + 4), sealed_error),
        ("the key id changed", flip(v4, 1), sealed_error),
        ("truncated by its last 4 bytes", b64(base64.b64decode(v4)[:-4]), sealed_error),
        ("truncated to the header (no ciphertext, no tag)", b64(base64.b64decode(v4)[:17]), sealed_error),
        ("sealed under a foreign key", seal(FOREIGN, n1, cookies["v4"]), sealed_error),
    ]
    section = {
        "_comment": (
            "Sealed cookies (tether_core::cookie::sealed): base64 of 0x07, a 4-byte key id, a 12-byte "
            "nonce, the AES-256-GCM-SIV ciphertext of the envoy protobuf payload and its 16-byte tag "
            "(associated data: the first 5 bytes). Per secret, the AES key is HMAC-SHA256(secret, "
            "'tether-sealed-v1 key' NUL) and the key id the first 4 bytes of HMAC-SHA256(secret, "
            "'tether-sealed-v1 key id' NUL). keys: the ring (base64 secrets), the first seals, all "
            "open; foreign_key seals values the ring cannot open. seal: the value key (an index into "
            "keys) and nonce (hex) give; open: what the ring makes of a value at now (expired judged "
            "there); error 'sealed' is treated as no cookie. Written by testdata/sealed_vectors.py "
            "with Python's cryptography, a second implementation."
        ),
        "keys": [b64(NEW), b64(OLD)],
        "key_ids": [derive(NEW)[1].hex(), derive(OLD)[1].hex()],
        "foreign_key": b64(FOREIGN),
        "now": NOW,
        "seal": seals,
        "open": [{"name": n, "value": v, "expect": e} for n, v, e in opens],
    }
    path = pathlib.Path(__file__).with_name("vectors.json")
    vectors = json.loads(path.read_text())
    vectors["sealed"] = section
    path.write_text(json.dumps(vectors, indent=1, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
