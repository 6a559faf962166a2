#!/bin/bash
# A client/server program pair on 127.0.0.1 under softverbs, judged by exit
# codes alone (for programs whose output has nothing better to check).
#   pair.sh BIN_DIR PORT PROGRAM [ARGS...]
# The server runs PROGRAM ARGS, the client PROGRAM ARGS 127.0.0.1; ARGS must
# make PROGRAM listen on TCP PORT.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
prog=${3:?program}
shift 3
require "$prog"
compat_setup
run_pair "$prog" "$port" "$prog" "$@" -- "$prog" "$@" 127.0.0.1
finish
