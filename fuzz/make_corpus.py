#!/usr/bin/env python3
"""Writes the seed corpus for control_fuzz: one valid message per op (as the
library would send it), prefixed by the descriptor-count byte. Rerun when
the protocol changes: python3 fuzz/make_corpus.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "control")
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
       "DetachMcast", "OpenXrcd", "CloseXrcd", "ConnectXrc", "OpenQp", "RoceAttach", "PollCq"]
code = {name: i + 1 for i, name in enumerate(ops)}
write("hello", 0, header(code["Hello"]))
write("alloc_pd", 0, header(code["AllocPd"]))
write("dealloc_pd", 0, header(code["DeallocPd"]) + struct.pack("<II", 1, 0))
write("reg_backing", 1, header(code["RegBacking"]))
write("reg_mr", 0, header(code["RegMr"]) + struct.pack("<IIQQQII", 1, 2, 0x10000, 4096, 0x10000, 7, 0))
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
print("wrote", len(os.listdir(OUT)), "seeds to", OUT)
