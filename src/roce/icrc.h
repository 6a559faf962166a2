// icrc.h: the RoCEv2 invariant CRC (IBTA vol. 1 Annex A17.4, built on the
// ICRC of 7.8.1) and IPv4/IPv6 + UDP framing of a transport packet.
//
// The ICRC is CRC-32 (the Ethernet polynomial, reflected) over: 8 bytes of
// 0xFF standing for the masked LRH that RoCEv2 has not got, then the IP
// header with its variant fields set to ones (IPv4: TOS, TTL, header checksum;
// IPv6: traffic class, flow label, hop limit), the UDP header with its
// checksum set to ones, BTH with resv8a (FECN, BECN and the reserved bits)
// set to ones, then everything after BTH up to the ICRC. The result is
// inverted and sent least-significant byte first.
//
// Contract: pure functions, thread-safe; inputs are spans, never read past.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace sv::roce {

// Plain reflected CRC-32 state update (poly 0xEDB88320), no pre/post
// inversion: crc32_update(0xffffffff, data) ^ 0xffffffff is zlib's crc32.
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data);
// The same with tables only (no carry-less multiplication): for tests.
uint32_t crc32_update_tables(uint32_t crc, std::span<const uint8_t> data);
// The same with one kernel of the CPU's, for tests and benchmarks:
// crc32_update picks, by the CPU and the length, carry-less multiplication
// on 512-bit registers (AVX-512 VPCLMULQDQ, from 256 bytes on), on 128-bit
// ones (PCLMULQDQ), or tables. nullopt if this CPU has not got `kernel`.
enum class CrcKernel { kTables, kClmul128, kClmul512 };
std::optional<uint32_t> crc32_update_with(CrcKernel kernel, uint32_t crc, std::span<const uint8_t> data);

// The ICRC of an IP datagram (IPv4 or IPv6, by its version nibble) carrying
// UDP then a transport packet, `ip` ending just before the ICRC. nullopt if
// the datagram is malformed (too short, not UDP, IPv4 options are fine).
std::optional<uint32_t> icrc_compute(std::span<const uint8_t> ip);
// The same for a datagram in two pieces: its IP and UDP headers (`ip_udp`,
// as icrc_compute reads them) and the transport packet (BTH .. pad): no
// copy of the payload. nullopt if malformed.
std::optional<uint32_t> icrc_compute(std::span<const uint8_t> ip_udp, std::span<const uint8_t> transport);
// The same in two steps, for a sender or receiver that sees many datagrams
// with the same IP and UDP headers: icrc_prefix is the CRC state after the
// masked IP and UDP headers (it depends on the addresses, ports and
// lengths only: cache it per peer and length); icrc_finish goes on from it
// over the transport packet (BTH .. pad) given in pieces, and returns the
// ICRC. nullopt if malformed (the pieces hold fewer bytes than a BTH).
std::optional<uint32_t> icrc_prefix(std::span<const uint8_t> ip_udp);
std::optional<uint32_t> icrc_finish(uint32_t prefix, std::span<const std::span<const uint8_t>> transport);
// True if `ip` (ending with the ICRC) carries a correct ICRC.
bool icrc_check(std::span<const uint8_t> ip);
// The ICRC as it appears on the wire (least-significant byte first).
inline void icrc_store(uint8_t* p, uint32_t icrc) {
  p[0] = uint8_t(icrc); p[1] = uint8_t(icrc >> 8); p[2] = uint8_t(icrc >> 16); p[3] = uint8_t(icrc >> 24);
}
inline uint32_t icrc_load(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

struct Ipv4Udp {
  std::array<uint8_t, 4> src{}, dst{};
  uint16_t sport = 0xc000, dport = 4791;
  uint8_t ttl = 64, tos = 0;
  uint16_t id = 0;  // a UDP socket with IP_PMTUDISC_DO sends 0 (DF set)
};
struct Ipv6Udp {
  std::array<uint8_t, 16> src{}, dst{};
  uint16_t sport = 0xc000, dport = 4791;
  uint8_t hop_limit = 64, tclass = 0;
  uint32_t flow_label = 0;
};
constexpr size_t kIpv4UdpLen = 28, kIpv6UdpLen = 48;

// Write IP + UDP header + `transport` + ICRC into `out`; returns the size, 0
// if `out` is too small or the datagram would exceed 65535 bytes. The UDP
// checksum is 0 on IPv4 (as rxe sends it); on IPv6 it is computed (RFC 8200
// forbids 0).
// Only the IP + UDP headers of such a datagram (kIpv4UdpLen / kIpv6UdpLen
// bytes into `out`; the IPv6 UDP checksum left 0: the ICRC masks it).
// Returns the length, 0 if too long.
size_t header_ipv4(const Ipv4Udp& h, size_t transport_len, uint8_t* out);
size_t header_ipv6(const Ipv6Udp& h, size_t transport_len, uint8_t* out);
size_t frame_ipv4(const Ipv4Udp& h, std::span<const uint8_t> transport, std::span<uint8_t> out);
size_t frame_ipv6(const Ipv6Udp& h, std::span<const uint8_t> transport, std::span<uint8_t> out);

// Is `diff` a XOR of some of `deltas`? (Gaussian elimination over GF(2):
// a basis by leading bit, then reduce.) With deltas the ICRC differences of
// the 16 single-bit IPv4 IDs, this says whether an ICRC received matches
// the one computed with ID 0 for some ID: CRC-32 is affine in its input.
bool in_xor_span(std::span<const uint32_t> deltas, uint32_t diff);

}  // namespace sv::roce
