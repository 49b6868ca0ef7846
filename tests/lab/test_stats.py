"""The paired significance tests (minknn/lab/stats.py) against cases worked out by hand."""
import math

import pytest

from minknn.lab.stats import mean_std, paired_t, sign_flip, sign_flip_floor, t_cdf, t_undefined


def test_paired_t_matches_the_closed_forms():
    # t's CDF has closed forms for 1 and 2 degrees of freedom: two-sided p = 1 - 2/pi atan|t|
    # (df 1) and 1 - |t| / sqrt(2 + t^2) (df 2)
    # t = 2 with 1 degree of freedom (what d = [1, 3] would give; paired_t wants 3 pairs)
    assert 2 * (1 - t_cdf(2.0, 1)) == pytest.approx(1 - 2 / math.pi * math.atan(2), abs=1e-9), \
        "stats.t_cdf: t = 2 with 1 degree of freedom has two-sided p = 0.2952"
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


def test_paired_t_gives_no_p_where_t_is_undefined():
    cases = [  # (a, b, the reason t_undefined must give, what the case is)
        ([0.61, 0.63], [0.60, 0.62], "fewer than 3 paired seeds",
         "2 seeds, each one point better (the bug: it printed p 0.000*)"),
        ([0.61, 0.70], [0.60, 0.62], "fewer than 3 paired seeds", "2 seeds, unequal differences"),
        ([0.7, 0.9, 0.3], [0.6, 0.8, 0.2], "the differences are all equal",
         "3 seeds, each 10 points better"),
        # 3 seeds of 100,000 test examples, one example better on each: the differences are
        # 1e-5 up to rounding (std 6e-17), which a test relative to mean(d) took for noise
        ([54327e-5, 76904e-5, 94502e-5], [54326e-5, 76903e-5, 94501e-5],
         "the differences are all equal", "3 seeds, one example in 100,000 better on each"),
        ([0.5, 0.7, 0.6], [0.5, 0.7, 0.6], "the differences are all equal", "no difference at all"),
        ([0.0] * 3, [0.0] * 3, "the differences are all equal", "every score 0"),
    ]
    for a, b, why, what in cases:
        assert paired_t(a, b) is None, f"stats.paired_t: {what}: the t-test is undefined, no p; " \
                                       f"got {paired_t(a, b)}"
        assert why in (t_undefined(a, b) or ""), \
            f"stats.t_undefined: {what}: the reason should say {why!r}, got {t_undefined(a, b)!r}"
    # one example of 100,000 off on one seed is a real spread: a p, and a tiny one
    a, b = [54327e-5, 76904e-5, 94502e-5], [54326e-5, 76903e-5, 94500e-5]
    # d = 1, 1, 2 (in 1e-5): t = (4/3) / (sqrt(1/3) / sqrt(3)) = 4, df 2: p = 1 - 4 / sqrt(18)
    assert t_undefined(a, b) is None, "stats.t_undefined: d = 1, 1, 2 examples are not all equal"
    assert paired_t(a, b) == pytest.approx(1 - 4 / math.sqrt(18), abs=1e-6), \
        "stats.paired_t: d = 1, 1, 2 examples of 100,000 (t = 4, df 2) has p = 0.0572"


def test_sign_flip_below_3_seeds_is_valid_but_never_small():
    assert sign_flip([0.61, 0.63], [0.60, 0.62]) == pytest.approx(0.5), \
        "stats.sign_flip: 2 equal positive differences: 2 of the 4 sign patterns are as extreme"
    assert sign_flip([0.61], [0.60]) == 1.0
    assert [sign_flip_floor(n) for n in (2, 5, 6)] == [0.5, 0.0625, 0.03125], \
        "stats.sign_flip_floor: the smallest p with n pairs is 2 / 2^n"
