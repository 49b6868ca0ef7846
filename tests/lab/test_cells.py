"""minknn/lab/cells.py's pieces that the grid tests (tests/test_runner.py, which compare every rule
with evaluate.py's) do not isolate."""
import torch

from minknn.lab.cells import pca_2d


def test_pca_2d_keeps_the_directions_of_largest_variance():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(200, 1, generator=g, dtype=torch.float64)
    # points spread along one direction (10x) and a little along a second (1x), in 8-D, off-centre
    u, v = torch.linalg.qr(torch.randn(8, 2, generator=g, dtype=torch.float64))[0].T
    x = 5.0 + 10 * t * u + torch.randn(200, 1, generator=g, dtype=torch.float64) * v
    xy = torch.tensor(pca_2d(x), dtype=torch.float64)
    torch.testing.assert_close(xy.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-3, rtol=0,
                               msg=lambda m: f"rules.pca_2d: the map must be centred: {m}")
    spread = xy.std(0)
    assert spread[0] > 5 * spread[1] > 0, \
        f"rules.pca_2d: PC 1 should carry the 10x direction, PC 2 the 1x one; std {spread.tolist()}"
    torch.testing.assert_close(spread[0], (10 * t.squeeze() * 1.0).std(), rtol=0.05, atol=0,
                               msg=lambda m: f"rules.pca_2d: PC 1's spread is the data's along u: {m}")
