// pcapgen: writes one RoCEv2 packet per opcode of IBTA table 38 (RC, UC, UD,
// and XRC of annex A14),
// each over IPv4 and over IPv6, built by src/roce's encoder and framed with
// its ICRC, into a pcap; and what each packet was meant to carry into a TSV
// file, for check_capture.py to compare with tshark's decoding and with an
// ICRC computed independently.
//
// Usage: pcapgen OUT.pcap OUT.tsv
#include <cstdio>
#include <vector>

#include "roce/headers.h"
#include "roce/icrc.h"
#include "roce/pcap.h"

using namespace sv::roce;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT.pcap OUT.tsv\n", argv[0]);
    return 2;
  }
  PcapWriter w;
  if (!w.open(argv[1])) return 1;
  FILE* tsv = std::fopen(argv[2], "w");
  if (!tsv) return 1;
  std::fprintf(tsv, "frame\tip\topcode\tdestqp\tpsn\tackreq\tse\tpadcnt\treth_va\treth_rkey\treth_len\taeth_syndrome"
                    "\taeth_msn\tswap\tcmp\torig\tqkey\tsrcqp\timm\tieth\txrcsrq\tpayload_len\ticrc\n");
  int frame = 0;
  for (int ipver : {4, 6}) {
    for (int opc = 0; opc < 256; opc++) {
      const OpcodeInfo& info = opcode_info(uint8_t(opc));
      if (!info.valid) continue;
      Packet p;
      p.bth.opcode = uint8_t(opc);
      p.bth.dest_qp = 0x100000 | uint32_t(opc) << 4 | uint32_t(ipver);
      p.bth.psn = (0xabc000 + uint32_t(opc) * 7) & 0xffffff;
      p.bth.ack_req = opc & 1;
      p.bth.se = (opc & 2) && info.request;
      p.reth = Reth{0x1122334455660000ull | uint64_t(opc), 0x0a0b0c00u | uint32_t(opc), 4096u + uint32_t(opc)};
      p.aeth = Aeth{uint8_t(opc % 3 == 0 ? syndrome_ack() : opc % 3 == 1 ? syndrome_rnr(uint8_t(opc & 31))
                                                                       : syndrome_nak(NakCode(opc % 4))),
                    0x5000u + uint32_t(opc)};
      p.atomic = AtomicEth{0x7700000000001000ull + uint64_t(opc) * 8, 0x1234u + uint32_t(opc),
                           0xdead000000000000ull | uint64_t(opc), 0xbeef000000000000ull | uint64_t(opc)};
      p.atomic_ack = AtomicAckEth{0xfeedface00000000ull | uint64_t(opc)};
      p.deth = Deth{0x11110000u | uint32_t(opc), 0x0800u + uint32_t(opc)};
      p.imm = 0x49000000u | uint32_t(opc);
      p.ieth_rkey = 0x1e000000u | uint32_t(opc);
      p.xrc_srqn = 0x5a0000u | uint32_t(opc);
      std::vector<uint8_t> payload;
      if (info.payload) {
        payload.resize(size_t(opc % 5 + 1) * 7);  // various pad counts
        for (size_t i = 0; i < payload.size(); i++) payload[i] = uint8_t(i * 31 + opc);
      }
      p.payload = payload;
      std::vector<uint8_t> transport(packet_size(p));
      if (build_packet(p, transport) != transport.size()) return 1;
      std::vector<uint8_t> ip(kIpv6UdpLen + transport.size() + kIcrcLen);
      size_t n;
      if (ipver == 4) {
        Ipv4Udp h;
        h.src = {10, 77, 0, 1};
        h.dst = {10, 77, 0, 2};
        h.tos = uint8_t(opc);  // masked by the ICRC
        h.ttl = uint8_t(64 - (opc & 7));
        n = frame_ipv4(h, transport, ip);
      } else {
        Ipv6Udp h;
        h.src = {0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        h.dst = {0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
        h.flow_label = 0x12345u + uint32_t(opc);
        h.tclass = uint8_t(opc);
        n = frame_ipv6(h, transport, ip);
      }
      if (n == 0) return 1;
      ip.resize(n);
      if (!w.write_ip(ip, uint64_t(frame) * 1000)) return 1;
      frame++;
      auto opt64 = [&](bool has, uint64_t v) {
        if (has) std::fprintf(tsv, "\t0x%016llx", (unsigned long long)v); else std::fprintf(tsv, "\t-");
      };
      auto opt32 = [&](bool has, uint32_t v) {
        if (has) std::fprintf(tsv, "\t0x%08x", v); else std::fprintf(tsv, "\t-");
      };
      std::fprintf(tsv, "%d\t%d\t%d\t0x%06x\t%u\t%d\t%d\t%u", frame, ipver, opc, p.bth.dest_qp, p.bth.psn,
                   int(p.bth.ack_req), int(p.bth.se), unsigned((4 - payload.size() % 4) % 4));
      const bool reth = info.has(kHasReth), aeth = info.has(kHasAeth), at = info.has(kHasAtomicEth);
      opt64(reth, p.reth.va);
      opt32(reth, p.reth.rkey);
      opt32(reth, p.reth.dma_len);
      opt32(aeth, p.aeth.syndrome);
      opt32(aeth, p.aeth.msn);
      opt64(at, p.atomic.swap_add);
      opt64(at, p.atomic.compare);
      opt64(info.has(kHasAtomicAckEth), p.atomic_ack.orig);
      opt32(info.has(kHasDeth), p.deth.qkey);
      opt32(info.has(kHasDeth), p.deth.src_qp);
      opt32(info.has(kHasImmDt), p.imm);
      opt32(info.has(kHasIeth), p.ieth_rkey);
      opt32(info.has(kHasXrcEth), p.xrc_srqn);
      std::fprintf(tsv, "\t%zu\t0x%08x\n", payload.size(), icrc_load(ip.data() + ip.size() - 4));
    }
  }
  std::fclose(tsv);
  return w.close() ? 0 : 1;
}
