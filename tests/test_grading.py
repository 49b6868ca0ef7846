"""The autograder's own helpers (tests/grading.py): the describer every value check words its
failure with, and the in-place guard every call of a part's code goes through. Each pattern
describe() claims is planted here on a tensor whose difference is known, and each message must
name that pattern and no other; a difference of no pattern must read as a value check (GENERIC)."""
import pytest
import torch

import grading
from grading import GENERIC, InPlace, describe, graded

AXES = ("row", "column")


def base():
    return torch.arange(1.0, 21.0).reshape(4, 5) / 7 + torch.tensor([0.3, -1.1, 2.0, 0.7, -0.4])


def square():
    return torch.arange(1.0, 17.0).reshape(4, 4).sin() + 2


@pytest.mark.parametrize("make, says", [
    (lambda b: 2.5 * b, "the formula's times 2.5, at every element"),
    (lambda b: -b, "the formula's with its sign flipped (minus it), at every element"),
    (lambda b: b + 0.25, "the formula's plus 0.25, at every element"),
    (lambda b: torch.zeros_like(b), "is 0 everywhere"),
    (lambda b: torch.cat([b[:, :1], b[:, :-1]], 1), "shifted by one position along column"),
    (lambda b: b.index_put((torch.tensor([2]),), 3 * b[2]), "only at row 2 (of 0 to 3)"),
    (lambda b: b.index_put((torch.arange(4), torch.tensor([1] * 4)), -b[:, 1]),
     "only at column 1 (of 0 to 4)"),
])
def test_describe_names_the_pattern_of_a_difference(make, says):
    want = base()
    off = describe(make(want), want, "the output", AXES)
    assert off is not None and says in off and GENERIC not in off, off


def test_describe_localises_only_among_the_indices_that_hold_something():
    """Inputs that use only features 0 and 1 give gradients that are 0 at every other feature, in
    the part's and in the formula's: a difference there is not "only at feature 0, 1"."""
    want = torch.zeros(4, 6)
    want[:, :2] = base()[:, :2]
    got = want.clone()
    got[:, :2] += torch.tensor([[0.3, -0.1], [0.2, 0.5], [-0.4, 0.1], [0.6, 0.2]])
    off = describe(got, want, "the gradient", ("example", "feature"))
    assert "only at feature" not in off and "at 8 of its 24 elements" in off, off
    got[:, 1] = want[:, 1]  # feature 1 right: now the difference is confined among the live ones
    assert "only at feature 0 (of 0 to 5)" in describe(got, want, "g", ("example", "feature"))


def test_describe_names_a_difference_confined_to_the_diagonal_or_off_it():
    want = square()
    got = want + 0.5 * torch.eye(4) * torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert "only on the diagonal" in describe(got, want, "the scores"), describe(got, want, "s")
    got = want.masked_fill(~torch.eye(4, dtype=torch.bool), 0.0) + want.tril(-1) * 0 + \
        torch.ones(4, 4).triu(1) * 0.3
    assert "only off the diagonal" in describe(got, want, "the scores")


def test_describe_names_a_transpose_a_region_a_shape_and_a_dtype():
    want = square()
    assert "transposed" in describe(want.T.contiguous(), want, "the scores")
    padding = torch.zeros(4, 4, dtype=torch.bool)
    padding[:, 3] = True
    got = want.masked_fill(padding, 0.0)
    off = describe(got, want, "the output", regions={"at the padding positions": padding})
    assert "only at the padding positions" in off and "there it is 0" in off, off
    assert "has shape (4,)" in describe(want[0], want, "z")
    assert "has dtype torch.float64" in describe(want.double(), want, "z", dtype=True)
    assert describe(want.double(), want, "z") is None  # dtype=False: the values only


def test_describe_counts_and_places_the_first_difference_and_says_no_pattern_it_did_not_find():
    want = base()
    got = want.clone()  # five elements off by different amounts, in every row and column
    for (i, j), by in zip([(0, 4), (1, 2), (2, 1), (3, 0), (0, 3)], [0.05, 0.7, -0.2, 0.3, 0.11]):
        got[i, j] += by
    off = describe(got, want, "the output", AXES)
    assert "at 5 of its 20 elements" in off and "first at row 0, column 3" in off, off
    assert GENERIC in off and "times" not in off and "only" not in off, off


def test_describe_a_scalar_names_only_a_simple_factor():
    one, two = torch.tensor(0.3), torch.tensor(0.6)
    assert "is 1/2 of the formula's: got 0.3, expected 0.6" in describe(one, two, "the loss")
    off = describe(torch.tensor(0.41), two, "the loss")
    assert GENERIC in off and "got 0.41, expected 0.6" in off, off


def test_graded_fails_a_call_that_changes_its_input_in_place_before_its_result_is_read():
    def mix(logits, z, alpha):
        return logits.mul_(1 - alpha).add_(alpha * z)
    logits, z = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.raises(InPlace) as e:
        graded("proxy-inference", "proxy_logits", mix, logits, z, 0.5)
    message = str(e.value)
    assert message.startswith("part 14 proxy-inference: proxy_logits changed its input in "
                              "place: logits at index (0, 0), from 1 to 0.5"), message
    assert "6 of its 6 elements" in message, message
    assert graded("proxy-inference", "proxy_logits", lambda a, b, c: (1 - c) * a + c * b,
                  logits, z, 0.5).shape == (2, 3)  # a new tensor: no failure


def test_close_words_its_failure_with_the_describer():
    want = base()
    with pytest.raises(AssertionError) as e:
        grading.close("supcon", 3 * want, want, "the loss's gradient")
    first = str(e.value).splitlines()[0]
    assert first == ("part 8 supcon: the loss's gradient is the expected value times 3, at every "
                     "element (20 of 20 differ; first at index (0, 0): got 1.32857, expected "
                     "0.442857)"), first
