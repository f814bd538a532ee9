#!/usr/bin/python3
"""Independent RoCEv2 test vectors from Debian's scapy (python3-scapy, scapy.contrib.roce).

Prints one line per packet: space-separated key=value fields that describe what was built, ending with
frame=<hex of the whole IPv4 packet>. Scapy builds the IPv4, UDP and BTH headers and computes the ICRC itself
(scapy.contrib.roce.BTH.compute_icrc); it has no classes for most extension headers, so those bytes are packed here
with struct from the IBTA layouts (Vol 1 9.3, Annex A14) and travel as a Raw payload that scapy's ICRC covers.

Used by //wire:scapy_agreement_test. Run with Debian's /usr/bin/python3 (the only interpreter that sees scapy).
Deterministic: the same output on every run.
"""
import random
import struct
import sys

from scapy.layers.inet import IP, UDP
from scapy.packet import Raw
from scapy.contrib.roce import BTH, cnp
from scapy.compat import raw

RC, UC, RD, UD, XRC = 0x00, 0x20, 0x40, 0x60, 0xA0

# Operation low 5 bits -> (name, extension headers in wire order, has payload), IBTA Vol 1 table 38.
# Header lists for RC; RD adds RDETH (+ DETH on requests), XRC adds XRCETH on requests.
OPS = {
    0x00: ("SEND_FIRST", [], True),
    0x01: ("SEND_MIDDLE", [], True),
    0x02: ("SEND_LAST", [], True),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", ["imm"], True),
    0x04: ("SEND_ONLY", [], True),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", ["imm"], True),
    0x06: ("RDMA_WRITE_FIRST", ["reth"], True),
    0x07: ("RDMA_WRITE_MIDDLE", [], True),
    0x08: ("RDMA_WRITE_LAST", [], True),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", ["imm"], True),
    0x0A: ("RDMA_WRITE_ONLY", ["reth"], True),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", ["reth", "imm"], True),
    0x0C: ("RDMA_READ_REQUEST", ["reth"], False),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", ["aeth"], True),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", [], True),
    0x0F: ("RDMA_READ_RESPONSE_LAST", ["aeth"], True),
    0x10: ("RDMA_READ_RESPONSE_ONLY", ["aeth"], True),
    0x11: ("ACKNOWLEDGE", ["aeth"], False),
    0x12: ("ATOMIC_ACKNOWLEDGE", ["aeth", "atomic_ack"], False),
    0x13: ("COMPARE_SWAP", ["atomic"], False),
    0x14: ("FETCH_ADD", ["atomic"], False),
    0x15: ("RESYNC", [], False),  # RD only
    0x16: ("SEND_LAST_WITH_INVALIDATE", ["ieth"], True),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", ["ieth"], True),
}
RESPONSES = {0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12}

def opcodes():
    """(code, name, headers, has_payload) for every opcode uroce's table defines."""
    out = []
    for low in range(0x00, 0x18):
        if low == 0x15:
            continue
        name, hdrs, pay = OPS[low]
        out.append((RC | low, "RC_" + name, hdrs, pay))
    for low in range(0x00, 0x0C):
        name, hdrs, pay = OPS[low]
        out.append((UC | low, "UC_" + name, hdrs, pay))
    for low in range(0x00, 0x16):
        name, hdrs, pay = OPS[low]
        extra = ["rdeth"] if low in RESPONSES else ["rdeth", "deth"]
        out.append((RD | low, "RD_" + name, extra + hdrs, pay))
    for low in (0x04, 0x05):
        name, hdrs, pay = OPS[low]
        out.append((UD | low, "UD_" + name, ["deth"] + hdrs, pay))
    for low in range(0x00, 0x18):
        if low == 0x15:
            continue
        name, hdrs, pay = OPS[low]
        extra = [] if low in RESPONSES else ["xrc"]
        out.append((XRC | low, "XRC_" + name, extra + hdrs, pay))
    return out

def build(rng, code, name, hdrs, has_payload, variant):
    f = {}
    f["opcode"] = code
    f["psn"] = rng.randrange(1 << 24)
    f["dqpn"] = rng.randrange(1 << 24)
    f["pkey"] = rng.choice([0xFFFF, 0x8001, 0x7FFF])
    f["se"] = rng.randrange(2)
    f["m"] = rng.randrange(2)
    f["ackreq"] = rng.randrange(2)
    # Variant 1 sets FECN/BECN: the ICRC masks them, so it must not change the result.
    f["fecn"] = 1 if variant == 1 else 0
    f["becn"] = 1 if variant == 1 else 0
    ext = b""
    for h in hdrs:
        if h == "rdeth":
            f["rdeth_eecn"] = rng.randrange(1 << 24)
            ext += struct.pack("!I", f["rdeth_eecn"])
        elif h == "deth":
            f["deth_qkey"] = rng.randrange(1 << 32)
            f["deth_sqp"] = rng.randrange(1 << 24)
            ext += struct.pack("!II", f["deth_qkey"], f["deth_sqp"])
        elif h == "xrc":
            f["xrc_srqn"] = rng.randrange(1 << 24)
            ext += struct.pack("!I", f["xrc_srqn"])
        elif h == "reth":
            f["reth_va"] = rng.randrange(1 << 64)
            f["reth_rkey"] = rng.randrange(1 << 32)
            f["reth_len"] = rng.randrange(1 << 32)
            ext += struct.pack("!QII", f["reth_va"], f["reth_rkey"], f["reth_len"])
        elif h == "atomic":
            f["atomic_va"] = rng.randrange(1 << 64) & ~7
            f["atomic_rkey"] = rng.randrange(1 << 32)
            f["atomic_swap"] = rng.randrange(1 << 64)
            f["atomic_cmp"] = rng.randrange(1 << 64)
            ext += struct.pack("!QIQQ", f["atomic_va"], f["atomic_rkey"], f["atomic_swap"], f["atomic_cmp"])
        elif h == "aeth":
            # ACK with credits, RNR NAK, NAK: bits 6-5 of the syndrome (IBTA 9.3.5).
            f["aeth_syn"] = rng.choice([0x1F, 0x00, 0x25, 0x2E, 0x60, 0x62, 0x63])
            f["aeth_msn"] = rng.randrange(1 << 24)
            ext += struct.pack("!I", (f["aeth_syn"] << 24) | f["aeth_msn"])
        elif h == "atomic_ack":
            f["ack_orig"] = rng.randrange(1 << 64)
            ext += struct.pack("!Q", f["ack_orig"])
        elif h == "imm":
            imm = bytes(rng.randrange(256) for _ in range(4))
            f["imm"] = imm.hex()  # as the wire bytes
            ext += imm
        elif h == "ieth":
            f["ieth_rkey"] = rng.randrange(1 << 32)
            ext += struct.pack("!I", f["ieth_rkey"])
        else:
            raise ValueError(h)
    payload = b""
    if has_payload:
        length = [0, 1, 2, 3, 5, 64, 255, 1024][(code + 3 * variant) % 8]
        payload = bytes(rng.randrange(256) for _ in range(length))
    pad = (-len(payload)) % 4
    f["payload_len"] = len(payload)
    f["pad"] = pad

    src = "10.%d.%d.%d" % (rng.randrange(256), rng.randrange(256), rng.randrange(1, 255))
    dst = "192.168.%d.%d" % (rng.randrange(256), rng.randrange(1, 255))
    f["sport"] = 0xC000 + rng.randrange(0x4000)
    f["ipid"] = 0 if variant == 0 else rng.randrange(1 << 16)
    f["ttl"] = 64 if variant == 0 else rng.randrange(1, 256)
    f["tos"] = 0 if variant == 0 else rng.randrange(256)  # masked by the ICRC too
    f["src"] = src
    f["dst"] = dst
    ip = IP(src=src, dst=dst, id=f["ipid"], flags="DF", ttl=f["ttl"], tos=f["tos"])
    udp = UDP(sport=f["sport"], dport=4791, chksum=0)
    bth = BTH(opcode=code, solicited=f["se"], migreq=f["m"], padcount=pad, version=0, pkey=f["pkey"],
              fecn=f["fecn"], becn=f["becn"], dqpn=f["dqpn"], ackreq=f["ackreq"], psn=f["psn"])
    pkt = ip / udp / bth / Raw(ext + payload + b"\x00" * pad)
    return f, raw(pkt)

def build_cnp(rng):
    f = {"opcode": 0x81, "dqpn": rng.randrange(1 << 24), "psn": 0, "pkey": 0xFFFF, "se": 0, "m": 0, "ackreq": 0,
         "fecn": 0, "becn": 1, "payload_len": 16, "pad": 0, "sport": 0xC000 + rng.randrange(0x4000),
         "ipid": rng.randrange(1 << 16), "ttl": 64, "tos": 0, "src": "10.1.2.3", "dst": "10.3.2.1"}
    ip = IP(src=f["src"], dst=f["dst"], id=f["ipid"], flags="DF", ttl=64, tos=0)
    pkt = ip / UDP(sport=f["sport"], dport=4791, chksum=0) / cnp(f["dqpn"])
    return f, raw(pkt)

def main():
    rng = random.Random(4791)
    lines = []
    for code, name, hdrs, pay in opcodes():
        for variant in range(3):
            f, frame = build(rng, code, name, hdrs, pay, variant)
            f["name"] = name
            lines.append((f, frame))
    f, frame = build_cnp(rng)
    f["name"] = "CNP"
    lines.append((f, frame))
    for f, frame in lines:
        fields = " ".join("%s=%s" % (k, v) for k, v in f.items())
        sys.stdout.write("%s frame=%s\n" % (fields, frame.hex()))

if __name__ == "__main__":
    main()
