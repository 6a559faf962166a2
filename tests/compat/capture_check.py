"""Checks a `softverbs capture` of ibv_rc_pingpong -n 5 -s 4096 (capture.sh).

capture_check.py PCAPNG TSHARK_FIELDS SERVER_OUT CLIENT_OUT
"""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "roce"))
from check_capture import icrc_zlib  # noqa: E402


def pcapng_packets(path):
    """The packets of a pcapng file (Ethernet), as bytes."""
    data = open(path, "rb").read()
    at, out = 0, []
    while at + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, at)
        if btype == 6:
            caplen = struct.unpack_from("<I", data, at + 20)[0]
            out.append(data[at + 28:at + 28 + caplen])
        at += blen
    return out


def qp_psn(path):
    """(local QPN, local PSN) as ibv_rc_pingpong printed them."""
    m = re.search(r"local address: .*QPN (0x[0-9a-f]+), PSN (0x[0-9a-f]+)", open(path).read())
    assert m, "no local address in " + path
    return int(m.group(1), 16), int(m.group(2), 16)


def main():
    pcap, tsv, server, client = sys.argv[1:5]
    (sq, spsn), (cq, cpsn) = qp_psn(server), qp_psn(client)
    rows = [line.split() for line in open(tsv) if line.strip()]
    assert len(rows) == 50, "want 50 packets, got %d" % len(rows)
    # The client sends first; they take turns, 5 messages each.
    sender = [(cq, cpsn, sq), (sq, spsn, cq)]
    psn = {cq: cpsn, sq: spsn}
    msn = {cq: 0, sq: 0}
    for i in range(10):
        src, _, dst = sender[i % 2]
        for j, opc in enumerate([0, 1, 1, 2, 17]):
            row = rows[i * 5 + j]
            protos, dport, ulen, op, destqp, p = row[:6]
            assert "infiniband" in protos.split(":"), (i, j, protos)
            assert int(dport) == 4791, row
            assert int(op) == opc, ("opcode", i, j, row)
            if opc == 17:
                msn[dst] += 1
                assert int(destqp, 16) == src, ("ACK to the sender", row)
                assert int(p) == psn[src] - 1, ("ACK PSN: the last one's", row)
                assert int(row[6]) == msn[dst], ("MSN", row)
                assert int(ulen) == 8 + 12 + 4 + 4, row
            else:
                assert int(destqp, 16) == dst, ("dest QP", row)
                assert int(p) == psn[src], ("PSN", row, psn[src])
                psn[src] = (psn[src] + 1) & 0xFFFFFF
                assert int(ulen) == 8 + 12 + 1024 + 4, row
    for n, frame in enumerate(pcapng_packets(pcap)):
        ip = frame[14:]
        assert icrc_zlib(ip[:-4]) == struct.unpack("<I", ip[-4:])[0], ("ICRC", n + 1)
    print("capture: 50 packets, opcodes, QPNs, PSNs, MSNs, lengths and ICRCs as a NIC would send them")


if __name__ == "__main__":
    main()
