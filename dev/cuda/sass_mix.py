#!/usr/bin/env python3
"""Instruction mix of a kernel's main loop, region by region.

    cuobjdump -sass build/libqvattn.so > lib.sass
    python3 dev/cuda/sass_mix.py lib.sass 'attn8_ws_128x128I14attn8_ws_flagsILi0EELi1E'
    python3 dev/cuda/sass_mix.py lib.sass PATTERN 0x1600 0x6e50

PATTERN is a regular expression searched in the mangled function names;
it must match one function. Without an address range the loop is the
innermost backward branch whose body holds a tensor-core instruction. The loop is split at every branch
and branch target, and each straight-line region prints its size, its last
instruction and its commonest opcodes, so a region taken every iteration
can be told from one taken on some (the rescale of O, the V-Smooth
restore, the padding mask). Divide by the scores per thread per iteration
for a per-score count (bench/NOTES.md).
"""
import collections
import re
import sys

_FUNC = re.compile(r"^\s*Function : (\S+)", re.M)
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRA = re.compile(r"BRA (?:!?U?P\w+, )?(0x[0-9a-f]+)")
_MMA = re.compile(r"\b[A-Z]*MMA\b|GMMA")


def functions(text):
    """{mangled name: [(address, instruction)]} of a cuobjdump -sass dump."""
    marks = list(_FUNC.finditer(text))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[m.group(1)] = [(int(a, 16), s.strip()) for a, s in _INSN.findall(text[m.end():end])]
    return out


def main_loop(insns):
    """(start, end) of the shortest backward branch whose body holds a
    tensor-core instruction ([target, branch + 16)): the innermost loop
    that computes, not a retry loop around a barrier wait."""
    best = None
    for addr, s in insns:
        b = _BRA.search(s)
        if not b or int(b.group(1), 16) >= addr:
            continue
        span = (int(b.group(1), 16), addr + 0x10)
        if not any(span[0] <= a < span[1] and _MMA.search(x) for a, x in insns):
            continue
        if best is None or span[1] - span[0] < best[1] - best[0]:
            best = span
    return best


def opcode(s):
    s = re.sub(r"^@!?U?P\w+ ", "", s)
    return s.split()[0].split(".")[0]


def regions(insns, lo, hi):
    """[(start, end, [instructions])] of [lo, hi) split at branches and targets."""
    body = [(a, s) for a, s in insns if lo <= a < hi]
    cuts = {lo, hi}
    for a, s in body:
        b = _BRA.search(s)
        if b:
            cuts.update(c for c in (int(b.group(1), 16), a + 0x10) if lo < c < hi)
    cuts = sorted(cuts)
    out = []
    for s, e in zip(cuts, cuts[1:]):
        r = [x for a, x in body if s <= a < e]
        if r:
            out.append((s, e, r))
    return out


def main(argv):
    if len(argv) not in (3, 5):
        sys.exit(__doc__)
    funcs = functions(open(argv[1]).read())
    hits = [n for n in funcs if re.search(argv[2], n)]
    if len(hits) != 1:
        sys.exit(f"{len(hits)} functions match {argv[2]!r}: {hits[:8]}")
    insns = funcs[hits[0]]
    span = (int(argv[3], 16), int(argv[4], 16)) if len(argv) == 5 else main_loop(insns)
    if span is None:
        sys.exit("no backward branch: give the address range")
    print(f"{hits[0]}\nloop 0x{span[0]:05x}-0x{span[1]:05x}")
    total = 0
    for s, e, r in regions(insns, *span):
        mix = collections.Counter(opcode(x) for x in r).most_common(8)
        total += len(r)
        print(f"  {s:05x}-{e:05x} {len(r):5d}  last: {r[-1][:36]:36s} "
              + " ".join(f"{k}:{v}" for k, v in mix))
    print(f"  all regions {total}")


if __name__ == "__main__":
    main(sys.argv)
