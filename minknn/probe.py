"""The linear probe: an L2-regularised logistic regression fit to convergence on frozen
representations, the head of SetFit (Tunstall et al. 2022, scikit-learn's LogisticRegression with
its defaults) and the starting head of LP-FT (Kumar et al. 2022, "Fine-Tuning can Distort
Pretrained Features and Underperform Out-of-Distribution": fit the head on the frozen encoder,
then fine-tune everything).

scikit-learn's objective, with its default C = 1 and the intercept not penalised:

    multi-class (C >= 3)  min_{W, b}  1/2 ||W||^2 + C sum_i CE(W z_i + b, y_i)            W (K, d)
    two classes           min_{w, b}  1/2 ||w||^2 + C sum_i log(1 + exp(-s_i (w . z_i + b)))
                          with s_i = +1 for class 1, -1 for class 0                       w (d,)
    multi-label           one two-class problem per label (one-vs-rest), all at once

C weighs the SUM of the examples' losses, so the fewer the examples the stronger the penalty.
Two classes are one weight vector, as scikit-learn fits them (a softmax over two rows would
penalise the same decision function half as much); written into a two-row head as rows -w/2 and
+w/2, biases -b/2 and +b/2, whose softmax is the same sigmoid(w . z + b).
Solved in float64 by L-BFGS with a strong Wolfe line search: the objective is smooth and
strictly convex, so there is one solution, whatever the starting point (zeros).
"""
import torch
import torch.nn.functional as F

from minknn import MinknnError
from minknn.kinds import kind_of
from minknn.tools.engine import predict

C_DEFAULT = 1.0   # scikit-learn's default inverse regularisation strength


def fit_logistic(z, y, num_classes, C=C_DEFAULT, multilabel=False, max_iter=500):
    """z (N, d) representations; y (N,) class indices, or (N, K) multi-hot rows with multilabel.
    Returns the head's (weight (K, d), bias (K,)) as float32, so that softmax (sigmoid for
    multi-label) of z W^T + b is the fitted model's probabilities."""
    z = z.detach().double()
    if multilabel:
        targets, K = y.detach().double(), y.shape[1]
    elif num_classes == 2:
        targets, K = y.detach().double()[:, None], 1     # one sigmoid: is it class 1?
    else:
        targets, K = y.detach().long(), num_classes
    W = torch.zeros(K, z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    sigmoid = multilabel or num_classes == 2

    def objective():
        logits = z @ W.T + b
        if sigmoid:
            data = F.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
        else:
            data = F.cross_entropy(logits, targets, reduction="sum")
        return 0.5 * (W ** 2).sum() + C * data

    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=max_iter, tolerance_grad=1e-9,
                            tolerance_change=1e-12, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss
    with torch.enable_grad():  # callers may be under inference_mode or no_grad
        opt.step(closure)
    W, b = W.detach(), b.detach()
    if not (torch.isfinite(W).all() and torch.isfinite(b).all()):
        raise MinknnError("the logistic regression did not converge to finite weights (are the "
                          "representations finite?)")
    if num_classes == 2 and not multilabel:  # rows -w/2, +w/2: softmax gives sigmoid(w.z + b)
        W, b = torch.cat([-W, W]) / 2, torch.cat([-b, b]) / 2
    return W.float(), b.float()


@torch.no_grad()
def fit_head(model, tokenizer, task, examples, batch_size, device, precision=None, C=C_DEFAULT):
    """Fits the task's linear head (model.heads[task.name]) as the probe on the encoder's
    representations z of `examples` (as the head sees them at inference: no dropout), and writes
    it in place, leaving the model in training mode (its callers train next). Classification and
    multi-label tasks of one text (or --pair_mode cross) only."""
    if task.kind not in ("classify", "multilabel") or model.siamese(task):
        raise MinknnError(f"{task.name}: a logistic-regression head fits a classification or "
                          f"multi-label task's vector z; {task.name} has none to fit")
    _, z = predict(model, tokenizer, task, examples, batch_size, device, precision=precision)
    y = kind_of(task).targets(task, examples, "cpu")   # (N,) classes or (N, K) multi-hot
    W, b = fit_logistic(z, y, len(task.labels), C, multilabel=task.kind == "multilabel")
    head = model.heads[task.name]
    head.weight.copy_(W.to(head.weight))
    head.bias.copy_(b.to(head.bias))
    model.train()  # predict() left it in eval mode
    return z
