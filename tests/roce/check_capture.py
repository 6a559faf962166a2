#!/usr/bin/env python3
"""Checks a capture of every RoCEv2 opcode built by src/roce (pcapgen):

1. the ICRC of each packet against two implementations written independently
   of src/roce: a few lines of Python over zlib.crc32 (IBTA A17.4.1 masking),
   and scapy's own (scapy.contrib.roce, IPv4 only);
2. tshark's decoding of each packet (opcode, QPN, PSN, AckReq, pad, RETH,
   AETH, AtomicETH, AtomicAckETH, DETH, ImmDt, IETH and the ICRC bytes)
   against what pcapgen meant to send (its TSV).
3. XRC (IBTA annex A14): tshark 4.0 names the XRC opcodes but decodes
   nothing after their BTH ("Unknown Header Sequence"): their BTH is
   checked by tshark as above, their extension headers (XRCETH first on
   requests, then RETH / AtomicETH / AETH / AtomicAckETH / ImmDt / IETH)
   by a decoder here.

Wireshark 4.0's InfiniBand dissector shows the ICRC but does not validate
it, hence (1). Usage: check_capture.py PCAPGEN WORKDIR. Exit 77 = skipped.
"""
import os
import shutil
import struct
import subprocess
import sys
import zlib


def read_pcap(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    assert magic in (0xA1B2C3D4, 0xA1B23C4D), hex(magic)
    off, frames = 24, []
    while off < len(data):
        _, _, incl, _ = struct.unpack("<IIII", data[off:off + 16])
        frames.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return frames


def icrc_zlib(ip):
    """ICRC of an IP datagram ending before the ICRC, per IBTA A17.4.1."""
    ip = bytearray(ip)
    if ip[0] >> 4 == 4:
        ihl = (ip[0] & 15) * 4
        ip[1] = 0xFF              # TOS
        ip[8] = 0xFF              # TTL
        ip[10:12] = b"\xff\xff"   # header checksum
    else:
        ihl = 40
        ip[0] |= 0x0F             # traffic class, flow label
        ip[1:4] = b"\xff\xff\xff"
        ip[7] = 0xFF              # hop limit
    ip[ihl + 6:ihl + 8] = b"\xff\xff"  # UDP checksum
    ip[ihl + 8 + 4] = 0xFF             # BTH resv8a
    return zlib.crc32(b"\xff" * 8 + bytes(ip)) & 0xFFFFFFFF


OPCODE_NAMES = {0x00: "SEND First", 0x01: "SEND Middle", 0x02: "SEND Last", 0x03: "SEND Last Imm",
                0x04: "SEND Only", 0x05: "SEND Only Imm", 0x06: "WRITE First", 0x07: "WRITE Middle",
                0x08: "WRITE Last", 0x0a: "WRITE Only", 0x0c: "READ Request", 0x0d: "READ resp First",
                0x0e: "READ resp Middle", 0x0f: "READ resp Last", 0x10: "READ resp Only", 0x11: "ACK",
                0x12: "ATOMIC ACK", 0x14: "FetchAdd", 0xa4: "XRC SEND Only", 0xb1: "XRC ACK"}


def verify_pcap(pcap, need):
    """Every RoCEv2 frame (IPv4 or IPv6) of a capture of real traffic: ICRC
    right (with the IP header as it was on the wire), DF set on IPv4, and
    tshark decodes it as InfiniBand; the opcodes in `need` all occur."""
    frames = read_pcap(pcap)
    errors, roce, xrc_srqs = [], 0, set()
    for i, fr in enumerate(frames, 1):
        ip = fr[14:]
        if fr[12:14] == b"\x08\x00":
            ihl = (ip[0] & 15) * 4
            if ip[9] != 17:
                continue
            ip = ip[:struct.unpack("!H", ip[2:4])[0]]
            if struct.unpack("!H", ip[6:8])[0] & 0x4000 == 0:
                errors.append("frame %d: DF not set" % i)
        elif fr[12:14] == b"\x86\xdd":
            ihl = 40
            if ip[6] != 17:
                continue
            ip = ip[:40 + struct.unpack("!H", ip[4:6])[0]]
        else:
            continue
        if struct.unpack("!H", ip[ihl + 2:ihl + 4])[0] != 4791:
            continue
        roce += 1
        if icrc_zlib(ip[:-4]) != struct.unpack("<I", ip[-4:])[0]:
            errors.append("frame %d: bad ICRC" % i)
        bth = ip[ihl + 8:]
        if bth[0] >> 5 == 5 and opcode_is_request(bth[0]):  # XRC request: XRCETH after the BTH
            if bth[12] != 0:
                errors.append("frame %d: XRCETH reserved byte %#x" % (i, bth[12]))
            xrc_srqs.add(int.from_bytes(bth[13:16], "big"))
    out = subprocess.run(["tshark", "-r", pcap, "-Y", "udp.dstport == 4791", "-T", "fields", "-e", "frame.number",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn",
                          "--disable-heuristic", "rpcrdma_infiniband", "--disable-heuristic",
                          "smb_direct_infiniband", "--disable-heuristic", "iser_infiniband"],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    seen = {}
    for line in out:
        f = line.split("\t")
        if len(f) < 4 or not f[1]:
            errors.append("tshark did not decode frame %s as InfiniBand" % f[0])
            continue
        seen[int(f[1])] = seen.get(int(f[1]), 0) + 1
    if len(out) != roce:
        errors.append("tshark saw %d RoCEv2 frames, the pcap has %d" % (len(out), roce))
    for op in need:
        if op not in seen:
            errors.append("no %s (opcode %d) in the capture" % (OPCODE_NAMES.get(op, "?"), op))
    for e in errors[:20]:
        print(e)
    if xrc_srqs:
        print("XRC requests name SRQs %s" % ", ".join(hex(x) for x in sorted(xrc_srqs)))
    print("%d RoCEv2 frames, ICRC and DF checked; opcodes: %s: %s" % (
        roce, ", ".join("%s %d" % (OPCODE_NAMES.get(k, hex(k)), v) for k, v in sorted(seen.items())),
        "FAILED" if errors else "ok"))
    return 1 if errors or roce == 0 else 0


def check_xrc_headers(row, ip):
    """The extension headers of an XRC packet (IP datagram `ip`, ICRC
    included) against the TSV row: XRCETH right after the BTH (8 reserved
    bits, the 24-bit XRC SRQ number), then the others in IBTA 9.2 order."""
    errs = []
    ihl = (ip[0] & 15) * 4 if ip[0] >> 4 == 4 else 40
    t = ip[ihl + 8:-4]  # BTH .. pad
    off = 12

    def take(n):
        nonlocal off
        b = t[off:off + n]
        off += n
        return b

    def want(name, col, val):
        if row[col] == "-" or int(row[col], 16) != val:
            errs.append("%s: decoded %#x, meant %s" % (name, val, row[col]))

    opc = int(row["opcode"])
    if row["xrcsrq"] != "-":
        x = take(4)
        if x[0] != 0:
            errs.append("XRCETH reserved byte %#x" % x[0])
        want("xrceth.srq", "xrcsrq", int.from_bytes(x[1:], "big"))
    elif opcode_is_request(opc):
        errs.append("request without XRCETH")
    if row["reth_va"] != "-":
        r = take(16)
        want("reth.va", "reth_va", int.from_bytes(r[:8], "big"))
        want("reth.rkey", "reth_rkey", int.from_bytes(r[8:12], "big"))
        want("reth.len", "reth_len", int.from_bytes(r[12:], "big"))
    if row["swap"] != "-":
        a = take(28)
        want("atomic.swap", "swap", int.from_bytes(a[12:20], "big"))
        want("atomic.cmp", "cmp", int.from_bytes(a[20:], "big"))
    if row["aeth_syndrome"] != "-":
        a = take(4)
        want("aeth.syndrome", "aeth_syndrome", a[0])
        want("aeth.msn", "aeth_msn", int.from_bytes(a[1:], "big"))
    if row["orig"] != "-":
        want("atomicack.orig", "orig", int.from_bytes(take(8), "big"))
    if row["imm"] != "-":
        want("immdt", "imm", int.from_bytes(take(4), "big"))
    if row["ieth"] != "-":
        want("ieth", "ieth", int.from_bytes(take(4), "big"))
    pad = (t[1] >> 4) & 3
    if len(t) - off - pad != int(row["payload_len"]):
        errs.append("payload %d bytes, meant %s" % (len(t) - off - pad, row["payload_len"]))
    return errs


def check_a19_headers(row, ip):
    """RC FLUSH (0x1c: BTH, FETH, RETH) and RC ATOMIC WRITE (0x1d: BTH,
    RETH, payload) of IBTA annex A19, which Debian 12's tshark does not
    decode past the BTH: the headers against the TSV row, read here."""
    errs = []
    ihl = (ip[0] & 15) * 4 if ip[0] >> 4 == 4 else 40
    t = ip[ihl + 8:-4]  # BTH .. pad
    off = 12 + (4 if int(row["opcode"]) == 0x1c else 0)  # FETH: placement and selectivity, not in the TSV
    for name, col, size in (("reth.va", "reth_va", 8), ("reth.rkey", "reth_rkey", 4), ("reth.len", "reth_len", 4)):
        val = int.from_bytes(t[off:off + size], "big")
        if row[col] == "-" or int(row[col], 16) != val:
            errs.append("%s: decoded %#x, meant %s" % (name, val, row[col]))
        off += size
    pad = (t[1] >> 4) & 3
    if len(t) - off - pad != int(row["payload_len"]):
        errs.append("payload %d bytes, meant %s" % (len(t) - off - pad, row["payload_len"]))
    return errs


def opcode_is_request(opc):
    """Table 38's requests: everything but READ responses and (atomic) ACKs."""
    return not 0x0d <= (opc & 0x1f) <= 0x12


def main():
    if sys.argv[1] == "--verify-pcap":
        return verify_pcap(sys.argv[2], [int(x, 0) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [])
    pcapgen, work = sys.argv[1], sys.argv[2]
    if not shutil.which("tshark"):
        print("tshark not installed: skipped")
        return 77
    os.makedirs(work, exist_ok=True)
    pcap, tsv = os.path.join(work, "all_opcodes.pcap"), os.path.join(work, "all_opcodes.tsv")
    subprocess.run([pcapgen, pcap, tsv], check=True)
    rows = [l.rstrip("\n").split("\t") for l in open(tsv)]
    cols, rows = rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]
    frames = read_pcap(pcap)
    assert len(frames) == len(rows) == 124, (len(frames), len(rows))  # 62 opcodes x IPv4, IPv6
    errors = []

    # 1a. zlib.
    for row, fr in zip(rows, frames):
        ip = fr[14:]
        wire = struct.unpack("<I", ip[-4:])[0]
        mine = icrc_zlib(ip[:-4])
        if not (wire == mine == int(row["icrc"], 16)):
            errors.append("frame %s: ICRC on wire %08x, zlib %08x, tsv %s" % (row["frame"], wire, mine, row["icrc"]))
    # The checker can fail: one flipped payload bit is caught.
    bad = bytearray(frames[0][14:])
    bad[-5] ^= 1
    assert icrc_zlib(bytes(bad[:-4])) != struct.unpack("<I", bad[-4:])[0]

    # 1b. scapy (IPv4; its ICRC has no IPv6 support).
    try:
        from scapy.layers.l2 import Ether
        from scapy.contrib.roce import BTH
        checked = 0
        for row, fr in zip(rows, frames):
            if row["ip"] != "4":
                continue
            p = Ether(fr)
            want = p[BTH].compute_icrc(None)
            if want != fr[-4:]:
                errors.append("frame %s: scapy ICRC %s, wire %s" % (row["frame"], want.hex(), fr[-4:].hex()))
            checked += 1
        assert checked == 62
    except ImportError:
        print("scapy not installed: its ICRC check skipped")

    # 2. tshark. Payload heuristics off, or SEND data is taken for RPC-over-RDMA etc.
    fields = ["frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
              "infiniband.bth.a", "infiniband.bth.se", "infiniband.bth.padcnt", "infiniband.reth.va",
              "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
              "infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt", "infiniband.atomicacketh.origremdt",
              "infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.immdt", "infiniband.ieth",
              "infiniband.invariant.crc", "_ws.malformed", "_ws.expert"]
    cmd = ["tshark", "-r", pcap, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
    for h in ["rpcrdma_infiniband", "smb_direct_infiniband", "iser_infiniband", "lnet_ib", "smcr_infiniband"]:
        cmd += ["--disable-heuristic", h]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == len(rows), (len(out), len(rows))

    def num(s):
        return int(s, 0) if s else None

    tshark_crcs = xrc_checked = 0
    for row, line in zip(rows, out):
        got = dict(zip(fields, line.split("\t")))
        fr = row["frame"]

        def expect(name, want, have):
            if want != have:
                errors.append("frame %s (opcode %s): %s: tshark %r, meant %r" % (fr, row["opcode"], name, have, want))

        opc = int(row["opcode"])
        expect("opcode", opc, num(got["infiniband.bth.opcode"]))
        if opc >> 5 == 5 or opc in (0x1c, 0x1d):  # XRC, A19: tshark stops after the BTH
            for f, want in (("destqp", int(row["destqp"], 16)), ("psn", int(row["psn"]))):
                expect(f, want, num(got["infiniband.bth." + f]))
            expect("ackreq", row["ackreq"] == "1", got["infiniband.bth.a"] in ("1", "True"))
            expect("padcnt", int(row["padcnt"]), num(got["infiniband.bth.padcnt"]))
            expect("malformed", "", got["_ws.malformed"])
            check = check_xrc_headers if opc >> 5 == 5 else check_a19_headers
            for e in check(row, frames[int(fr) - 1][14:]):
                errors.append("frame %s (opcode %s): %s" % (fr, opc, e))
            xrc_checked += 1
            continue
        expect("destqp", int(row["destqp"], 16), num(got["infiniband.bth.destqp"]))
        expect("psn", int(row["psn"]), num(got["infiniband.bth.psn"]))
        expect("ackreq", row["ackreq"] == "1", got["infiniband.bth.a"] in ("1", "True"))
        expect("se", row["se"] == "1", got["infiniband.bth.se"] in ("1", "True"))
        expect("padcnt", int(row["padcnt"]), num(got["infiniband.bth.padcnt"]))
        atomic = opc in (0x13, 0x14)
        if row["reth_va"] != "-" or atomic:
            # tshark shows the AtomicETH's VA and R_Key in the RETH fields.
            expect("va", num(got["infiniband.reth.va"]) is not None, True)
        if row["reth_va"] != "-":
            expect("reth.va", int(row["reth_va"], 16), num(got["infiniband.reth.va"]))
            expect("reth.rkey", int(row["reth_rkey"], 16), num(got["infiniband.reth.r_key"]))
            expect("reth.len", int(row["reth_len"], 16), num(got["infiniband.reth.dmalen"]))
        else:
            if not atomic:
                expect("no reth", "", got["infiniband.reth.va"])
        if row["aeth_syndrome"] != "-":
            expect("aeth.syndrome", int(row["aeth_syndrome"], 16), num(got["infiniband.aeth.syndrome"]))
            expect("aeth.msn", int(row["aeth_msn"], 16), num(got["infiniband.aeth.msn"]))
        else:
            expect("no aeth", "", got["infiniband.aeth.syndrome"])
        if row["swap"] != "-":
            expect("atomic.swap", int(row["swap"], 16), num(got["infiniband.atomiceth.swapdt"]))
            expect("atomic.cmp", int(row["cmp"], 16), num(got["infiniband.atomiceth.cmpdt"]))
        if row["orig"] != "-":
            expect("atomicack.orig", int(row["orig"], 16), num(got["infiniband.atomicacketh.origremdt"]))
        if row["qkey"] != "-":
            expect("deth.qkey", int(row["qkey"], 16), num(got["infiniband.deth.q_key"]))
            expect("deth.srcqp", int(row["srcqp"], 16), num(got["infiniband.deth.srcqp"]))
        if row["imm"] != "-":
            expect("immdt", row["imm"][2:], got["infiniband.immdt"].replace(":", ""))
        else:
            expect("no immdt", "", got["infiniband.immdt"])
        if row["ieth"] != "-":
            expect("ieth", row["ieth"][2:], got["infiniband.ieth"].replace(":", ""))
        # tshark reads the ICRC big-endian; it is sent least-significant byte first.
        crc = got["infiniband.invariant.crc"]
        if crc:
            tshark_crcs += 1
            expect("icrc", int.from_bytes(int(row["icrc"], 16).to_bytes(4, "little"), "big"), num(crc))
        expect("malformed", "", got["_ws.malformed"])

    if xrc_checked != 50:  # 23 XRC opcodes and the 2 of A19, x IPv4/IPv6
        errors.append("%d XRC and A19 packets checked by hand, not 50" % xrc_checked)
    if tshark_crcs < len(rows) // 2:
        errors.append("tshark showed only %d ICRCs" % tshark_crcs)
    for e in errors:
        print(e)
    print("%d packets, %d opcodes x IPv4/IPv6, %d ICRCs as tshark shows them: %s"
          % (len(rows), len(rows) // 2, tshark_crcs, "FAILED" if errors else "ok"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
