// pcap.h: a minimal pcap file writer (the classic libpcap format, link type
// Ethernet) so that tests and debugging can hand what the transport sends
// to tshark.
//
// Contract: one PcapWriter per file, not thread-safe; it owns its FILE*.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

namespace sv::roce {

class PcapWriter {
 public:
  PcapWriter() = default;
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;
  ~PcapWriter();
  bool open(const std::string& path);
  // Appends an Ethernet frame (fixed locally administered MACs) carrying the
  // IP datagram `ip` (IPv4 or IPv6, by its version nibble).
  bool write_ip(std::span<const uint8_t> ip, uint64_t time_ns);
  bool close();

 private:
  FILE* f_ = nullptr;
};

}  // namespace sv::roce
