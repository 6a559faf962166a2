#!/usr/bin/env python3
"""netdev_feature.py IFNAME FEATURE on|off: set one netdev feature (as
`ethtool -K IFNAME FEATURE on|off`, which this machine does not have) with
the SIOCETHTOOL ioctl: the feature's bit from the ETH_SS_FEATURES strings,
then ETHTOOL_SFEATURES. Used by the RoCE tests to make the kernel cut UDP GSO
sends before a veth (tx-udp-segmentation off), so that a capture sees the
datagrams a NIC would put on the wire. Needs CAP_NET_ADMIN."""
import ctypes
import fcntl
import socket
import struct
import sys

SIOCETHTOOL = 0x8946
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_SFEATURES = 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32


def ioctl(sock, ifname, buf):
    ifr = struct.pack("16sP", ifname.encode(), ctypes.addressof(buf)) + b"\0" * 16
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifr)


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in ("on", "off"):
        print(__doc__, file=sys.stderr)
        return 2
    ifname, feature, on = sys.argv[1], sys.argv[2], sys.argv[3] == "on"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    ioctl(s, ifname, info)
    count = struct.unpack_from("I", info.raw, 16)[0]
    strings = ctypes.create_string_buffer(struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                                          + b"\0" * (count * ETH_GSTRING_LEN))
    ioctl(s, ifname, strings)
    names = [strings.raw[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN].split(b"\0")[0].decode()
             for i in range(count)]
    if feature not in names:
        print(f"netdev_feature: {ifname} has no feature {feature}", file=sys.stderr)
        return 1
    bit = names.index(feature)
    words = (count + 31) // 32
    blocks = [[0, 0] for _ in range(words)]
    blocks[bit // 32] = [1 << (bit % 32), (1 << (bit % 32)) if on else 0]
    req = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_SFEATURES, words)
                                      + b"".join(struct.pack("II", v, r) for v, r in blocks))
    ioctl(s, ifname, req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
