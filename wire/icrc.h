// The RoCEv2 Invariant CRC (IBTA Annex A17.3.3) and the CRC-32 under it.
//
// ICRC = CRC-32 (IEEE 802.3: reflected, polynomial 0xEDB88320, initial value all 1s, result inverted -- the same
// function as zlib's crc32()) over
//   8 bytes of 0xFF                   (stands for the InfiniBand LRH, which RoCE does not carry)
//   the IP header with variant fields set to all 1s:
//     IPv4: TOS, TTL and header checksum;  IPv6: traffic class, flow label and hop limit
//   the UDP header with its checksum set to all 1s
//   the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to all 1s
//   the rest of the packet: extension headers, payload, pad -- everything up to but excluding the ICRC.
// The result is stored least significant byte first in the packet's last 4 bytes (as Linux rxe and scapy do).
//
// The IP and UDP headers are not in the datagram a UDP socket hands over, so they are rebuilt from the Flow:
//   IPv4: version 4, IHL 5 (no options), total length 20 + 8 + packet size, ID flow.ip_id, flags DF, fragment
//         offset 0, protocol 17, source and destination address.
//   IPv6: payload length 8 + packet size, next header 17 (no extension headers), source and destination address.
//   UDP:  flow.src.port, flow.dst.port, length 8 + packet size.
// These are the headers BuildIpUdpFrame writes and Linux rxe sends. A peer that sent without DF (or with IP
// options) produces a different ICRC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "wire/transport.h"

namespace uroce::wire {

// CRC-32 as zlib's crc32(): Crc32(0, data, n) is the CRC of data; Crc32(Crc32(0, a, n), b, m) is the CRC of a
// followed by b. Uses carry-less multiplication folding when the CPU has it -- on 512-bit registers (VPCLMULQDQ +
// AVX-512) for inputs of 256 bytes and more, else on 256-bit ones (VPCLMULQDQ + AVX2) for 128 bytes and more, else
// on 128-bit ones (PCLMULQDQ) -- and slicing-by-8 otherwise.
// The choice is made once, at the first CRC, from the CPU's feature bits and, where folding exists, by timing it
// against slicing-by-8 (an emulator may run carry-less multiplication slower than table lookups).
uint32_t Crc32(uint32_t crc, const uint8_t* data, size_t len);

// The implementations behind Crc32, exposed so tests can check they agree. Crc32Clmul must only be called when
// HaveClmul() is true, Crc32Vpclmul only when HaveVpclmul() is true, Crc32Vpclmul256 only when HaveVpclmul256() is.
uint32_t Crc32SliceBy8(uint32_t crc, const uint8_t* data, size_t len);
uint32_t Crc32Clmul(uint32_t crc, const uint8_t* data, size_t len);
uint32_t Crc32Vpclmul(uint32_t crc, const uint8_t* data, size_t len);
uint32_t Crc32Vpclmul256(uint32_t crc, const uint8_t* data, size_t len);
bool HaveClmul();
bool HaveVpclmul();
bool HaveVpclmul256();

// The ICRC of `packet` (BTH through ICRC; its last 4 bytes are not covered) as it travels in `flow`. This is the
// value to store little-endian in the last 4 bytes. Precondition: packet.size() >= kMinPacketSize (16); a shorter
// span yields 0.
uint32_t ComputeIcrc(const Flow& flow, std::span<const uint8_t> packet);

// Computes the ICRC and writes it into the last 4 bytes of `packet`. No-op when packet.size() < 16.
void SealIcrc(const Flow& flow, std::span<uint8_t> packet);

struct IcrcCheck {
  bool ok = false;
  uint32_t got = 0;   // as carried (last 4 bytes, little-endian)
  uint32_t want = 0;  // ComputeIcrc
};
// Compares the carried ICRC with the computed one. A packet shorter than 16 bytes is never ok.
IcrcCheck VerifyIcrc(const Flow& flow, std::span<const uint8_t> packet);

// For an IPv4 packet received without its IP header (a UDP socket does not report the IPv4 Identification, which the
// ICRC covers): the Identification under which the carried ICRC is correct, or nullopt when no 16-bit value makes it
// correct. flow.ip_id is ignored. The CRC is linear, so the unknown field changes the ICRC by a linear function of
// its 16 bits; solving for them checks everything else the ICRC covers, with a 2^-16 rather than 2^-32 chance that a
// corrupted packet passes. For an IPv6 flow (no Identification) it returns 0 when VerifyIcrc is ok, else nullopt.
// Cost: one ComputeIcrc plus a few hundred operations (the linear map is cached per packet length, per thread).
std::optional<uint16_t> RecoverIpId(const Flow& flow, std::span<const uint8_t> packet);

// The change to a sealed ICRC (XOR it into the value stored in the last 4 bytes) when an IPv4 packet of
// `packet_size` bytes (BTH through ICRC) leaves with an IP Identification that differs from the one it was sealed for
// by `id_xor` bits. A transport that hands the kernel a run of datagrams in one UDP_SEGMENT send re-seals with it:
// Linux numbers the segments' Identifications base, base+1, ... (wire/segmented_wire_test), and the ICRC covers them.
// The CRC is linear, so this costs a table lookup per set bit (the table is cached per packet length, per thread).
uint32_t IcrcIpIdChange(size_t packet_size, uint16_t id_xor);

}  // namespace uroce::wire
