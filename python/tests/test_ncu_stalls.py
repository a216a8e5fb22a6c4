"""dev/cuda/ncu_stalls.py reads an ncu source-page CSV export: its sums by
stall reason and opcode, its bank-conflict list and its two-file
difference must follow the rows it is given."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "dev", "cuda"))

import ncu_stalls  # noqa: E402

HEAD = ('"Address","Source","Warp Stall Sampling (All Samples)",'
        '"Instructions Executed","L1 Wavefronts Shared Excessive","L1 Wavefronts Shared",'
        '"stall_barrier","stall_wait","stall_barrier (Not Issued)"')


def write(path, rows):
    lines = ['"Kernel Name","void k<1>(int)",', HEAD]
    for addr, src, samples, inst, exc, wav, bar, wait in rows:
        lines.append(f'"{addr}","      {src}","{samples}","{inst}","{exc}","{wav}","{bar}","{wait}","0"')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_summary_and_diff(tmp_path, capsys):
    a = write(tmp_path / "a.csv", [
        ("0x10", "BAR.SYNC R1, 0x100", 60, 100, 0, 0, 60, 0),
        ("0x20", "@!P0  STS.U16 [R8+0x4], R13", 30, 100, 300, 400, 0, 30),
        ("0x30", "FFMA R1, R2, R3, R4", 10, 100, 0, 0, 0, 10),
    ])
    b = write(tmp_path / "b.csv", [
        ("0x10", "BAR.SYNC R1, 0x100", 40, 100, 0, 0, 40, 0),
        ("0x30", "FFMA R1, R2, R3, R4", 10, 100, 0, 0, 0, 10),
    ])
    name, rows = ncu_stalls.read(a)
    assert name == "void k<1>(int)" and len(rows) == 3
    assert ncu_stalls.opcode(rows[1]["Source"]) == "STS.U16"  # the predicate is not the opcode
    assert ncu_stalls.main([a, b, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "warp-stall samples 100, warp instructions executed 300" in out
    assert "barrier 60.0%, wait 40.0%" in out
    assert "excess          300 of          400" in out
    # a has 50 more samples than b: +20 on BAR.SYNC, +30 on the STS.U16 b lacks
    assert "(total 100 vs 50, +100.0%)" in out
    assert "STS.U16               30         0  +60.00%" in out
    assert "BAR.SYNC              60        40  +40.00%" in out
