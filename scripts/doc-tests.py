#!/usr/bin/env python3
"""The docs as tests: runs every command block of the user-facing docs.

    scripts/doc-tests.py [--build DIR | --installed] [--source DIR] [--no-user]
                         [--timeout S] [FILE...]

Blocks: the ```sh fenced blocks of README.md and docs/CONTAINERS.md, and the
.nf/.fi blocks of the EXAMPLES sections of docs/man/* (roff escapes \\- and
\\e undone). Each runs as written, with `bash` under `set -e -o pipefail`,
in a clean temporary directory per file, which holds links to the source
tree's top-level entries (commands written from the repository's root work)
and a copy of the build tree's programs and libraries as `build/` (bin/,
lib/), whose bin/ is first on PATH (--installed: the installed package's
softverbs on PATH instead, no build/). The blocks of one file are one
session: shell variables a block sets are given to the next.

Namespaces (when this runs as root): each file's blocks run in a mount
namespace of the file's own, with a private copy of /etc (`softverbs
enable`, `softverbs cdi --output /etc/cdi/...` change only that) and empty
/run/softverbs and /run/cdi, and in a network namespace of its own (lo up:
servers' ports and UDP 4791 are the file's, whatever else runs on the
machine); podman containers the blocks leave are removed at the end.

Identities: every block runs as root (when this runs as root), with an
XDG_RUNTIME_DIR of its own, and `sudo` as the command
itself (root's sudo, no prompt). A block with no `sudo` speaks to users
too: it runs again as a user made for the run (useradd, removed after),
with no XDG_RUNTIME_DIR, as a fresh login has none under su or ssh
without a session manager (--no-user: not). Not as root: blocks run as the
caller only, and a block with `sudo` is skipped.

Directives, in the doc itself, on the last non-blank line before the block:
    <!-- doc-test: skip (REASON) -->              not run (another host...)
    <!-- doc-test: skip-lines N[-M],... (REASON) --> those lines of it not run
    <!-- doc-test: root (REASON) -->              run as root only
and in a man page, the line before .nf:  .\\" doc-test: skip (REASON)

Processes: each block runs in a session of its own, with a marker in its
environment (SOFTVERBS_DOC_TEST); whatever carries the marker (a server
started with `&`, the daemon the library started) is killed once the
file's blocks are done, by pid. A block runs at most --timeout seconds, all
of them at most --budget seconds (then the rest fail unrun, and the
clean-up still runs: within ctest's and scripts/test.sh's time limits).

Output: one line per block and identity (FILE:LINE, identity, ok / FAIL /
skip, seconds), then a digest of the failures, each with the block and
the end of its stderr. Exit status 0 if no block failed, 1 otherwise.
"""
import argparse
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DIRECTIVE_MD = re.compile(r'<!--\s*doc-test:\s*(skip-lines|skip|root)\s*([0-9,\- ]*?)\s*(?:\((.*)\))?\s*-->')
DIRECTIVE_ROFF = re.compile(r'^\.\\"\s*doc-test:\s*(skip-lines|skip|root)\s*([0-9,\- ]*?)\s*(?:\((.*)\))?\s*$')
FENCE = re.compile(r'^(\s*)```(\S*)\s*$')


VERBOSE = False
DEADLINE = 0.0


class Block:
    def __init__(self, path, line, lines, directive):
        self.path, self.line, self.lines = path, line, lines
        self.kind = directive.group(1) if directive else None
        self.arg = directive.group(2).strip() if directive else ''
        self.reason = (directive.group(3) or '').strip() if directive else ''

    def text(self):
        """The block's commands, without the lines a skip-lines directive names."""
        if self.kind != 'skip-lines':
            return '\n'.join(self.lines) + '\n'
        drop = set()
        for part in filter(None, (p.strip() for p in self.arg.split(','))):
            lo, _, hi = part.partition('-')
            drop.update(range(int(lo), int(hi or lo) + 1))
        return '\n'.join(l for i, l in enumerate(self.lines, 1) if i not in drop) + '\n'

    def uses_sudo(self):
        return re.search(r'(^|[\s;&|(])sudo\s', self.text()) is not None


def md_blocks(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        j = i + 1
        while j < len(lines) and not re.match(r'^\s*```\s*$', lines[j]):
            j += 1
        if lang == 'sh':
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            d = DIRECTIVE_MD.search(lines[k]) if k >= 0 else None
            out.append(Block(path, i + 1, [l[indent:] if l[:indent].isspace() else l for l in lines[i + 1:j]], d))
        i = j + 1
    return out


def roff_unescape(line):
    return line.replace('\\-', '-').replace('\\e', '\\').replace("\\(aq", "'").replace('\\(dq', '"').replace('\\&', '')


def man_blocks(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    out, section, i = [], '', 0
    while i < len(lines):
        l = lines[i]
        if l.startswith('.SH'):
            section = l[3:].strip().strip('"').upper()
        if section.startswith('EXAMPLE') and l.strip() == '.nf':
            j = i + 1
            while j < len(lines) and lines[j].strip() != '.fi':
                j += 1
            d = DIRECTIVE_ROFF.match(lines[i - 1]) if i > 0 else None
            body = [roff_unescape(x) for x in lines[i + 1:j] if not x.startswith('.')]
            out.append(Block(path, i + 1, body, d))
            i = j
        i += 1
    return out


def default_files(source):
    files = [os.path.join(source, 'README.md'), os.path.join(source, 'docs', 'CONTAINERS.md')]
    man = os.path.join(source, 'docs', 'man')
    if os.path.isdir(man):
        files += sorted(os.path.join(man, f) for f in os.listdir(man) if re.search(r'\.[1-8]$', f))
    return files


def blocks_of(path):
    return man_blocks(path) if re.search(r'\.[1-8]$', path) else md_blocks(path)


# ---- Processes ---------------------------------------------------------------

def marked_pids(marker):
    """The processes whose environment holds `marker` (readable ones: ours, or all as root)."""
    want = marker.encode()
    pids = []
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f'/proc/{p}/environ', 'rb') as f:
                if want in f.read().split(b'\0'):
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def pids_of_uid(uid):
    pids = []
    for p in os.listdir('/proc'):
        try:
            if p.isdigit() and os.stat(f'/proc/{p}').st_uid == uid:
                pids.append(int(p))
        except OSError:
            pass
    return pids


def kill_all(find, rounds=20):
    """SIGTERM, then SIGKILL, whatever find() names, until nothing is left."""
    for r in range(rounds):
        pids = find()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM if r < 5 else signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


# ---- Workspaces --------------------------------------------------------------

SUDO_SHIM = '''#!/bin/sh
# doc-tests.py: root's sudo runs the command itself, as root, with this environment.
while [ $# -gt 0 ]; do
  case $1 in
    -E|-H|-n|--preserve-env) shift ;;
    --) shift; break ;;
    -*) echo "doc-tests sudo: option $1 is not handled here" >&2; exit 2 ;;
    *) break ;;
  esac
done
exec "$@"
'''

WRAPPER = '''# doc-tests.py: one block, in the file's session
cd "$1"
__doc_state=$2
[ -f "$__doc_state" ] && source "$__doc_state"
__doc_before=" $(compgen -v | tr '\\n' ' ') "
__doc_save() {
  local __v
  for __v in $(compgen -v); do
    case "$__doc_before" in *" $__v "*) continue ;; esac
    case $__v in __doc_*|BASH_*|FUNCNAME|PIPESTATUS|_) continue ;; esac
    declare -p "$__v" 2>/dev/null
  done >> "$__doc_state"
}
trap __doc_save EXIT
trap 'echo "doc-tests: exit $? from: $BASH_COMMAND" >&2' ERR
set -e -o pipefail
source "$3"
'''


class Identity:
    def __init__(self, name, uid, gid, home, as_root):
        self.name, self.uid, self.gid, self.home, self.as_root = name, uid, gid, home, as_root


def make_user(work):
    name = 'svdoc' + secrets.token_hex(3)
    home = os.path.join(work, 'home-' + name)
    os.mkdir(home)
    subprocess.run(['useradd', '--no-create-home', '--home-dir', home, '--shell', '/bin/bash',
                    '--user-group', name], check=True)
    pw = pwd.getpwnam(name)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    return Identity(name, pw.pw_uid, pw.pw_gid, home, False)


def remove_user(ident):
    kill_all(lambda: pids_of_uid(ident.uid))
    subprocess.run(['userdel', ident.name], check=False)
    shutil.rmtree(f'/tmp/softverbs-{ident.uid}', ignore_errors=True)


def session_dir(work, source, ident, path, build_view):
    """A clean directory for one file's blocks: the source tree's entries, linked, and build/."""
    d = os.path.join(work, f'{ident.name}-{os.path.basename(path)}')
    os.mkdir(d)
    for e in os.listdir(source):
        if e not in ('build', '.git') and not e.startswith('build-'):
            os.symlink(os.path.join(source, e), os.path.join(d, e))
    if build_view:
        os.symlink(build_view, os.path.join(d, 'build'))
    if not ident.as_root or os.geteuid() != 0:
        os.chown(d, ident.uid, ident.gid)
    return d


def copy_build(build, work):
    """The build tree's programs and libraries, readable by everyone, as BUILD/bin and BUILD/lib."""
    view = os.path.join(work, 'build')
    for sub in ('bin', 'lib'):
        os.makedirs(os.path.join(view, sub))
    for f in ('softverbs', 'softverbsd'):
        shutil.copy2(os.path.join(build, 'bin', f), os.path.join(view, 'bin', f))
    libdir = os.path.join(build, 'lib')
    for f in os.listdir(libdir):
        if re.match(r'lib(ibverbs|rdmacm)\.so', f):
            src = os.path.join(libdir, f)
            dst = os.path.join(view, 'lib', f)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
    return view


# ---- Running -----------------------------------------------------------------

def run_block(block, ident, env, sdir, state, work, holder, timeout):
    """Runs one block (in `holder`'s namespaces, if any); returns (verdict, seconds, output tail)."""
    script = os.path.join(work, f'block-{secrets.token_hex(4)}.sh')
    with open(script, 'w') as f:
        f.write(block.text())
    wrapper = os.path.join(work, 'wrapper.sh')
    if not os.path.exists(wrapper):
        with open(wrapper, 'w') as f:
            f.write(WRAPPER)
    for p in (script, wrapper):
        os.chmod(p, 0o644)
    cmd = ['bash', wrapper, sdir, state, script]
    if not ident.as_root:
        cmd = ['setpriv', f'--reuid={ident.uid}', f'--regid={ident.gid}', '--clear-groups', '--'] + cmd
    if holder:
        cmd = holder.enter() + cmd
    out_path, err_path = script + '.out', script + '.err'
    start = time.monotonic()
    with open(out_path, 'wb') as out, open(err_path, 'wb') as err:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
            timed_out = True
    secs = time.monotonic() - start
    if VERBOSE:
        with open(out_path, 'rb') as f, open(err_path, 'rb') as g:
            sys.stdout.write(f'--- {block.path}:{block.line} as {ident.name}\n' + f.read().decode(errors='replace') +
                             g.read().decode(errors='replace'))
    with open(err_path, 'rb') as f:
        err_text = f.read().decode(errors='replace')
    with open(out_path, 'rb') as f:
        out_text = f.read().decode(errors='replace')
    if timed_out:
        err_text += f'\n(doc-tests: killed after {timeout} s)\n'
    tail = '\n'.join(err_text.rstrip('\n').split('\n')[-40:])
    if out_text.strip():
        tail = '\n'.join(out_text.rstrip('\n').split('\n')[-15:]) + '\n(stdout, last lines, above; stderr below)\n' + tail
    return ('ok' if rc == 0 and not timed_out else f'FAIL (exit {rc})' if not timed_out else 'FAIL (timeout)'), secs, tail


def environment(ident, path_first, marker, xdg):
    env = {
        'PATH': ':'.join(path_first + ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']),
        'HOME': ident.home, 'USER': ident.name, 'LOGNAME': ident.name, 'SHELL': '/bin/bash',
        'LANG': 'C.UTF-8', 'TERM': 'dumb', 'SOFTVERBS_DOC_TEST': marker,
    }
    if xdg:
        env['XDG_RUNTIME_DIR'] = xdg
    return env


class Namespaces:
    """The mount and network namespaces of one file's run (root only), held by a
    process: a private copy of /etc, empty /run/softverbs and /run/cdi, lo up.
    Every block enters them (nsenter), so that what one block leaves (a
    container's namespaces under /run/netns, a spec in /etc/cdi) is there for
    the next; containers its blocks left are removed inside them at the end."""

    SETUP = ('mount --bind "$1" /etc && mkdir -p /run/softverbs /run/cdi && mount --bind "$2" /run/softverbs && '
             'mount --bind "$3" /run/cdi && ip link set lo up && echo ready && exec sleep infinity')

    def __init__(self, work, tag):
        etc = os.path.join(work, f'etc-{tag}')
        subprocess.run(['cp', '-a', '/etc', etc], check=True)
        dirs = []
        for d in ('run-softverbs', 'run-cdi'):
            dirs.append(os.path.join(work, f'{d}-{tag}'))
            os.mkdir(dirs[-1], 0o755)
        self.proc = subprocess.Popen(['unshare', '--mount', '--propagation', 'private', '--net', '--', 'bash', '-c',
                                      self.SETUP, 'doc-ns', etc] + dirs, stdout=subprocess.PIPE,
                                     start_new_session=True)
        if self.proc.stdout.readline().strip() != b'ready':
            raise RuntimeError('doc-tests.py: could not make the namespaces (unshare, mount, ip)')
        self.containers = set(self.podman_ps())

    def enter(self):
        pid = self.proc.pid
        return ['nsenter', f'--mount=/proc/{pid}/ns/mnt', f'--net=/proc/{pid}/ns/net', '--']

    def podman_ps(self):
        if not shutil.which('podman'):
            return []
        r = subprocess.run(self.enter() + ['podman', 'ps', '-aq', '--no-trunc'], capture_output=True, text=True)
        return r.stdout.split() if r.returncode == 0 else []

    def close(self, rel):
        left = [c for c in self.podman_ps() if c not in self.containers]
        if left:
            print(f'{rel}: removing {len(left)} container(s) its blocks left', flush=True)
            subprocess.run(self.enter() + ['podman', 'rm', '-f', '--depend'] + left, capture_output=True)
        self.proc.kill()
        self.proc.wait()


def run_file(path, args, work, build_view, idents, results):
    """Each identity's run of one file's blocks, in namespaces of the file's own (Namespaces)."""
    blocks = blocks_of(path)
    rel = os.path.relpath(path, args.source)
    for ident in idents:
        tag = f'{ident.name}-{os.path.basename(path)}'
        holder = Namespaces(work, tag) if os.geteuid() == 0 and not args.host_namespaces else None
        try:
            run_identity(path, rel, blocks, args, work, build_view, ident, idents, holder, results)
        finally:
            if holder:
                holder.close(rel)


def run_identity(path, rel, blocks, args, work, build_view, ident, idents, holder, results):
    """One identity's run of one file's blocks, in the file's session directory."""
    marker = secrets.token_hex(8)
    xdg = None
    sdir = session_dir(work, args.source, ident, path, build_view)
    if ident.as_root:
        xdg = os.path.join(sdir, '.run')
        os.mkdir(xdg, 0o700)
    path_first = [os.path.join(build_view, 'bin')] if build_view else []
    if ident.as_root and os.geteuid() == 0:
        path_first.append(os.path.join(work, 'shim'))
    env = environment(ident, path_first, marker, xdg)
    state = os.path.join(sdir, '.doc-test-state')
    try:
        for b in blocks:
            where = f'{rel}:{b.line}'
            if b.kind == 'skip':
                if ident is idents[0]:
                    report(results, where, ident.name, f'skip ({b.reason})', 0.0, b, '')
                continue
            if not ident.as_root and (b.kind == 'root' or b.uses_sudo()):
                continue  # root's block only
            if ident.as_root and os.geteuid() != 0 and b.uses_sudo():
                report(results, where, ident.name, 'skip (uses sudo: run doc-tests.py as root)', 0.0, b, '')
                continue
            left = DEADLINE - time.monotonic()
            if left < 1:
                report(results, where, ident.name, f'FAIL (not run: past --budget {args.budget} s)', 0.0, b, '')
                continue
            verdict, secs, tail = run_block(b, ident, env, sdir, state, work, holder, min(args.timeout, int(left)))
            if b.kind == 'skip-lines' and verdict == 'ok':
                verdict = f'ok (lines {b.arg} not run: {b.reason})'
            report(results, where, ident.name, verdict, secs, b, tail)
    finally:
        kill_all(lambda: marked_pids('SOFTVERBS_DOC_TEST=' + marker))


def report(results, where, who, verdict, secs, block, tail):
    print(f'{where:<24} {who:<14} {verdict:<8} {secs:6.1f} s', flush=True)
    results.append((where, who, verdict, block, tail))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', help='the build tree (its bin/ and lib/)')
    ap.add_argument('--installed', action='store_true', help="the installed package's softverbs, no build tree")
    ap.add_argument('--source', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    ap.add_argument('--no-user', action='store_true', help='run no block as a made user')
    ap.add_argument('--timeout', type=int, default=120, help='seconds per block')
    ap.add_argument('--host-namespaces', action='store_true',
                    help="run in this mount and network namespace, not in each file's own (root's /etc changes!)")
    ap.add_argument('files', nargs='*')
    ap.add_argument('--verbose', action='store_true', help="print each block's output")
    ap.add_argument('--budget', type=int, default=270,
                    help='seconds for all blocks; later ones fail unrun, and the clean-up still runs (default 270)')
    args = ap.parse_args()
    global VERBOSE, DEADLINE
    VERBOSE = args.verbose
    DEADLINE = time.monotonic() + args.budget
    # A time limit from outside (scripts/test.sh's timeout): the made user,
    # the servers and the workspace are still cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit('doc-tests.py: terminated (SIGTERM)'))
    args.source = os.path.abspath(args.source)
    if not args.build and not args.installed:
        args.build = os.path.join(args.source, 'build')
    files = [os.path.abspath(f) for f in args.files] or default_files(args.source)
    work = tempfile.mkdtemp(prefix='doc-tests.')
    os.chmod(work, 0o755)
    user = None
    results = []
    try:
        build_view = None if args.installed else copy_build(os.path.abspath(args.build), work)
        shim = os.path.join(work, 'shim')
        os.mkdir(shim)
        with open(os.path.join(shim, 'sudo'), 'w') as f:
            f.write(SUDO_SHIM)
        os.chmod(os.path.join(shim, 'sudo'), 0o755)
        me = pwd.getpwuid(os.geteuid())
        idents = [Identity('root' if os.geteuid() == 0 else me.pw_name, os.geteuid(), os.getegid(), work, True)]
        if os.geteuid() == 0 and not args.no_user:
            user = make_user(work)
            idents.append(user)
        t0 = time.monotonic()
        for path in files:
            run_file(path, args, work, build_view, idents, results)
        print(f'-- {len(results)} runs in {time.monotonic() - t0:.0f} s: '
              f'{sum(r[2].startswith("ok") for r in results)} ok, '
              f'{sum(r[2].startswith("FAIL") for r in results)} failed, '
              f'{sum(r[2].startswith("skip") for r in results)} skipped')
    finally:
        if user:
            remove_user(user)
        subprocess.run(['rm', '-rf', '--one-file-system', work], check=False)
    failures = [r for r in results if r[2].startswith('FAIL')]
    if failures:
        print('\n== failure digest ==')
        for where, who, verdict, block, tail in failures:
            print(f'-- {where} as {who}: {verdict}')
            print('   block:\n' + ''.join('     ' + l + '\n' for l in block.text().rstrip('\n').split('\n')), end='')
            print('   output (last lines):\n' + ''.join('     ' + l + '\n' for l in tail.split('\n')), end='')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
