"""bench/p_code_bias.py: its ExpCast emulation is the library's, its E5M2
decoding the format's, its centred beta centres, and on a preset the E4M3
ExpCast code leans sharp where the E5M2 one does not."""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import qvattn  # noqa: E402
import p_code_bias as pcb  # noqa: E402


def test_emulation_matches_library_codes():
    pcb.check_against_library(qvattn)  # exits on a single differing code


def test_e5m2_values_and_centred_beta():
    assert pcb.e5m2_value(np.array([120, 123, 4, 1, 0])).tolist() == [
        2.0 ** 15, 57344.0, 2.0 ** -14, 2.0 ** -16, 0.0]
    b5 = pcb.centred_beta5()
    assert -0.5 < b5 < 0.5
    u = -np.linspace(0, 4, 4001)[:-1]
    assert abs((pcb.expcast_weights(u, "e5m2", b5) / np.exp2(u)).mean() - 1) < 2e-3


def test_e4m3_expcast_leans_sharp_and_e5m2_does_not():
    row = pcb.preset_row(qvattn, "video-mixed", pcb.codes_of(pcb.centred_beta5()))
    assert row["expcast-e4m3"]["cos"] > 0.3 and row["expcast-e4m3"]["sharpen"] > 0
    assert abs(row["expcast-e5m2"]["cos"]) < 0.05
    assert row["expcast-e5m2"]["rel_l2"] > row["expcast-e4m3"]["rel_l2"]  # the price
    assert abs(row["cast-e4m3"]["cos"]) < 0.1
