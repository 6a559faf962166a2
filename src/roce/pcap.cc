#include "roce/pcap.h"

#include <cstring>
#include <vector>

namespace sv::roce {
namespace {
void put_le32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (8 * i)); }
void put_le16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
}  // namespace

PcapWriter::~PcapWriter() { close(); }

bool PcapWriter::open(const std::string& path) {
  close();
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) return false;
  uint8_t h[24];
  put_le32(h, 0xa1b23c4d);  // nanosecond-resolution pcap
  put_le16(h + 4, 2);
  put_le16(h + 6, 4);
  put_le32(h + 8, 0);
  put_le32(h + 12, 0);
  put_le32(h + 16, 65535);  // snaplen
  put_le32(h + 20, 1);      // LINKTYPE_ETHERNET
  return std::fwrite(h, sizeof h, 1, f_) == 1;
}

bool PcapWriter::write_ip(std::span<const uint8_t> ip, uint64_t time_ns) {
  if (!f_ || ip.empty()) return false;
  std::vector<uint8_t> rec(16 + 14 + ip.size());
  uint8_t* r = rec.data();
  put_le32(r, uint32_t(time_ns / 1000000000));
  put_le32(r + 4, uint32_t(time_ns % 1000000000));
  put_le32(r + 8, uint32_t(14 + ip.size()));
  put_le32(r + 12, uint32_t(14 + ip.size()));
  static const uint8_t kDst[6] = {0x02, 0, 0, 0, 0, 2}, kSrc[6] = {0x02, 0, 0, 0, 0, 1};
  std::memcpy(r + 16, kDst, 6);
  std::memcpy(r + 22, kSrc, 6);
  const bool v6 = (ip[0] >> 4) == 6;
  r[28] = v6 ? 0x86 : 0x08;
  r[29] = v6 ? 0xdd : 0x00;
  std::memcpy(r + 30, ip.data(), ip.size());
  return std::fwrite(r, rec.size(), 1, f_) == 1;
}

bool PcapWriter::close() {
  if (!f_) return true;
  bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  return ok;
}

}  // namespace sv::roce
