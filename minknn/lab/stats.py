"""Paired significance tests: is method A's mean over seeds different from method B's on the same
seeds (the same training draws), or could the difference be seed noise?

Both tests look at the per-seed differences d_i = a_i - b_i, i = 1..n, and are two-sided.

    paired t-test      t = mean(d) / (std(d) / sqrt(n)), std with n - 1; p = P(|T| >= |t|) for
                       Student's t with n - 1 degrees of freedom. Assumes the d_i are normal; with
                       5 seeds it can reach p < 0.05 (the DML paper marks p < 0.05; its test is not
                       named). minknn's tables use it. No p (None) below 3 pairs, where std(d)
                       rests on a single degree of freedom, nor when the differences are all
                       equal: std(d) = 0 makes t infinite (or 0 / 0), and a one-example gain on
                       two seeds would print p 0.000. "Equal" is up to rounding: a - b computed
                       in floats is off by about 1e-16 of the scores, so differences within 1e-9
                       of the largest |score| count as equal (a real one, one test example in a
                       million, is 1e-6).
    sign-flip test     exact permutation test: under "no difference" each d_i is as likely to be
                       -d_i, so p = the share of the 2^n sign patterns whose |sum| is at least
                       the observed |sum(d)|. Assumes only symmetry, and is defined for any n and
                       any d, but its smallest p is 2 / 2^n: 0.5 with 2 seeds, 0.0625 with 5, so
                       it cannot mark a result at 0.05 below 6 seeds (the table says so).
                       The runner's tables take it with --test signflip (up to 20 seeds).
"""
import itertools
import math

MAX_SIGN_FLIP = 20  # 2^20 sign patterns, about a second


def mean_std(values):
    """The mean and the sample standard deviation (n - 1; 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def t_cdf(t, df, steps=2000):
    """P(T <= t) for Student's t with df degrees of freedom. With x = sqrt(df) tan(theta) the
    density's integral from 0 to t becomes a smooth one over a bounded interval:
        P(0 <= T <= t) = Gamma((df+1)/2) / (sqrt(pi) Gamma(df/2)) int_0^atan(t/sqrt(df)) cos^(df-1)
    by Simpson's rule (steps even): accurate to about 1e-12 for any t, even the |t| of 1e6 that
    an almost constant difference gives."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    end = math.atan(abs(t) / math.sqrt(df))
    h = end / steps
    area = sum((1 if i in (0, steps) else 4 if i % 2 else 2) * math.cos(i * h) ** (df - 1)
               for i in range(steps + 1))
    return 0.5 + math.copysign(math.exp(log_c) * area * h / 3, t)


MIN_T_PAIRS = 3  # below this the t-test gives no p


def t_undefined(a, b):
    """Why the paired t-test of a against b has no p (a sentence for the table), or None."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    if len(d) < MIN_T_PAIRS:
        return f"fewer than {MIN_T_PAIRS} paired seeds"
    scale = max(abs(x) for x in [*a, *b])
    if mean_std(d)[1] <= 1e-9 * scale:  # equal up to rounding (0 <= 0 when every score is 0)
        return "the differences are all equal, so their std is 0 and t is undefined"
    return None


def paired_t(a, b):
    """Two-sided p of the paired t-test of a against b (equal-length lists, paired by index);
    None where t_undefined gives a reason (fewer than 3 pairs, all differences equal)."""
    if t_undefined(a, b):
        return None
    d = [x - y for x, y in zip(a, b)]
    mean, std = mean_std(d)
    t = mean / (std / math.sqrt(len(d)))
    return min(1.0, max(0.0, 2 * (1 - t_cdf(abs(t), len(d) - 1))))


def sign_flip(a, b):
    """Two-sided p of the exact sign-flip permutation test of a against b (1 <= n <= 20 pairs);
    at least 2 / 2^n (sign_flip_floor)."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    if not 1 <= len(d) <= MAX_SIGN_FLIP:
        raise ValueError(f"the exact sign-flip test enumerates 2^n patterns; n = {len(d)}")
    observed = abs(sum(d))
    extreme = sum(abs(sum(s * x for s, x in zip(signs, d))) >= observed - 1e-12
                  for signs in itertools.product((1, -1), repeat=len(d)))
    return extreme / 2 ** len(d)


def sign_flip_floor(n):
    """The smallest p the sign-flip test can give with n pairs: the all-plus and all-minus
    patterns are always the most extreme, so 2 of the 2^n."""
    return 2 / 2 ** n
