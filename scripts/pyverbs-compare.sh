#!/usr/bin/env bash
# rdma-core's own tests (pyverbs, Debian's python3-pyverbs) on softverbs and on
# Linux rxe, side by side (docs/COMPAT.md, "rdma-core's tests: softverbs and
# rxe side by side"): a markdown table of every test with each side's result
# (pass, **FAIL**, **ERROR**, skip: reason), rows where softverbs does worse
# than rxe marked, and a summary line of counts per side.
#
#   scripts/pyverbs-compare.sh [options] [SOFTVERBS_LOG] RXE_LOG
#   scripts/pyverbs-compare.sh --rxe-log tests/compat/data/pyverbs-rxe.log
#
# The logs are `run_tests.py -v` output (one result line per test). Without a
# softverbs log, the suite is run on softverbs here: the tests are unpacked
# from /usr/share/doc/rdma-core/tests to a temporary directory and run with
# Debian's /usr/bin/python3 under `BUILD/bin/softverbs run`, in a private
# SOFTVERBS_DIR. The rxe log is measured once in the qemu guest of
# scripts/rxe-peer.sh (see the header of tests/compat/data/pyverbs-rxe.log).
#
#   --rxe-log FILE        the rxe side (default tests/compat/data/pyverbs-rxe.log)
#   --softverbs-log FILE  the softverbs side, instead of running the suite
#   --build DIR           where softverbs is built (default: build)
#   --save FILE           also keep the softverbs log that was run here
#   --not-passed          only the rows where either side did not pass, less the
#                         vendor-specific ones (mlx5, EFA, CUDA) skipped on both
#   --check               exit 1 if softverbs does worse than rxe in any row
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rxe_log=$here/tests/compat/data/pyverbs-rxe.log
sv_log=""
build=$here/build
save=""
only=0
check=0
pos=()
while [ $# -gt 0 ]; do
  case $1 in
    --rxe-log) rxe_log=$2; shift 2 ;;
    --softverbs-log) sv_log=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --save) save=$2; shift 2 ;;
    --not-passed) only=1; shift ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "pyverbs-compare: unknown option $1" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
case ${#pos[@]} in
  0) ;;
  1) rxe_log=${pos[0]} ;;
  2) sv_log=${pos[0]}; rxe_log=${pos[1]} ;;
  *) echo "usage: $0 [options] [SOFTVERBS_LOG] RXE_LOG" >&2; exit 2 ;;
esac
[ -r "$rxe_log" ] || { echo "pyverbs-compare: no rxe log $rxe_log" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs the suite on softverbs, its verbose log in $1.
run_softverbs() {
  local src=/usr/share/doc/rdma-core/tests
  [ -d "$src" ] || { echo "pyverbs-compare: $src missing (apt-get install python3-pyverbs)" >&2; exit 1; }
  [ -x "$build/bin/softverbs" ] ||
    { echo "pyverbs-compare: build softverbs first (targets softverbs softverbsd ibverbs_dropin rdmacm_dropin)" >&2; exit 1; }
  cp -r "$src" "$tmp/tests"
  gunzip -rq "$tmp/tests"
  # The daemon's directory must be the user's, mode 0700 (docs/SECURITY.md).
  mkdir -m 0700 "$tmp/dir"
  echo "# rdma-core tests (python3-pyverbs $(dpkg-query -W -f='${Version}' python3-pyverbs 2>/dev/null))" \
    "on softverbs $(git -C "$here" describe --always --dirty 2>/dev/null)" >"$1"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), host kernel: Linux $(uname -r)" >>"$1"
  (cd "$tmp" && SOFTVERBS_DIR=$tmp/dir timeout "${PYVERBS_TIMEOUT:-1800}" \
    "$build/bin/softverbs" run /usr/bin/python3 tests/run_tests.py -v) >>"$1" 2>&1 || true
}

if [ -z "$sv_log" ]; then
  sv_log=$tmp/softverbs.log
  run_softverbs "$sv_log"
  [ -z "$save" ] || cp "$sv_log" "$save"
fi

python3 - "$sv_log" "$rxe_log" "$only" "$check" <<'EOF'
import re, sys

HEAD = re.compile(r'^(test\w*) \(([\w.]+)\)')
RESULT = re.compile(r"^(ok|FAIL|ERROR|skipped (.*)|expected failure|unexpected success)$")


def parse(path):
    """Per test id (module.Class.test): (kind, detail), kind one of pass,
    FAIL, ERROR, skip; the detail is the skip reason or the exception."""
    res, order, cur, summary = {}, [], None, False
    lines = open(path, errors='replace').read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith('=' * 20) or line.startswith('Ran '):
            summary = True
        if summary:
            m = re.match(r'^(ERROR|FAIL): (\w+) \(([\w.]+)\)', line)
            if m:
                tid = m.group(3).removeprefix('tests.')
                detail = exception(lines, i)
                if tid in res:
                    res[tid] = (res[tid][0], detail)
            continue
        m = HEAD.match(line)
        if m:
            cur = m.group(2).removeprefix('tests.')
            if not cur.endswith('.' + m.group(1)):
                cur += '.' + m.group(1)
        if cur is None:
            continue
        tail = line.rsplit(' ... ', 1)[1] if ' ... ' in line else line
        r = RESULT.match(tail.strip())
        if not r:
            continue
        word = r.group(1)
        if word == 'ok':
            kind, detail = 'pass', ''
        elif word.startswith('skipped'):
            kind, detail = 'skip', r.group(2).strip('\'"')
        elif word in ('FAIL', 'ERROR'):
            kind, detail = word, ''
        else:
            kind, detail = word, ''
        if cur not in res:
            order.append(cur)
        res[cur] = (kind, detail)
        cur = None
    return res, order


def exception(lines, i):
    """The last line of the traceback that starts at lines[i]."""
    last = ''
    for line in lines[i + 2:]:
        if line.startswith('=' * 20) or line.startswith('-' * 20) and last:
            break
        if line.strip() and not line.startswith('-' * 20):
            last = line.strip()
    # pyverbs.pyverbs_error.PyverbsRDMAError: ... -> PyverbsRDMAError: ...
    return re.sub(r'^[\w.]*\.(\w+:)', r'\1', last)


def cell(r):
    if r is None:
        return 'not run'
    kind, detail = r
    if kind == 'pass':
        return 'pass'
    if kind == 'skip':
        return 'skip: ' + detail.replace('|', '\\|')
    text = '**%s**' % kind
    return text + (': ' + detail.replace('|', '\\|') if detail else '')


def vendor(t):
    """Tests of one vendor's device (mlx5, EFA) or of CUDA."""
    return re.match(r'test_(mlx5|efa|cuda)', t) is not None


def rank(r):
    if r is None:
        return 3
    return {'pass': 0, 'skip': 1}.get(r[0], 2)


def counts(res):
    c = {'pass': 0, 'FAIL': 0, 'ERROR': 0, 'skip': 0}
    for kind, _ in res.values():
        c[kind] = c.get(kind, 0) + 1
    return '%d pass, %d FAIL, %d ERROR, %d skip of %d' % (
        c['pass'], c['FAIL'], c['ERROR'], c['skip'], len(res))


sv, sv_order = parse(sys.argv[1])
rxe, rxe_order = parse(sys.argv[2])
only = sys.argv[3] == '1'
check = sys.argv[4] == '1'
ids = sv_order + [t for t in rxe_order if t not in sv]
worse = [t for t in ids if rank(sv.get(t)) > rank(rxe.get(t))]
better = [t for t in ids if rank(sv.get(t)) < rank(rxe.get(t))]
omitted = 0
print('| test | softverbs | rxe | |')
print('| --- | --- | --- | --- |')
for t in ids:
    a, b = sv.get(t), rxe.get(t)
    if only and rank(a) == 0 and rank(b) == 0:
        continue
    if only and vendor(t) and rank(a) == 1 and rank(b) == 1:
        omitted += 1
        continue
    mark = '**worse**' if t in worse else ('better' if t in better else '')
    print('| `%s` | %s | %s | %s |' % (t, cell(a), cell(b), mark))
print()
if omitted:
    print('Not listed: %d tests that pass on both, %d vendor-specific tests '
          '(mlx5, EFA, CUDA) skipped on both.' % (
              sum(1 for t in ids if rank(sv.get(t)) == 0 and rank(rxe.get(t)) == 0),
              omitted))
    print()
print('softverbs: %s; rxe: %s. softverbs worse than rxe in %d, better in %d.'
      % (counts(sv), counts(rxe), len(worse), len(better)))
sys.exit(1 if check and worse else 0)
EOF
