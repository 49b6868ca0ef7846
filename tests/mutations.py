"""Plausible student mistakes, one per entry, for tests/mutate.py: (part, file, the correct text,
the mistake, what the student did). Each text occurs once in its file, inside a solution block of
its part; the part's own test command must fail on the mistake with a message naming the part.
Not copied into the student edition (minknn/assignment.py): it quotes the solution."""

MUTATIONS = [
    # --- BERT: embeddings, attention, the layer; pooling ---
    ("attention", "minknn/bert.py", "    probs = F.dropout(probs, p=dropout_p)  # BERT drops",
     "    probs = probs  # BERT drops", "attention dropout removed"),

    # --- training: the optimiser and the step ---
    ("training", "train.py", "    optimizer.zero_grad(set_to_none=True)\n    conflicts = None\n",
     "    conflicts = None\n", "no optimizer.zero_grad(): the gradients accumulate across steps"),
    ("training", "train.py", "    optimizer.zero_grad(set_to_none=True)\n    conflicts = None\n",
     "    model.zero_grad(set_to_none=True)\n    conflicts = None\n",
     "model.zero_grad() instead of the optimiser's: the proxies' gradients accumulate"),
    ("training", "train.py", "        sum(task_losses.values()).backward()\n    norm = torch",
     "        sum(task_losses.values()).backward()\n"
     "    optimizer.zero_grad(set_to_none=True)\n    norm = torch",
     "zero_grad after backward: the step sees no gradient"),
    ("training", "train.py", "    optimizer.zero_grad(set_to_none=True)\n    conflicts = None\n",
     "    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)\n    conflicts = None\n",
     "optimizer.step() before backward (and again after)"),
    ("training", "train.py", "        sum(task_losses.values()).backward()\n",
     "        task_losses[name].backward()\n", "backward on the last task's loss only"),
    ("training", "train.py", "    if pcgrad is not None:  # surgery",
     "    if False:  # surgery", "--pcgrad ignored: always the sum's backward"),
    ("training", "train.py", "    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)\n",
     "    norm = torch.nn.utils.clip_grad_norm_(params, float('inf'))\n",
     "no gradient clipping (the norm computed, nothing clipped)"),
    ("training", "train.py", "    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)\n",
     "    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
     "clipping the model's gradients only: the proxies' are left unclipped"),
    ("training", "train.py",
     "    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)\n"
     "    if not torch.isfinite(norm):  # before the step: the weights stay finite\n"
     "        raise Diverged(f\"the gradient norm became {norm.item()}\")\n"
     "    optimizer.step()\n",
     "    optimizer.step()\n"
     "    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)\n"
     "    if not torch.isfinite(norm):  # before the step: the weights stay finite\n"
     "        raise Diverged(f\"the gradient norm became {norm.item()}\")\n",
     "clipping after the step"),
    ("training", "train.py",
     "    if not torch.isfinite(norm):  # before the step: the weights stay finite\n"
     "        raise Diverged(f\"the gradient norm became {norm.item()}\")\n", "",
     "no Diverged check: a NaN gradient reaches the weights"),
    ("training", "train.py", "    optimizer.step()\n    scheduler.step()", "    optimizer.step()",
     "no scheduler.step(): the lr stays at the warm-up's first value"),
    ("training", "train.py", "    optimizer.step()\n    scheduler.step()",
     "    scheduler.step()\n    optimizer.step()", "scheduler.step() before optimizer.step()"),
    ("training", "train.py", "    no_decay = [p for p in model_params if p.ndim < 2]\n",
     "    no_decay = []\n", "biases and LayerNorm weights left out of the optimiser"),
    ("training", "train.py",
     "    decay = [p for p in model_params if p.ndim >= 2]\n"
     "    no_decay = [p for p in model_params if p.ndim < 2]\n",
     "    decay = [p for p in model_params if p.ndim >= 1]\n"
     "    no_decay = [p for p in model_params if p.ndim < 1]\n",
     "weight decay on biases and LayerNorm weights (every vector decays)"),
    ("training", "train.py", '{"params": no_decay, "weight_decay": 0.0}',
     '{"params": no_decay, "weight_decay": args.weight_decay}',
     "the no-decay group given args.weight_decay"),
    ("training", "train.py", '{"params": loss_params, "weight_decay": 0.0, "lr": args.proxy_lr}',
     '{"params": loss_params, "weight_decay": 0.0}',
     "the proxies' own lr lost: they learn at --lr"),
    ("training", "train.py", '{"params": loss_params, "weight_decay": 0.0, "lr": args.proxy_lr}',
     '{"params": loss_params, "lr": args.proxy_lr}',
     "weight decay on the proxies (the group takes AdamW's default 0.01)"),
    ("training", "train.py",
     '{"params": no_decay, "weight_decay": 0.0},\n'
     '                             {"params": loss_params, "weight_decay": 0.0, '
     '"lr": args.proxy_lr}],\n',
     '{"params": no_decay, "weight_decay": 0.0}],\n',
     "the loss's parameters (proxies) left out of the optimiser"),
    ("training", "train.py", "      lr=args.lr, fused=True)",
     "      lr=args.lr, betas=(0.9, 0.98), fused=True)",
     "RoBERTa's betas (0.9, 0.98) in place of AdamW's defaults, BERT's"),
    ("training", "train.py", "    opt = torch.optim.AdamW(", "    opt = torch.optim.Adam(",
     "Adam instead of AdamW: weight decay as an L2 term inside the adaptive step"),
    ("training", "train.py", "    warmup = max(1, int(args.warmup * total_steps))\n",
     "    warmup = max(1, int(args.warmup * args.epochs))\n",
     "warm-up counted in epochs, not steps"),
    ("training", "train.py", "    warmup = max(1, int(args.warmup * total_steps))\n",
     "    warmup = int(args.warmup * total_steps)\n",
     "no minimum of one warm-up step: a short run divides by 0"),
    ("training", "train.py", "up, down = (step + 1) / warmup,", "up, down = step / warmup,",
     "warm-up from 0: the first step has lr 0"),
    ("training", "train.py", "(total_steps - step) / max(1, total_steps - warmup)",
     "(total_steps - step) / total_steps",
     "the decay counted over all the steps, not those after the warm-up"),
    ("training", "train.py", "        return min(up, max(0.0, down))\n", "        return 1.0\n",
     "no learning-rate schedule: a constant lr"),

    # --- the losses ---

    # --- proxy inference, the MoCo memory, the kNN vote, PCGrad ---

]
