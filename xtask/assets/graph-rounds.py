#!/usr/bin/env python3
"""Attributes CUDA-graph instantiations and failed updates (graph-trace.c's files) to the rounds of a traced
gpu-ab.sh run (RUST_LOG=runner::depth=trace lines in its ab.log), by wall-clock time, and prints per variant,
round kind (plain, drafted, catch-up) and depth: rounds, median and mean ms, and the instantiations a round.

usage: graph-rounds.py AB_LOG 'GLOB'   (GLOB matches graph-trace.c's files; either may be .xz)"""
import sys, glob, re, datetime, bisect, lzma, statistics as st
log, pattern = sys.argv[1], sys.argv[2]


def lines(path):
    return lzma.open(path, 'rt', errors='replace') if path.endswith('.xz') else open(path, errors='replace')

ts_re = re.compile(r'^(\S+Z) TRACE runner::depth: round( \(untimed\))? drafted=(\d+) accepted=(\d+)(?: ms=([\d.]+) catch_up=(\w+))?')
def ns(t):
    d = datetime.datetime.strptime(t[:26], '%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc)
    return int(d.timestamp()) * 10**9 + d.microsecond * 1000
rounds = []  # (start, end, drafted, catch_up, ms, plain_before, label)
label = None; plain = 0
for line in lines(log):
    if line.startswith('gpu-ab: round'):
        label = line.split()[4]; plain = 0; continue
    m = ts_re.match(line)
    if not m: continue
    end = ns(m.group(1)); drafted = int(m.group(3))
    if m.group(2) or drafted == 0:
        ms = float(m.group(5)) if m.group(5) else 0.0
        rounds.append((end - int(ms * 1e6), end, 0, False, ms, plain, label)); plain += 1; continue
    ms = float(m.group(5)); cu = m.group(6) == 'true'
    rounds.append((end - int(ms * 1e6), end, drafted, cu, ms, plain, label)); plain = 0
ev = []
for f in glob.glob(pattern):
    for l in lines(f):
        s, d, fn, n, rc = l.rstrip('\n').split('\t')
        ev.append((int(s), int(d), fn, int(n), int(rc)))
ev.sort()
starts = [e[0] for e in ev]
print(f'{len(rounds)} rounds, {len(ev)} graph events', file=sys.stderr)
by = {}
for (s, e, dr, cu, ms, pb, lab) in rounds:
    i = bisect.bisect_left(starts, s); j = bisect.bisect_right(starts, e)
    inst = [x for x in ev[i:j] if x[2].startswith('cuGraphInstantiate')]
    fail = [x for x in ev[i:j] if x[2].startswith('cuGraphExecUpdate') and x[4] != 0]
    kind = 'plain' if dr == 0 else ('catch' if cu else 'round')
    by.setdefault((lab, kind, dr), []).append((ms, len(inst), sum(x[1] for x in inst) / 1e6, len(fail), [x[3] for x in inst]))
for k in sorted(by, key=lambda k: (str(k[0]), k[1], k[2])):
    v = by[k]
    ms = [x[0] for x in v]; ni = [x[1] for x in v]; ti = [x[2] for x in v]; nf = [x[3] for x in v]
    withi = sum(1 for x in ni if x)
    print(f'{k[0]:8} {k[1]:6} d{k[2]}  n={len(v):5}  ms med {st.median(ms):6.2f} mean {st.mean(ms):6.2f}  '
          f'rounds w/ inst {withi:5} ({withi/len(v):.0%})  inst/round {st.mean(ni):5.2f}  inst ms/round {st.mean(ti):5.2f}  failed upd/round {st.mean(nf):4.2f}')
tot_inst = [x for x in ev if x[2].startswith('cuGraphInstantiate')]
print('instantiations total', len(tot_inst), 'ms', sum(x[1] for x in tot_inst) / 1e6, 'node counts', sorted(set(x[3] for x in tot_inst))[:40])
