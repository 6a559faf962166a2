#!/usr/bin/env bash
# failure-digest.sh STAGE LOG: what a reader of only the last lines of CI's
# output needs about a failed ctest stage. LOG is that stage's ctest output
# (with --output-on-failure). Prints each failed test's name and, for the
# first few, the lines of its output that say why (gtest's "Failure" with
# what follows, sanitizer reports, timeouts), bounded so the digest of every
# stage fits in a screen. scripts/test.sh prints the digests last.
set -uo pipefail
stage=$1 log=$2
echo "-- $stage: failed tests --"
grep -aE '^[[:space:]]*[0-9]+ - .+\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run|Child aborted|ILLEGAL|BUS|INTERRUPT|OTHER_FAULT)' "$log" |
  head -20 || echo "   (none named: see the ctest output above)"
awk -v maxtests=3 -v maxlines=14 '
  # A result line: "12/345 Test #67: name .....  Passed 0.1 sec".
  /^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
    flush(); infail = ($0 !~ / Passed +[0-9.]+ sec/ && $0 !~ /Skipped|Disabled/)
    if (infail) { shown++; head = $0; n = 0 }
    next
  }
  /^ +Start +[0-9]+: / { flush(); infail = 0; next }
  infail { buf[n++] = $0 }
  function flush(   i, k, keep) {
    if (!infail || shown > maxtests) { infail = 0; return }
    gsub(/\.\.\.\.+/, " .. ", head); print head; k = 0
    for (i = 0; i < n && k < maxlines; i++) {
      keep = buf[i] ~ /Failure$|ERROR: |SUMMARY: |WARNING: ThreadSanitizer|timed out|Timeout|Which is|Expected|Actual|Value of|expected|error/ ||
             (i > 0 && buf[i-1] ~ /Failure$/) || (i > 1 && buf[i-2] ~ /Failure$/)
      if (keep) { print "    " buf[i]; k++ }
    }
    if (k == 0) for (i = (n > 6 ? n - 6 : 0); i < n; i++) print "    " buf[i]
    infail = 0
  }
  END { flush() }
' "$log"
