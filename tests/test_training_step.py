"""Part 5 training (train.py, minknn/assignment/parts.py): make_optimizer and train_step, the optimiser and
the step. Fast checks on a model small enough to follow every number; the oracle writes the step
out (the clipped gradient of the summed losses, then AdamW), and the sanity check compares with
the stored reference outputs (tests/fixtures/references/training.pt). The part's command:

    python -m pytest -q tests/test_training_step.py

test_train.py runs train.py and evaluate.py end to end.
"""
import copy
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import train
from elsewhere import check_on_second_device
from grading import as_formula, as_mix, check, close, graded, matches_reference
from minknn.assignment.parts import label
from minknn.bert import BertConfig, BertModel
from minknn.tools import options
from minknn.tools.run import Diverged

PART = "training"
TOTAL, WARMUP = 8, 0.25  # the step tests' schedule: 2 warm-up steps of 8, so each step's lr differs
SCALES = (30.0, 0.01, 30.0)  # the losses' scale at each step: gradient norm over 1, under, over


class Tiny(torch.nn.Module):
    """A stand-in for minknn.model.Model in train_step: model(task, input_ids=...) -> the task's
    logits, through an embedding, a dense layer and a LayerNorm (a BERT in miniature) and a head per
    task. Its weights come from their own generator: the same in every run, and the global random
    state untouched."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():  # the layers' own init draws from the global generator
            self.embeddings = torch.nn.Embedding(10, 6)
            self.dense = torch.nn.Linear(6, 6)
            self.LayerNorm = torch.nn.LayerNorm(6)
            self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(6, 3),
                                              "b": torch.nn.Linear(6, 2)})
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, task, input_ids):
        h = self.LayerNorm(torch.tanh(self.dense(self.embeddings(input_ids).mean(1))))
        return self.heads[task](h)


class ProxyLoss(torch.nn.Module):
    """A loss with parameters of its own, as the proxy losses: cross-entropy on the logits and on
    their products with the proxies, times `scale` (which puts the gradient norm over 1 or under).
    `poison` "nan" adds sqrt(0 x proxies), a loss of 0 whose gradient is NaN; "inf" adds
    sqrt(p - p) with p the proxies' sum, a loss of 0 whose gradient is infinite."""

    def __init__(self, classes, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.proxies = torch.nn.Parameter(torch.randn(classes, classes, generator=g))
        self.scale, self.poison = 1.0, None

    def forward(self, output, targets):
        ce = F.cross_entropy(output, targets)
        metric = F.cross_entropy(output @ self.proxies.T, targets)
        loss = self.scale * (ce + metric)
        if self.poison == "nan":
            loss = loss + torch.sqrt(0 * self.proxies.sum())
        elif self.poison == "inf":
            p = self.proxies.sum()
            loss = loss + torch.sqrt(p - p.detach())
        return loss, {"ce": ce.detach(), "metric": metric.detach()}


class SummingPCGrad:
    """A stand-in for --pcgrad's PCGrad (minknn/pcgrad.py, part 20, not run by this part's
    tests): its backward(losses, rng) backpropagates the sum, as PCGrad does when no tasks
    conflict, so that the step's --pcgrad path is held to the same gradients as the other."""

    def backward(self, losses, rng=None):  # PCGrad's signature: rng has a default there too
        sum(losses).backward()
        return 0


MODES = {"without --pcgrad": None, "with --pcgrad": SummingPCGrad}  # train_step's two paths


def tiny_args(warmup=WARMUP):
    return options.make_parser().parse_args(["--lr", "0.01", "--proxy_lr", "0.05",
                                           "--weight_decay", "0.1", "--warmup", str(warmup)])


def tiny_batches(step):
    """Step `step`'s batch of each task: 4 examples of 5 tokens, the same in every run."""
    g = torch.Generator().manual_seed(100 + step)
    return {task: ({"input_ids": torch.randint(10, (4, 5), generator=g)},
                   torch.randint(classes, (4,), generator=g), torch.arange(4))
            for task, classes in (("a", 3), ("b", 2))}


def tiny_run(total=TOTAL, warmup=WARMUP):
    """The tiny model and its losses, make_optimizer's optimiser and scheduler for them, and the
    parameters with their names."""
    model = Tiny()
    losses = torch.nn.ModuleDict({"a": ProxyLoss(3, 1), "b": ProxyLoss(2, 2)})
    args = tiny_args(warmup)
    names = [n for n, _ in model.named_parameters()]
    names += [f"losses.{n}" for n, _ in losses.named_parameters()]
    optimizer, scheduler = graded(
        PART, f"make_optimizer(..., total_steps={total}) with --warmup {warmup}",
        train.make_optimizer, list(model.parameters()), list(losses.parameters()), args, total)
    params = list(model.parameters()) + list(losses.parameters())
    return model, losses, optimizer, scheduler, params, names, args


def tiny_trainer(model, losses, optimizer, scheduler, params, pcgrad=None, rng=None):
    """What train_step reads of a run's parts (minknn/tools/trainer.py's Trainer): the tiny model, its
    losses, the optimiser and scheduler, what trains, PCGrad and its rng; no memory, one process."""
    return SimpleNamespace(model=model, losses=losses, optimizer=optimizer, scheduler=scheduler,
                           params=params, pcgrad=pcgrad, rng=rng or random.Random(0), moco=None,
                           ddp=None, args=SimpleNamespace(precision=None))


def factor(s, total=TOTAL, warmup=WARMUP):
    """The schedule: the factor on the lr at step s (0 for the first optimizer.step())."""
    w = max(1, int(warmup * total))
    return min((s + 1) / w, max(0.0, (total - s) / max(1, total - w)))


def base_lr(name, args):
    return args.proxy_lr if name.startswith("losses.") else args.lr


def decays(name):
    return not (name.endswith("bias") or "LayerNorm" in name or name.startswith("losses."))


def groups_of(optimizer, p):
    return [g for g in optimizer.param_groups if any(q is p for q in g["params"])]


def first_name(group, names, params):
    """The name of a group's first parameter, to name the group."""
    return next(n for n, p in zip(names, params) if any(q is p for q in group["params"]))


def set_scale(losses, scale):
    for loss in losses.values():
        loss.scale = scale


def clipped_gradients(model, losses, batches):
    """What optimizer.step() should see, computed on copies: the gradient of the sum of the task
    losses, clipped to total norm 1 (as clip_grad_norm_: times 1 / (norm + 1e-6) where that is
    under 1). Returns them and the norm before clipping."""
    model, losses = copy.deepcopy(model), copy.deepcopy(losses)
    params = list(model.parameters()) + list(losses.parameters())
    total = sum(losses[t](model(t, **inputs), targets)[0]
                for t, (inputs, targets, _) in batches.items())
    return clip(torch.autograd.grad(total, params))


def clip(grads):
    """clip_grad_norm_(..., 1.0) written out: the gradients times 1 / (norm + 1e-6) where that is
    under 1, and their total norm before."""
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads)).item()
    return [g * min(1.0, 1.0 / (norm + 1e-6)) for g in grads], norm


def oracle(model, losses, args, steps=3):
    """The first steps written out by hand, on copies: the clipped gradient of the summed losses,
    then AdamW (Loshchilov and Hutter 2019, Algorithm 2: the decay apart from the adaptive step)
    with the default betas and eps, the groups chosen by name and the scheduled lr. Returns the
    named weights after them."""
    model, losses = copy.deepcopy(model), copy.deepcopy(losses)
    named = list(model.named_parameters())
    named += [(f"losses.{n}", p) for n, p in losses.named_parameters()]
    m, v = [torch.zeros_like(p) for _, p in named], [torch.zeros_like(p) for _, p in named]
    b1, b2, eps = 0.9, 0.999, 1e-8
    for s in range(steps):
        set_scale(losses, SCALES[s])
        grads, _ = clipped_gradients(model, losses, tiny_batches(s))
        with torch.no_grad():
            for i, ((name, p), g) in enumerate(zip(named, grads)):
                lr = base_lr(name, args) * factor(s, TOTAL, args.warmup)
                p.mul_(1 - lr * (args.weight_decay if decays(name) else 0.0))
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                m_hat, v_hat = m[i] / (1 - b1 ** (s + 1)), v[i] / (1 - b2 ** (s + 1))
                p.sub_(lr * m_hat / (v_hat.sqrt() + eps))
    return {name: p.detach() for name, p in named}


def spy(optimizer, params):
    """Records at each optimizer.step() every group's lr and a copy of every gradient (None where
    there is none)."""
    calls = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append((
        [g["lr"] for g in opt.param_groups],
        [None if p.grad is None else p.grad.clone() for p in params])))
    return calls


def test_part_training_parameter_groups():
    """make_optimizer on a (tiny) BERT with a head and a loss's proxies: AdamW; every parameter in
    one group; decay on the weight matrices only; the proxies at --proxy_lr, without decay."""
    with torch.random.fork_rng():  # BertModel's init draws from the global generator
        torch.manual_seed(0)
        config = BertConfig.from_dict(dict(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=16,
                                           max_position_embeddings=16))
        model = torch.nn.ModuleDict({"bert": BertModel(config), "heads": torch.nn.ModuleDict(
            {"sst": torch.nn.Linear(8, 5)})})
    losses = torch.nn.ModuleDict({"sst": ProxyLoss(5, 1)})
    args = tiny_args()
    named = list(model.named_parameters())
    named += [(f"losses.{n}", p) for n, p in losses.named_parameters()]
    optimizer, _ = graded(PART, "make_optimizer", train.make_optimizer, list(model.parameters()),
                          list(losses.parameters()), args, 100)
    check(PART, isinstance(optimizer, torch.optim.AdamW), f"make_optimizer must build "
          f"torch.optim.AdamW (the weight decay apart from the adaptive step, Loshchilov and "
          f"Hutter 2019); it built {type(optimizer).__name__}")
    given = {id(p) for _, p in named}
    extra = sum(id(p) not in given for g in optimizer.param_groups for p in g["params"])
    check(PART, extra == 0, f"the optimiser holds {extra} tensors that are not in model_params or "
          f"loss_params")
    for name, p in named:
        groups = groups_of(optimizer, p)
        check(PART, len(groups) == 1, f"{name} is in {len(groups)} parameter groups; each "
              f"parameter of model_params and loss_params belongs in exactly one")
        group, wd = groups[0], groups[0]["weight_decay"]
        lr = group.get("initial_lr", group["lr"])  # a scheduler keeps the group's lr in initial_lr
        check(PART, tuple(group["betas"]) == (0.9, 0.999) and group["eps"] == 1e-8, f"BERT's "
              f"optimiser has AdamW's default betas (0.9, 0.999) and eps 1e-8 (Devlin et al., "
              f"A.2); the group holding {name} has betas {tuple(group['betas'])}, eps "
              f"{group['eps']}")
        if name.startswith("losses."):
            check(PART, lr == args.proxy_lr, f"the loss's parameters (proxies) learn at "
                  f"args.proxy_lr = {args.proxy_lr}; the group holding {name} has lr {lr}")
            check(PART, wd == 0, f"the loss's parameters (proxies) get no weight decay; the group "
                  f"holding {name} has weight_decay {wd}")
            continue
        check(PART, lr == args.lr, f"the model's parameters learn at args.lr = {args.lr}; the "
              f"group holding {name} has lr {lr}")
        if decays(name):
            check(PART, wd == args.weight_decay, f"the weight matrices get weight decay "
                  f"args.weight_decay = {args.weight_decay}; the group holding {name} has "
                  f"weight_decay {wd}")
        else:
            check(PART, wd == 0, f"biases and LayerNorm weights must get no weight decay; the "
                  f"group holding {name} has weight_decay {wd}")


def test_part_training_schedule():
    """The lr at each optimizer.step(), every group alike: up from lr / warmup to lr over the
    warm-up steps, then down to 0 at total_steps; warmup is a share of the steps, at least one,
    truncated (int), not rounded."""
    # 5 warm-up steps of 20; int(0.6) = 0: 1 step; int(3.6) = 3 steps of 20, not 4; every step
    # a warm-up step (--warmup 1), where total_steps - warmup is 0
    runs = []
    for total, warmup in ((20, 0.25), (10, 0.06), (20, 0.18), (10, 1.0)):
        try:
            _, _, optimizer, scheduler, params, names, args = tiny_run(total, warmup)
            raised = None
        except AssertionError as e:
            raised = str(e).removeprefix(f"{label(PART)}: ")
        check(PART, raised is None or "ZeroDivisionError" not in raised, f"{raised}: with "
              f"--warmup {warmup} of {total} steps the warm-up lasts int({warmup} x {total}) = "
              f"{int(warmup * total)} steps and the decay total_steps - warmup = "
              f"{total - int(warmup * total)}: each is taken at least 1 (max(1, ...)), so that "
              f"no step divides by 0")
        check(PART, raised is None, str(raised))
        lrs = []
        for s in range(total + 1):  # each step's lrs, and after the last step's (0)
            lrs.append([g["lr"] for g in optimizer.param_groups])
            optimizer.step()  # no gradients: nothing moves
            scheduler.step()
        groups = [first_name(group, names, params) for group in optimizer.param_groups]
        runs.append((total, warmup, args.epochs, [[row[i] / base_lr(name, args) for row in lrs]
                                                   for i, name in enumerate(groups)], groups))
    for total, warmup, epochs, factors, groups in runs:
        for i, (f, name) in enumerate(zip(factors, groups)):
            bad = [s for s in range(total + 1) if abs(f[s] - factor(s, total, warmup)) > 1e-6]
            if not bad:
                continue
            # a mistake is named only where its schedule is this group's at every setting: one
            # setting can fit several (int(0.25 x 3 epochs) and int(0.25) are both 1 step)
            fits = set.intersection(*(set(schedule_mistakes(r[3][i], *r[:3])) for r in runs))
            named = [said for key, said in schedule_mistakes(f, total, warmup, epochs).items()
                     if key in fits]
            s, w = bad[0], max(1, int(warmup * total))
            check(PART, False, f"the learning rate at step {s} of {total} (--warmup {warmup}, "
                  f"the group holding {name}) is {f[s]:.4g} x its lr, expected "
                  f"{factor(s, total, warmup):.4g} = min((s + 1) / warmup, (total_steps - s) / "
                  f"(total_steps - warmup)) with warmup {w}"
                  f"{': ' + named[0] if named else ''}")


def schedule_mistakes(f, total, warmup, epochs):
    """{a mistake's key: what was done} for the known mistakes whose schedule, recomputed at this
    setting, is the factors f at every step (where a mistake's schedule is the formula's here, it
    fits f when f is right)."""
    w = max(1, int(warmup * total))

    def lrs(up=lambda s, w: (s + 1) / w, span=lambda w: max(1, total - w), w=w):
        return [min(up(s, w), max(0.0, (total - s) / span(w))) for s in range(total + 1)]
    rounded, in_epochs = max(1, round(warmup * total)), max(1, int(warmup * epochs))
    mistakes = {"constant": ("the lr is the same at every step: no schedule", [1.0] * (total + 1)),
                "from 0": ("the warm-up starts from 0 (s / warmup); its factor is (s + 1) / "
                           "warmup, so the first step trains at lr / warmup",
                           lrs(up=lambda s, w: s / w)),
                "decay": ("the decay is (total_steps - s) / total_steps, over all the steps; it "
                          "runs over the steps after the warm-up, (total_steps - s) / "
                          "(total_steps - warmup)", lrs(span=lambda w: total)),
                "rounded": (f"the warm-up lasts round({warmup} x {total}) = {rounded} steps; "
                            f"int() truncates it to {w}", lrs(w=rounded)),
                "epochs": (f"the warm-up lasts int(args.warmup x args.epochs) = {in_epochs} "
                           f"steps; it is a share of the steps, int(args.warmup x total_steps) "
                           f"= {w}", lrs(w=in_epochs))}
    return {key: said for key, (said, wrong) in mistakes.items()
            if all(abs(a - b) < 1e-6 for a, b in zip(f, wrong))}


@pytest.mark.parametrize("mode", MODES)
def test_part_training_step_clears_old_gradients(mode):
    """Gradients left in .grad before train_step (here NaN) must not reach the step, on either of
    its paths: optimizer.zero_grad() clears every group's, the proxies' included
    (model.zero_grad() would leave theirs)."""
    model, losses, optimizer, scheduler, params, names, _ = tiny_run()
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    calls = spy(optimizer, params)
    pcgrad = MODES[mode] and MODES[mode]()
    try:
        train.train_step(tiny_trainer(model, losses, optimizer, scheduler, params, pcgrad),
                         tiny_batches(0))
    except Diverged as e:
        # the batch's own gradients are finite: a NaN norm is the NaN left in .grad, either
        # stepped on (a step before this batch's backward: the spy saw it) or never cleared
        stepped = bool(calls) and any(g is not None and not torch.isfinite(g).all()
                                      for g in calls[0][1])
        check(PART, False, f"train_step {mode} raised Diverged ({e}) with NaN left in .grad from "
              f"before the call: " + ("optimizer.step() ran first on those NaN gradients, before this "
                               "batch's backward" if stepped else
                               "this batch's gradients are finite, so the NaN reached the "
                               "clipping; every trained parameter's .grad, the proxies' "
                               "included, is cleared before backward"))
    except NotImplementedError:
        raise
    except Exception as e:
        check(PART, False, f"train_step raised {type(e).__name__}: {e}")
    for _, grads in calls:
        for name, g in zip(names, grads):
            check(PART, g is None or torch.isfinite(g).all(), f"train_step {mode}: the gradient "
                  f"of {name} at optimizer.step() is not finite, and this batch's is: the NaN "
                  f"left in .grad before train_step reached the step; every .grad is cleared "
                  f"before backward")


def task_gradients(model, losses, batches):
    """Each task's own gradient (of its loss alone, unclipped), on copies: {task: [grads]}."""
    model, losses = copy.deepcopy(model), copy.deepcopy(losses)
    params = list(model.parameters()) + list(losses.parameters())
    out = {}
    for t, (inputs, targets, _) in batches.items():
        grads = torch.autograd.grad(losses[t](model(t, **inputs), targets)[0], params,
                                    allow_unused=True)
        out[t] = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    return out


def test_part_training_step_backpropagates_the_sum_of_the_task_losses():
    """Two tasks, losses scaled down (0.01) so that the gradient's norm is under 1 and clipping
    leaves it: the gradient at optimizer.step() of each parameter both tasks reach is
    g_a + g_b, g_t the gradient of task t's loss alone. Read back as c_a g_a + c_b g_b."""
    model, losses, optimizer, scheduler, params, names, _ = tiny_run()
    set_scale(losses, 0.01)
    batches = tiny_batches(0)
    per_task = task_gradients(model, losses, batches)
    calls = spy(optimizer, params)
    graded(PART, "train_step (call 1)", train.train_step,
           tiny_trainer(model, losses, optimizer, scheduler, params), batches)
    check(PART, len(calls) == 1, f"train_step called optimizer.step() {len(calls)} times; once "
          f"per call")
    shared = [i for i, n in enumerate(names) if not n.startswith(("heads.", "losses."))]
    got = torch.cat([calls[0][1][i].flatten() if calls[0][1][i] is not None
                     else torch.zeros(params[i].numel()) for i in shared])
    g_a = torch.cat([per_task["a"][i].flatten() for i in shared])
    g_b = torch.cat([per_task["b"][i].flatten() for i in shared])
    c_a, c_b, off = as_mix(got, g_a, g_b)
    if off < 1e-6 * max(1.0, got.abs().max().item()) + 1e-7:
        said = as_formula((c_a, c_b), {"1": 1.0, "1/2": 0.5, "0": 0.0}, ("g_a", "g_b"))
        check(PART, abs(c_a - 1) < 1e-3 and abs(c_b - 1) < 1e-3, f"two tasks, their losses small "
              f"enough that clipping leaves the gradient (norm under 1): the gradient of the "
              f"shared parameters at optimizer.step() is {c_a:.4g} g_a + {c_b:.4g} g_b (g_t the "
              f"gradient of task t's loss alone); backpropagating the sum of the task losses "
              f"gives 1 g_a + 1 g_b" + {
                  "1/2 g_a + 1/2 g_b": ": the step backpropagated the mean of the 2 task losses, "
                                       "not their sum",
                  "0 g_a + 1 g_b": ": only task b's loss was backpropagated",
                  "1 g_a + 0 g_b": ": only task a's loss was backpropagated"}.get(said, ""))


def test_part_training_a_parameter_without_a_gradient_does_not_move():
    """Call 1 has both tasks; call 2 task 'a' alone, so task 'b''s head and its loss's proxies get
    no gradient in it. AdamW skips a parameter whose .grad is None; a .grad of zeros instead
    lets the decay and the momentum of call 1 move it. Such a parameter must not move in call 2."""
    model, losses, optimizer, scheduler, params, names, _ = tiny_run()
    calls = spy(optimizer, params)
    graded(PART, "train_step (call 1, tasks 'a' and 'b')", train.train_step,
           tiny_trainer(model, losses, optimizer, scheduler, params), tiny_batches(0))
    before = [p.detach().clone() for p in params]
    only_a = {"a": tiny_batches(1)["a"]}
    graded(PART, "train_step (call 2, task 'a' alone)", train.train_step,
           tiny_trainer(model, losses, optimizer, scheduler, params), only_a)
    for i, (name, p) in enumerate(zip(names, params)):
        if not name.startswith(("heads.b.", "losses.b.")):
            continue
        moved = (p.detach() - before[i]).abs().max().item()
        grad = calls[-1][1][i] if len(calls) == 2 else None
        seen = ("" if grad is None else f"; its .grad at optimizer.step() was a tensor (largest "
                f"entry {grad.abs().max().item():.3g}), not None")
        check(PART, moved == 0, f"train_step call 2 has task 'a' alone, so {name} gets no "
              f"gradient in it; a parameter without a gradient in a step must not move in it "
              f"(AdamW skips a parameter whose .grad is None; a .grad of zeros lets the decay and "
              f"call 1's momentum move it): {name} moved by up to {moved:.3g}{seen}")


@pytest.mark.parametrize("mode", MODES)
def test_part_training_step_order(mode):
    """Three calls of train_step, on either of its paths: each calls optimizer.step() once, on
    this batch's gradient of the sum of the task losses clipped to total norm 1, at the scheduled
    lr; then the scheduler moves on to the next step's lr."""
    model, losses, optimizer, scheduler, params, names, args = tiny_run()
    calls = spy(optimizer, params)
    pcgrad = MODES[mode] and MODES[mode]()
    for s, scale in enumerate(SCALES):
        set_scale(losses, scale)
        expected, raw_norm = clipped_gradients(model, losses, tiny_batches(s))
        assert (raw_norm > 1) == (scale > 1), "the scales no longer put the norm over and under 1"
        before = len(calls)
        graded(PART, f"train_step {mode} (call {s + 1})", train.train_step,
               tiny_trainer(model, losses, optimizer, scheduler, params, pcgrad), tiny_batches(s))
        call = f"train_step call {s + 1} {mode}"
        check(PART, len(calls) == before + 1, f"{call} called optimizer.step() "
              f"{len(calls) - before} times; once per call")
        lrs, grads = calls[-1]
        missing = [n for n, g in zip(names, grads) if g is None]
        check(PART, len(missing) < len(names), f"at optimizer.step() in {call} no parameter had "
              f"a gradient (.grad None)")
        check(PART, not missing, f"at optimizer.step() in {call}, {', '.join(missing)} had no "
              f"gradient (.grad None); the others had one")
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads)).item()
        if s > 0:  # the last call's gradients, still in .grad, added to this batch's and clipped
            raw = [g / min(1.0, 1.0 / (raw_norm + 1e-6)) for g in expected]
            piled, _ = clip([g + left for g, left in zip(raw, calls[-2][1])])
            check(PART, not all(torch.allclose(g, w, atol=1e-6, rtol=1e-4)
                                for g, w in zip(grads, piled)),
                  f"optimizer.step() in {call} ran on this batch's gradient plus the one call "
                  f"{s} left in .grad, clipped together: .grad was not cleared before this "
                  f"call's backward (optimizer.zero_grad(set_to_none=True) comes first, on "
                  f"every path)")
        if norm > 1 + 1e-4:  # a cause named only when the gradients are that mistake's
            raw = [g / min(1.0, 1.0 / (raw_norm + 1e-6)) for g in expected]
            model_norm = torch.sqrt(sum((g ** 2).sum() for n, g in zip(names, raw)
                                        if not n.startswith("losses."))).item()
            model_only = [g if n.startswith("losses.") else g * min(1.0, 1.0 / (model_norm + 1e-6))
                          for n, g in zip(names, raw)]
            for mistake, wrong in (
                    ("this batch's gradient unclipped", raw),
                    ("the model's gradients clipped to norm 1 by themselves, the proxies' "
                     "(losses.*) left unclipped", model_only)):
                check(PART, not all(torch.allclose(g, w, atol=1e-6, rtol=1e-4)
                                    for g, w in zip(grads, wrong)),
                      f"optimizer.step() in {call} ran on gradients of total norm {norm:.4g}, "
                      f"{mistake} (total norm {raw_norm:.4g})")
        check(PART, norm <= 1 + 1e-4, f"optimizer.step() in {call} ran on gradients of total norm "
              f"{norm:.4g} (this batch's: {raw_norm:.4g}); the gradients of every parameter "
              f"trained, the proxies' included, are clipped together to total norm 1 before the "
              f"step")
        for name, g, e in zip(names, grads, expected):
            close(PART, g, e, f"the gradient of {name} at optimizer.step() in {call} (that of the "
                  f"sum of every task's loss, clipped to total norm 1)", atol=1e-6, rtol=1e-4)
        for i, group in enumerate(optimizer.param_groups):
            name = first_name(group, names, params)
            want, after = (base_lr(name, args) * factor(k) for k in (s, s + 1))
            late = abs(lrs[i] - after) <= 1e-9 and ": scheduler.step() comes after optimizer.step()"
            check(PART, abs(lrs[i] - want) <= 1e-9, f"optimizer.step() in {call} ran with lr "
                  f"{lrs[i]:.4g} in the group holding {name}; the schedule gives {want:.4g} at "
                  f"step {s}{late or ''}")
            check(PART, abs(group["lr"] - after) <= 1e-9, f"after {call} the group holding {name} "
                  f"has lr {group['lr']:.4g}; the schedule gives {after:.4g} for the next step: "
                  f"train_step calls scheduler.step() once, after optimizer.step()")


def test_part_training_step_passes_pcgrad_the_losses():
    """With --pcgrad, pcgrad.backward(the task losses, rng) replaces the sum's backward, and
    train_step returns its count of conflicting pairs; without, the count is None."""
    class FakePCGrad:
        def __init__(self):
            self.calls = []

        def backward(self, losses, rng=None):  # PCGrad's signature: rng has a default
            self.calls.append((len(losses), rng))
            sum(losses).backward()
            return 7

    model, losses, optimizer, scheduler, params, _, _ = tiny_run()
    rng, pcgrad = random.Random(0), FakePCGrad()
    _, _, conflicts = graded(PART, "train_step with pcgrad", train.train_step,
                             tiny_trainer(model, losses, optimizer, scheduler, params, pcgrad, rng),
                             tiny_batches(0))
    check(PART, pcgrad.calls == [(2, rng)] and conflicts == 7, f"with --pcgrad, train_step calls "
          f"pcgrad.backward(list(task_losses.values()), rng) once in place of the sum's backward, "
          f"and returns what it returns (7 here); it made the calls {pcgrad.calls} (the number of "
          f"losses, the rng) and returned {conflicts}")
    _, _, conflicts = graded(PART, "train_step", train.train_step,
                             tiny_trainer(model, losses, optimizer, scheduler, params), tiny_batches(1))
    check(PART, conflicts is None, f"without --pcgrad, train_step returns conflicts None; it "
          f"returned {conflicts}")


@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_part_training_step_stops_on_a_gradient_that_is_not_finite(poison):
    """A NaN or infinite gradient raises Diverged before optimizer.step(): the weights stay as
    they were."""
    model, losses, optimizer, scheduler, params, names, _ = tiny_run()
    losses["a"].poison = poison
    before = [p.detach().clone() for p in params]
    stopped = None
    try:
        train.train_step(tiny_trainer(model, losses, optimizer, scheduler, params), tiny_batches(0))
    except Diverged as e:
        stopped = e
    except NotImplementedError:
        raise
    except Exception as e:
        check(PART, False, f"train_step raised {type(e).__name__}: {e}")
    hint = ""
    if stopped is None and poison == "inf":  # does a NaN norm stop it? then only inf goes through
        model, losses, optimizer, scheduler, params, names, _ = tiny_run()
        losses["a"].poison = "nan"
        try:
            train.train_step(tiny_trainer(model, losses, optimizer, scheduler, params),
                             tiny_batches(0))
        except Diverged:
            hint = " (a NaN norm raises Diverged, an infinite one does not)"
        except Exception:
            pass
    check(PART, stopped is not None, f"a gradient norm that is not finite (here "
          f"{'NaN' if poison == 'nan' else 'infinite'}) must raise Diverged before "
          f"optimizer.step(); train_step went on{hint}")
    changed = [n for n, p, b in zip(names, params, before) if not torch.equal(p.detach(), b)]
    check(PART, not changed, f"train_step raised Diverged, but after changing "
          f"{', '.join(changed)}; Diverged comes before optimizer.step(), so that the weights "
          f"stay as they were")


def three_steps():
    """The named weights after three train_step calls, and the oracle's."""
    model, losses, optimizer, scheduler, params, names, args = tiny_run()
    expected = oracle(model, losses, args)
    for s, scale in enumerate(SCALES):
        set_scale(losses, scale)
        graded(PART, f"train_step (call {s + 1})", train.train_step,
               tiny_trainer(model, losses, optimizer, scheduler, params), tiny_batches(s))
    return dict(zip(names, (p.detach() for p in params))), expected


def test_part_training_three_steps_match_the_step_written_out():
    got, expected = three_steps()
    for name in expected:
        close(PART, got[name], expected[name], f"{name} after three train_step calls (the oracle: "
              f"the clipped gradient of the summed losses, AdamW with the groups and the scheduled "
              f"lr)", atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_part_training_step_runs_on_the_inputs_device(mode):
    """Two train_step calls with the model, the losses and the batches on a second device
    (tests/elsewhere.py), and AdamW's plain (not fused) kernels, which take any device: a tensor
    the step makes without device= fails as on a GPU."""
    def two_steps(both, **batch):
        model, losses = both["model"], both["losses"]
        params = list(model.parameters()) + list(losses.parameters())
        optimizer = torch.optim.AdamW(params, lr=0.01, foreach=False)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        trainer = tiny_trainer(model, losses, optimizer, scheduler, params,
                               MODES[mode] and MODES[mode]())
        for s in range(2):
            batches = {t: ({"input_ids": batch[f"{t}{s} ids"]}, batch[f"{t}{s} targets"],
                           batch[f"{t}{s} rows"]) for t in ("a", "b")}
            graded(PART, f"train_step {mode} (call {s + 1})", train.train_step, trainer, batches)
        return torch.cat([p.detach().flatten() for p in params])
    batches = {f"{t}{s} {what}": x for s in range(2) for t, (inputs, targets, rows)
               in tiny_batches(s).items()
               for what, x in (("ids", inputs["input_ids"]), ("targets", targets), ("rows", rows))}
    model, losses, *_ = tiny_run()
    check_on_second_device(PART, f"two train_step calls {mode}", two_steps, batches,
                           torch.nn.ModuleDict({"model": model, "losses": losses}),
                           backward=False)


def test_part_training_sanity_check():
    """The stored reference outputs (tests/fixtures/references/training.pt): each group's lr over
    the 20 steps of a schedule, and the weights after three train_step calls."""
    _, _, optimizer, scheduler, _, _, _ = tiny_run(20)
    lrs = []
    for _ in range(21):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    # Python's float arithmetic, no kernel's sum: within 1e-6, the student's order of operations
    matches_reference(PART, "lr over 20 steps", torch.tensor(lrs, dtype=torch.float64),
                      atol=1e-9, rtol=1e-6)
    got, _ = three_steps()
    matches_reference(PART, "weights after 3 steps", torch.cat([p.flatten() for p in got.values()]))
