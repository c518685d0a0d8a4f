# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_stats against published figures: every vector of CANARY_FACTS (c), the critical-U table, R's
wilcox.test tie-outs kept by Kayenta, and extra vectors produced once with scipy 1.17.1 (scipy is
not needed to run these tests)."""
import json
import math
import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _stats as st

HERE = os.path.dirname(__file__)
KAYENTA = json.load(open(os.path.join(HERE, "data", "kayenta_mannwhitney_vectors.json")))
SCIPY_VECTORS = [  # (x, y, method, U1, p, p without continuity correction)
    ([
        10.002, 10.597, 9.452],
     [
        9.219, 10.091, 9.017, 11.12],
     'exact', 7.0, 0.8571428571428571, None),
    ([
        12.68, 9.016, 8.759, 10.98, 10.714, 10.211],
     [
        9.139, 10.941, 12.391, 8.312, 10.085, 7.198],
     'exact', 23.0, 0.48484848484848486, None),
    ([
        7.421, 6.317, 9.53, 7.465, 10.543, 10.314, 9.626, 4.966],
     [
        9.923, 10.903, 11.227, 7.94, 10.044],
     'exact', 8.0, 0.09324009324009325, None),
    ([
        8.043, 8.382, 12.122, 8.385, 9.935, 11.769, 8.833, 9.777, 10.221, 10.128, 7.55, 10.152],
     [
        13.718, 7.906, 12.719, 11.239, 9.717, 15.001, 12.525, 8.601, 11.149],
     'exact', 30.0, 0.09545129792807813, None),
    ([
        23.0, 19.0, 23.0, 20.0, 23.0, 27.0, 18.0, 21.0, 18.0, 21.0, 16.0, 18.0, 19.0, 24.0, 25.0, 15.0, 17.0,
        23.0, 13.0, 18.0, 20.0, 26.0, 23.0, 19.0, 19.0, 19.0, 27.0, 18.0, 19.0, 22.0, 20.0, 19.0, 16.0, 20.0,
        18.0, 25.0, 23.0, 20.0, 23.0, 19.0],
     [
        27.0, 22.0, 24.0, 17.0, 23.0, 16.0, 14.0, 20.0, 18.0, 22.0, 34.0, 18.0, 19.0, 23.0, 24.0, 21.0, 21.0,
        25.0, 24.0, 18.0, 21.0, 22.0, 18.0, 23.0, 18.0, 26.0, 23.0, 22.0, 19.0, 21.0, 15.0, 17.0, 23.0, 14.0,
        26.0, 15.0, 25.0, 18.0, 25.0, 22.0],
     'asymptotic', 733.0, 0.5200477519929585, 0.5169148227466961),
    ([
        15.0, 26.0, 27.0, 20.0, 19.0, 19.0, 17.0, 25.0, 18.0, 20.0, 17.0, 18.0, 16.0, 26.0, 19.0, 24.0, 20.0,
        17.0, 19.0, 18.0, 20.0, 19.0, 19.0, 15.0, 17.0, 28.0, 18.0, 16.0, 21.0, 27.0, 15.0, 19.0, 18.0, 14.0,
        23.0, 20.0, 20.0, 17.0, 22.0, 18.0, 20.0, 16.0, 16.0, 26.0, 18.0, 21.0, 20.0, 18.0, 18.0, 23.0, 19.0,
        19.0, 20.0, 25.0, 23.0, 22.0, 18.0, 15.0, 24.0, 24.0],
     [
        21.0, 24.0, 25.0, 26.0, 26.0, 20.0, 29.0, 17.0, 26.0, 24.0, 26.0, 32.0, 29.0, 17.0, 16.0, 26.0, 18.0,
        22.0, 26.0, 16.0, 14.0, 23.0, 22.0, 21.0, 22.0, 18.0, 16.0, 21.0, 18.0, 16.0, 24.0, 21.0, 24.0, 18.0,
        19.0, 18.0, 18.0, 23.0, 19.0, 23.0, 23.0, 33.0, 16.0, 26.0, 21.0],
     'asymptotic', 1009.5, 0.027047505022727927, 0.026823086321135815),
]

# ------------------------------------------------------------------ bench_serving's summaries

NUMPY_PERCENTILES = {0: 1.0, 1: 1.0, 25: 2.25, 50: 3.5, 90: 6.3, 95: 7.65, 99: 8.73, 100: 9.0}  # numpy 2.x


@pytest.mark.parametrize("pct,expected", sorted(NUMPY_PERCENTILES.items()))
def test_percentile_is_numpys_linear_interpolation(pct, expected):
    assert st.percentile([3.0, 1, 4, 1, 5, 9, 2, 6, 5, 3], pct) == pytest.approx(expected)


def test_summaries_of_no_values_are_none_and_of_one_value_that_value():
    assert st.percentile([], 50) is None and st.mean([]) is None and st.pstdev([]) is None
    assert st.percentile([7], 99) == 7.0 and st.median([7]) == 7.0 and st.pstdev([7]) == 0.0


def test_pstdev_is_numpys_population_deviation():
    assert st.pstdev([3.0, 1, 4, 1, 5, 9, 2, 6, 5, 3]) == pytest.approx(2.3430749027719964)


# ------------------------------------------------------------------------------ CANARY_FACTS (c)

SHIER_X, SHIER_Y = [19, 22, 16, 29, 24], [20, 11, 17, 12]


def test_vector_1_scipy_docstring_exact_p_and_hodges_lehmann_interval():
    result = st.mann_whitney(SHIER_X, SHIER_Y)
    assert (result.u1, result.u2, result.method) == (17.0, 3.0, "exact")
    assert result.p_value == pytest.approx(0.1111111111, abs=1e-10)
    assert result.shift == 7.0 and result.ci == (-1.0, 17.0)


def test_vector_1_asymptotic_with_and_without_continuity_correction():
    assert st.mann_whitney(SHIER_X, SHIER_Y, method="asymptotic").p_value == pytest.approx(0.1113468865, abs=1e-10)
    plain = st.mann_whitney(SHIER_X, SHIER_Y, method="asymptotic", continuity=False)
    assert plain.p_value == pytest.approx(0.0864107330, abs=1e-10)


def test_vector_2_complete_separation():
    x, y = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    exact = st.mann_whitney(x, y)
    assert exact.u1 == 0 and exact.p_value == pytest.approx(0.0079365079, abs=1e-10)
    assert exact.shift == -5.0 and exact.ci == (-8.0, -2.0)
    assert st.mann_whitney(x, y, method="asymptotic").p_value == pytest.approx(0.0121857804, abs=1e-10)
    assert st.mann_whitney(x, y, method="asymptotic", continuity=False).p_value == pytest.approx(0.0090234388, abs=1e-10)


def test_vector_3_ties_use_average_ranks_and_the_tie_corrected_variance():
    x, y = [1, 2, 2, 3, 3, 3, 4], [2, 3, 4, 4, 5, 5, 6]
    result = st.mann_whitney(x, y)
    assert result.method == "asymptotic" and result.ties and result.u1 == 8.5
    assert st.tie_variance(7, 7, st.u_statistics(x, y)[2]) == pytest.approx(58.6923077, abs=1e-7)
    assert result.z == pytest.approx(-2.0232107, abs=1e-7)
    assert result.p_value == pytest.approx(0.0430514327, abs=1e-10)
    assert st.mann_whitney(x, y, continuity=False).p_value == pytest.approx(0.0367549611, abs=1e-10)


@pytest.mark.parametrize("n,critical", [(5, 2), (6, 5), (7, 8), (8, 13), (9, 17), (10, 23), (20, 127)])
def test_vector_4_critical_u_table_two_sided_five_percent(n, critical):
    assert st.critical_u(n, n, 0.05) == critical
    assert 2 * st.exact_cdf(critical, n, n) <= 0.05 < 2 * st.exact_cdf(critical + 1, n, n)


@pytest.mark.parametrize("n,p", [(3, 0.1), (4, 0.0285714286), (5, 0.0079365079)])
def test_smallest_exact_two_sided_p(n, p):
    assert st.smallest_p(n, n) == pytest.approx(p, abs=1e-10)
    assert st.mann_whitney(list(range(n)), list(range(n, 2 * n))).p_value == pytest.approx(p, abs=1e-10)


def test_three_rounds_a_side_can_never_be_significant_at_five_percent():
    assert st.critical_u(3, 3, 0.05) is None


# ---------------------------------------------------------------- vector 5: R tie-outs (Kayenta)

def test_r_tie_out_asymptotic_interval_and_estimate():
    data = KAYENTA["r_tie_out"]
    result = st.mann_whitney(data["experiment"], data["control"])
    assert result.method == "asymptotic"
    assert result.ci[0] == pytest.approx(-0.500002521696696, abs=1e-6)
    assert result.ci[1] == pytest.approx(-3.486287505871302e-05, abs=1e-6)
    assert result.shift == pytest.approx(-0.4999393907180323, abs=1e-4)


def test_r_tie_out_large_at_98_percent():
    data = KAYENTA["r_tie_out_large"]
    result = st.mann_whitney(data["experiment"], data["control"], confidence=0.98)
    assert result.ci[0] == pytest.approx(-0.4999173250549087, abs=1e-6)
    assert result.ci[1] == pytest.approx(-6.912685789769486e-06, abs=1e-6)
    assert result.shift == pytest.approx(-3.45044082729315e-05, abs=1e-4)


def test_r_tie_out_intermediate_values():
    data = KAYENTA["intermediate"]
    x, y = data["x"], data["y"]
    assert min(x) - max(y) == pytest.approx(-3.124999999999986, abs=1e-6)
    assert max(x) - min(y) == pytest.approx(5.555555555555557, abs=1e-6)
    assert st.NormalDist().inv_cdf(0.975) == pytest.approx(1.9599639845400536, abs=1e-6)
    result = st.mann_whitney(x, y)
    # R returns these roots as they are, even though the "interval" comes out reversed.
    assert result.ci[0] == pytest.approx(3.521755377702165e-05, abs=1e-6)
    assert result.ci[1] == pytest.approx(2.02456461662334e-05, abs=1e-6)
    assert result.shift == pytest.approx(2.6279243045155653e-05, abs=1e-4)


def test_exact_interval_of_kayentas_small_example():
    result = st.mann_whitney([10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0])
    assert result.ci == (6.0, 39.0) and result.shift == 22.5


# -------------------------------------------------------------------------------- scipy vectors

@pytest.mark.parametrize("x,y,method,u1,p,p_plain", SCIPY_VECTORS)
def test_matches_scipy_mannwhitneyu(x, y, method, u1, p, p_plain):
    result = st.mann_whitney(x, y, method=method)
    assert result.u1 == u1 and result.u1 + result.u2 == len(x) * len(y)
    assert result.p_value == pytest.approx(p, rel=1e-9)
    if p_plain is not None:
        assert st.mann_whitney(x, y, method=method, continuity=False).p_value == pytest.approx(p_plain, rel=1e-9)


# ------------------------------------------------------------------------------- edge and failure

def test_auto_switches_to_asymptotic_for_ties_or_fifty_values():
    assert st.mann_whitney([1, 2, 3], [4, 5, 6]).method == "exact"
    assert st.mann_whitney([1, 2, 3], [3, 5, 6]).method == "asymptotic"
    assert st.mann_whitney(list(range(50)), [v + 0.5 for v in range(50)]).method == "asymptotic"
    assert st.mann_whitney(list(range(49)), [v + 0.5 for v in range(49)]).method == "exact"


def test_exact_with_ties_is_refused():
    with pytest.raises(st.StatsError, match="without ties"):
        st.mann_whitney([1, 2], [2, 3], method="exact")


def test_an_empty_side_is_refused_with_both_sizes():
    with pytest.raises(st.StatsError, match="got 0 and 2"):
        st.mann_whitney([], [1, 2])


def test_identical_samples_give_p_one_and_zero_shift():
    result = st.mann_whitney([5.0, 5.0, 5.0], [5.0, 5.0, 5.0], conf_int=False)
    assert result.p_value == 1.0 and result.u1 == result.u2 == 4.5
    same = st.mann_whitney([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert same.p_value == 1.0 and same.shift == 0.0 and same.ci[0] < 0 < same.ci[1]


def test_all_tied_values_give_a_zero_shift_with_a_zero_width_interval():
    # R only warns here; a canary identical to its baseline must read as "no shift", not an error
    result = st.mann_whitney([5.0, 5.0, 5.0], [5.0, 5.0, 5.0])
    assert result.p_value == 1.0 and result.shift == 0.0 and result.ci == (0.0, 0.0)


def test_exact_counts_sum_to_the_number_of_orderings():
    for m, n in ((1, 1), (3, 7), (9, 9), (20, 20)):
        assert sum(st.u_counts(m, n)) == math.comb(m + n, m)
        assert st.exact_cdf(m * n, m, n) == 1.0 and st.exact_cdf(-1, m, n) == 0.0


def test_r_qwilcox_is_the_least_quantile():
    # P(U <= 2; 5, 5) = 0.0159 >= 0.0125 > P(U <= 1) = 0.0079: qwilcox(0.0125, 5, 5) = 2
    assert st.exact_quantile(0.0125, 5, 5) == 2
    assert st.exact_quantile(0.025, 5, 5) == 3


def test_zeroin_finds_a_smooth_root_like_r_uniroot():
    root = st.zeroin(lambda v: v * v - 2.0, 0.0, 2.0, -2.0, 2.0, tol=1e-10)
    assert root == pytest.approx(math.sqrt(2.0), abs=1e-9)
