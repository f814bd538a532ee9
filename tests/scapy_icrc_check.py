"""Checks, with scapy's own RoCEv2 code (scapy.contrib.roce, written independently of uroce), the ICRC of every RoCEv2
packet in a capture of the wire, as tcpdump or dumpcap write it.

usage: /usr/bin/python3 tests/scapy_icrc_check.py CAPTURE.pcap
Prints "packets N icrc_ok M superdatagrams S" (S: UDP datagrams to port 4791 longer than one RoCE packet's BTH,
payload and ICRC can explain, i.e. UDP_SEGMENT runs a capture of loopback shows whole) and exits 0 only when N > 0
and every packet's ICRC is the one scapy computes for it.
"""
import sys

from scapy.all import IP, UDP, raw, rdpcap
from scapy.contrib.roce import BTH


def main() -> int:
    packets = ok = superdatagrams = 0
    for p in rdpcap(sys.argv[1]):
        if IP not in p or UDP not in p or p[UDP].dport != 4791:
            continue
        packets += 1
        ip = IP(raw(p[IP]))
        if BTH not in ip:
            continue
        sent = raw(ip)[-4:]
        # Built again without its ICRC field, the BTH layer computes it (BTH.post_build / compute_icrc).
        rebuilt = ip.copy()
        rebuilt[BTH].icrc = None
        if raw(rebuilt)[-4:] == sent:
            ok += 1
        elif ip[IP].flags.DF and len(raw(ip[UDP].payload)) > 4096 + 64:
            superdatagrams += 1
    print(f"packets {packets} icrc_ok {ok} superdatagrams {superdatagrams}")
    return 0 if packets > 0 and ok == packets else 1


if __name__ == "__main__":
    sys.exit(main())
