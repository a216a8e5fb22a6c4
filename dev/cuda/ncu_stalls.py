#!/usr/bin/env python3
"""Summarise an ncu source-page export: where a kernel's warps wait.

Input: `ncu -i REP --page source --csv --print-source sass > FILE.csv`
(a profile taken with --set full).  Prints the warp-stall samples by
reason, the instructions with the most samples (with their stall mix),
and the shared-memory instructions with bank conflicts.  Two files: the
same for both, then the instructions whose samples differ most, matched
by SASS text and order (for a kernel against its variant, e.g. a
V-Smooth step against a plain one).

    python3 dev/cuda/ncu_stalls.py source-s1.csv [source-s20.csv] [--top N]
        [--per OPCODE:K]

--per counts executed instructions per iteration instead: an iteration
is K executions of the opcodes that start with OPCODE (e.g.
QGMMA.64x136:4, the four PV wgmmas of an INT8 draft block issued by one
warp); the mbarrier spins of every warp, the producer's too, are
included in the figures.
"""
import argparse
import csv
import re
import sys
from collections import Counter


def read(path):
    """(kernel name, rows): rows as dicts of the export's columns."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    name = next(csv.reader([lines[0]]))[1] if lines and lines[0].startswith('"Kernel Name"') else "?"
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
    rows = list(csv.DictReader(lines[start:]))
    return name, rows


def num(row, key):
    v = row.get(key, "0")
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def stall_keys(rows):
    return [k for k in rows[0] if k.startswith("stall_") and "(Not Issued)" not in k]


def opcode(sass):
    s = sass.strip()
    s = re.sub(r"^@!?U?P\w+\s+", "", s)
    return s.split(" ")[0] if s else "?"


def summary(path, top):
    name, rows = read(path)
    keys = stall_keys(rows)
    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows)
    inst = sum(num(r, "Instructions Executed") for r in rows)
    print(f"== {path}\n{name}\nwarp-stall samples {total:.0f}, warp instructions executed {inst:.0f}")
    by = Counter({k[6:]: sum(num(r, k) for r in rows) for k in keys})
    print("samples by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by.most_common() if v))
    ops = Counter()
    for r in rows:
        ops[opcode(r["Source"])] += num(r, "Warp Stall Sampling (All Samples)")
    print("samples by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(12)))
    print(f"top {top} instructions by samples:")
    ranked = sorted(range(len(rows)), key=lambda i: -num(rows[i], "Warp Stall Sampling (All Samples)"))
    for i in ranked[:top]:
        r = rows[i]
        s = num(r, "Warp Stall Sampling (All Samples)")
        mix = sorted(((num(r, k), k[6:]) for k in keys), reverse=True)[:3]
        print(f"  #{i:5d} {s / total:6.2%}  {r['Source'].strip()[:60]:60s} "
              + ", ".join(f"{k} {v / max(s, 1):.0%}" for v, k in mix if v))
    conf = [(num(r, "L1 Wavefronts Shared Excessive"), i) for i, r in enumerate(rows)]
    conf = sorted((c for c in conf if c[0] > 0), reverse=True)
    if conf:
        print("shared accesses with excess wavefronts (bank conflicts):")
        for c, i in conf[:top]:
            r = rows[i]
            print(f"  #{i:5d} excess {c:12.0f} of {num(r, 'L1 Wavefronts Shared'):12.0f}  "
                  f"{r['Source'].strip()[:70]}")
    return rows, total


def per_iteration(path, spec, top):
    """Executed warp instructions per iteration, by opcode."""
    op, _, k = spec.rpartition(":")
    if not op or not k.isdigit() or int(k) < 1:
        raise SystemExit(f"--per wants OPCODE:K, got {spec!r}")
    _, rows = read(path)
    by = Counter()
    for r in rows:
        by[opcode(r["Source"])] += num(r, "Instructions Executed")
    marks = sum(v for o, v in by.items() if o.startswith(op))
    if not marks:
        raise SystemExit(f"{path}: no executed instruction starts with {op!r}")
    iters = marks / int(k)
    print(f"== {path}: {iters:.0f} iterations ({op} x {k}), "
          f"{sum(by.values()) / iters:.1f} warp instructions per iteration")
    for o, v in by.most_common(top):
        print(f"  {o:34s} {v / iters:8.1f}")


def diff(a, b, top):
    """Instructions of a against b by opcode sequence: samples that a has
    and b lacks, per opcode, as a share of b's total."""
    (ra, ta), (rb, tb) = a, b
    sa, sb = Counter(), Counter()
    for r in ra:
        sa[opcode(r["Source"])] += num(r, "Warp Stall Sampling (All Samples)")
    for r in rb:
        sb[opcode(r["Source"])] += num(r, "Warp Stall Sampling (All Samples)")
    print(f"== samples per opcode, first against second (total {ta:.0f} vs {tb:.0f}, "
          f"{ta / tb - 1:+.1%}):")
    d = sorted(((sa[k] - sb[k], k) for k in set(sa) | set(sb)), reverse=True)
    for v, k in d[:top]:
        print(f"  {k:14s} {sa[k]:9.0f} {sb[k]:9.0f}  {v / tb:+.2%} of the second's samples")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--per", metavar="OPCODE:K", help="instructions per iteration (see above)")
    a = p.parse_args(argv)
    if len(a.csv) > 2:
        p.error("one or two files")
    if a.per:
        for path in a.csv:
            per_iteration(path, a.per, a.top)
        return 0
    res = [summary(path, a.top) for path in a.csv]
    if len(res) == 2:
        diff(res[0], res[1], a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
