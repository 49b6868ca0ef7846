"""The paired significance tests (minknn/stats.py) against cases worked out by hand."""
import math

import pytest

from minknn.stats import mean_std, paired_t, sign_flip, t_cdf


def test_paired_t_matches_the_closed_forms():
    # t's CDF has closed forms for 1 and 2 degrees of freedom: two-sided p = 1 - 2/pi atan|t|
    # (df 1) and 1 - |t| / sqrt(2 + t^2) (df 2)
    # d = [1, 3]: mean 2, std sqrt(2), t = 2 / (sqrt(2) / sqrt(2)) = 2, df 1
    assert paired_t([1, 3], [0, 0]) == pytest.approx(1 - 2 / math.pi * math.atan(2), abs=1e-9), \
        "stats.paired_t: d = [1, 3] (t = 2, 1 degree of freedom) has two-sided p = 0.2952"
    # d = [1, 2, 3]: mean 2, std 1, t = 2 sqrt(3) = 3.4641, df 2
    t = 2 * math.sqrt(3)
    assert paired_t([1.5, 2.5, 3.5], [0.5, 0.5, 0.5]) == pytest.approx(1 - t / math.sqrt(2 + t * t),
                                                                       abs=1e-9), \
        "stats.paired_t: d = [1, 2, 3] (t = 3.4641, 2 degrees of freedom) has two-sided p = 0.0742"
    # d = [1, 2, 3, 4, 5]: t = 3 / (sqrt(2.5) / sqrt(5)) = 4.2426, df 4: p = 0.013236 (tables)
    assert paired_t([1, 2, 3, 4, 5], [0] * 5) == pytest.approx(0.0132356, abs=1e-6)


def test_paired_t_is_two_sided_and_symmetric():
    a, b = [0.61, 0.64, 0.59, 0.66, 0.62], [0.60, 0.60, 0.61, 0.62, 0.58]
    assert paired_t(a, b) == pytest.approx(paired_t(b, a), abs=1e-12), \
        "stats.paired_t: swapping the two methods must not change a two-sided p"
    assert paired_t([0.5, 0.7], [0.5, 0.7]) == 1.0, "no difference at all: p = 1"
    assert t_cdf(0.0, 3) == pytest.approx(0.5) and t_cdf(-1.0, 3) == pytest.approx(1 - t_cdf(1.0, 3))


def test_mean_std_uses_n_minus_1():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0)), \
        "stats.mean_std: the sample std of [1, 2, 3] is 1 (divide by n - 1, not n)"
    assert mean_std([4.0]) == (4.0, 0.0)


def test_sign_flip_counts_every_sign_pattern():
    # all five differences positive: only all-plus and all-minus reach |sum| = 15 -> 2 / 32
    assert sign_flip([1, 2, 3, 4, 5], [0] * 5) == pytest.approx(2 / 32), \
        "stats.sign_flip: with 5 positive differences exactly 2 of the 32 patterns are as extreme"
    # d = [1, -2, 3], |sum| 2: the patterns' sums are 6, 0, 2, -4, 4, -2, 0, -6 -> 6 of 8
    assert sign_flip([1, -2, 3], [0, 0, 0]) == pytest.approx(6 / 8)
    with pytest.raises(ValueError):
        sign_flip(list(range(21)), [0] * 21)


def test_paired_t_stays_a_probability_for_huge_t():
    # 5 seeds each 4 or 5 test examples (of 1000) better: |t| is large, p tiny but never negative
    a = [0.712, 0.705, 0.731, 0.698, 0.720]
    b = [x - d for x, d in zip(a, [0.004, 0.005, 0.004, 0.005, 0.004])]
    p = paired_t(a, b)
    assert 0 <= p < 1e-4, f"stats.paired_t: d = 4 or 5 examples on every seed must give a tiny p, got {p}"
    # t = 1e4 with 4 degrees of freedom: p = 2 (1 - F(t)) ~ 3 / t^4 ~ 3e-16 (the tail of t_4)
    assert 0 <= 2 * (1 - t_cdf(1e4, 4)) < 1e-12, "stats.t_cdf: the tail at t = 1e4 must be ~0"
    assert paired_t([0.3, 0.4], [0.2, 0.3]) == 0.0, "a constant non-zero difference: p = 0"
