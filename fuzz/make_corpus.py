#!/usr/bin/env python3
"""Writes the seed corpus for control_fuzz: one valid message per op (as the
library would send it), prefixed by the descriptor-count byte. Rerun when
the protocol changes: python3 fuzz/make_corpus.py (CORPUS_OUT=DIR: write there)"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("CORPUS_OUT") or os.path.join(HERE, "corpus", "control")
MAGIC, VERSION = 0x53565250, 1


def header(op, seq=1):
    return struct.pack("<IHHIi", MAGIC, VERSION, op, seq, 0)


def write(name, nfds, body):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([nfds]) + body)


os.makedirs(OUT, exist_ok=True)
ops = ["Hello", "AllocPd", "DeallocPd", "RegBacking", "RegMr", "DeregMr", "CreateChannel",
       "DestroyChannel", "CreateCq", "DestroyCq", "CreateQp", "ModifyQp", "DestroyQp",
       "ConnectPeer", "GetMrBacking", "PeerError", "Status", "Accounts", "AllocMw", "DeallocMw",
       "BindMw", "InvalidateKey", "ClaimSocket", "ImportContext", "QueryPd", "QueryMr", "ImportCq",
       "ImportQp", "RegShmid", "RegShared", "ConnectUd", "RegAsync", "AsyncEvent", "CreateSrq",
       "DestroySrq", "SrqLimit", "NsPublish", "NsUnpublish", "NsOpen", "NsList", "ImportSrq",
       "ImportChannel", "Mediate", "ResizeCq", "ResizeCqDone", "GetCq", "CqError", "AttachMcast",
       "DetachMcast", "OpenXrcd", "CloseXrcd", "ConnectXrc", "OpenQp", "RoceAttach", "PollCq",
       "ReregMr"]
code = {name: i + 1 for i, name in enumerate(ops)}
write("hello", 0, header(code["Hello"]))
write("alloc_pd", 0, header(code["AllocPd"]))
write("dealloc_pd", 0, header(code["DeallocPd"]) + struct.pack("<II", 1, 0))
write("reg_backing", 1, header(code["RegBacking"]))
write("reg_mr", 0, header(code["RegMr"]) + struct.pack("<IIQQQII", 1, 2, 0x10000, 4096, 0x10000, 7, 0))
# ibv_rereg_mr: MR 1 moved to PD 1, backing 2, [0x20000, +8192), access 7.
write("rereg_mr", 0, header(code["ReregMr"]) + struct.pack("<IIIIQQQII", 1, 7, 1, 2, 0x20000, 8192, 0x20000, 7, 0))
write("create_channel", 1, header(code["CreateChannel"]))
write("create_cq", 0, header(code["CreateCq"]) + struct.pack("<II", 16, 0))
write("create_qp", 0, header(code["CreateQp"]) + struct.pack("<12I", 1, 3, 3, 0, 2, 16, 16, 1, 1, 0, 0, 0))
write("modify_qp", 0, header(code["ModifyQp"]) + struct.pack("<10IHBBBBBBBBBB16sHBB",
      0x10002, 0x1 | 0x10 | 0x20 | 0x8, 1, 0, 0, 0, 0, 0, 0, 6, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, b"\0" * 16, 0, 0, 0))
write("status", 0, header(code["Status"]))
write("alloc_mw", 0, header(code["AllocMw"]) + struct.pack("<II", 1, 2))
# Names and grants (issue 18): a region id, an open that expects its own
# object, a grantee's poll.
write("reg_shmid", 0, header(code["RegShmid"]) + struct.pack("<IIQQI64sI", 1, 1, 4096, 0, 1, b"x", 0))
write("ns_open_own", 0, header(code["NsOpen"]) + struct.pack("<II128s", 4, 1, b"/squat"))
write("import_cq", 0, header(code["ImportCq"]) + struct.pack("<II", 1, 0))
write("poll_cq", 0, header(code["PollCq"]) + struct.pack("<II", 1, 16))
write("bad_magic", 0, struct.pack("<IHHIi", 0xdeadbeef, 1, 2, 1, 0))


# Every op the daemon decodes, with a request of the right size (zeros after
# the header), as the first client and as the other user's client (bit 4 of
# the first byte, see control_fuzz.cc), without and with one descriptor (an
# eventfd; a sealed memfd for ops whose descriptor is a backing). The ops and
# their request sizes are read from the op table (src/common/protocol.h,
# proto::kOps) by the compiler, so a new op gets its seeds by rerunning this.
import re
import subprocess
import tempfile

ROOT = os.path.dirname(HERE)
with tempfile.TemporaryDirectory() as tmp:
    cc = os.path.join(tmp, "sizes.cc")
    with open(cc, "w") as f:
        f.write('#include <cstdio>\n#include "common/protocol.h"\nint main() {\n'
                '  for (const auto& i : sv::proto::kOps)\n'
                '    if (!i.event) std::printf("%s %u %u\\n", i.name, unsigned(i.op), unsigned(i.req_size));\n'
                '}\n')
    exe = os.path.join(tmp, "sizes")
    subprocess.run(["g++", "-std=c++20", "-I", os.path.join(ROOT, "src"), cc, "-o", exe], check=True)
    rows = [l.split() for l in subprocess.check_output([exe], text=True).splitlines()]
opcode = {r[0]: int(r[1]) for r in rows}
sizes = {r[0]: int(r[2]) for r in rows}
for op, size in sorted(sizes.items()):
    msg = header(opcode[op]) + b"\0" * (size - 16)
    base = "op_" + re.sub(r"(?<!^)([A-Z])", r"_\1", op).lower()
    for who in (0, 1):
        kind = 1 if op in ("RegBacking",) else 0
        write(f"{base}.u{who}", who << 4, msg)
        write(f"{base}.u{who}.fd", (who << 4) | (kind << 2) | 1, msg)
print("wrote", len(os.listdir(OUT)), "seeds to", OUT)
