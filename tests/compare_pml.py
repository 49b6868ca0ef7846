"""Compare minknn's losses with pytorch-metric-learning on random inputs (a local check, not a test:
that library is not a dependency). Run: pip install --no-deps pytorch-metric-learning==2.9.0;
python tests/compare_pml.py. Prints the largest absolute difference of loss and gradient per loss."""
import os
import sys

import torch
from pytorch_metric_learning import distances, losses as pml, reducers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from minknn.losses import ProxyAnchorLoss, ProxyNCALoss, SoftTripleLoss, SupConLoss, TripletLoss

torch.manual_seed(0)
B, C, D = 32, 5, 16


def compare(name, ours, theirs, trials=20):
    worst_loss = worst_grad = 0.0
    for _ in range(trials):
        h = torch.randn(B, D, dtype=torch.float64, requires_grad=True)
        y = torch.randint(0, C, (B,))
        a = ours(h, y)
        ga, = torch.autograd.grad(a, h)
        b = theirs(h, y)
        gb, = torch.autograd.grad(b, h)
        worst_loss = max(worst_loss, (a - b).abs().item())
        worst_grad = max(worst_grad, (ga - gb).abs().max().item())
    print(f"{name:12s} max |loss diff| {worst_loss:.2e}   max |grad diff| {worst_grad:.2e}   ({trials} random batches, B={B}, C={C}, float64)")


supcon = SupConLoss(temperature=0.1)
compare("supcon", supcon, pml.SupConLoss(temperature=0.1))

triplet = TripletLoss(margin=0.2)
compare("triplet", triplet, pml.TripletMarginLoss(margin=0.2, distance=distances.LpDistance(power=2),
                                                 reducer=reducers.MeanReducer()))

pa = ProxyAnchorLoss(C, D).double()
their_pa = pml.ProxyAnchorLoss(C, D, margin=0.1, alpha=32).double()
their_pa.proxies.data.copy_(pa.proxies.data)
compare("proxyanchor", pa, their_pa)

nca = ProxyNCALoss(C, D, scale=3.0).double()
their_nca = pml.ProxyNCALoss(C, D, softmax_scale=3.0).double()
their_nca.proxies.data.copy_(nca.proxies.data)
compare("proxynca", nca, their_nca)

st = SoftTripleLoss(C, D, reg_weight=0.0).double()          # without the centre regulariser (compared below)
their_st = pml.SoftTripleLoss(C, D, centers_per_class=10, la=20, gamma=0.1, margin=0.01).double()
their_st.fc.data.copy_(st.centres.data.reshape(C * 10, D).T)
compare("softtriple", st, their_st)
