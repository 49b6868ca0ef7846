"""What the kNN costs. `knn`: KNN-BERT's training step against a ce step (train.py's own
train_step on runs built as train.py builds them) and the pieces knnbert adds, then the kNN
search and vote at evaluation against the encoder's time per query. `index`: faiss flat, IVF and
HNSW datastores, from real encoded keys to a million synthetic ones (clustered_keys): build
time, size, recall against the flat (exact) search, and search-and-vote time per query.
"""
import os
import time

import torch

from minknn import backbones
from minknn.lab.bench.shared import Table, built, device_name, fixed_batches, precision_of, step
from minknn.model import Model
from minknn.tasks.data import load_split
from minknn.tasks.registry import get_task
from minknn.tokenizer import Tokenizer
from minknn.tools.engine import autocast, predict
from minknn.tools.step import batch
from minknn.tools.weights import resolve_model_path


# ---------------------------------------------------------------------------------------------
# knn: KNN-BERT's step against a ce step; the kNN vote against the encoder at evaluation

def bench_knn(args, device, timer, out):
    from minknn.datastore import Datastore
    task, path = get_task(args.task, args.data_dir), resolve_model_path(args.model)
    train = {task.name: load_split(task, "train", args.data_dir)}
    dev = load_split(task, "dev", args.data_dir)
    tokenizer = Tokenizer.from_folder(path, 128)
    rows = fixed_batches(train, [task], 32, args.steps)
    trainers = {loss: built(args, ["--task", task.name, "--loss", loss], train, device)
                for loss in ("ce", "knnbert")}
    steps = {loss: [batch(t, r) for r in rows] for loss, t in trainers.items()}
    seconds = timer.best_of_rounds({loss: (lambda t=t, b=steps[loss]: [step(t, x) for x in b])
                                    for loss, t in trainers.items()})
    per_step = {loss: s / len(rows) for loss, s in seconds.items()}
    epoch_steps = -(-len(train[task.name]) // 32)
    knnbert = trainers["knnbert"]
    out.append(f"`python -m minknn.lab.bench knn`: {device_name(device)}, {precision_of(device)}; "
               f"train.py's train_step on the same {args.steps} real {task.name} batches of 32, "
               f"best of {args.rounds} alternating rounds; knnbert's queue holds "
               f"{len(knnbert.moco.memory.keys)} keys; kNN at K {args.k} over the "
               f"{len(train[task.name])} training examples, queried by the {len(dev)} dev "
               f"examples\n")
    print(out[-1])
    table = Table(out, "what", "measured", "ratio")
    for loss, s in per_step.items():
        table.row(f"`{loss}` step",
                  f"{1000 * s:.0f} ms ({s * epoch_steps:.0f} s per epoch of {epoch_steps} steps)",
                  f"{s / per_step['ce']:.2f}x `ce`")
    table.row("the queue fill, once per run", f"{knnbert.fill_seconds:.1f} s",
              f"{knnbert.fill_seconds / (per_step['ce'] * epoch_steps):.2f}x one `ce` epoch")
    for piece, s in knnbert_pieces(knnbert, steps["knnbert"][0], timer, args.steps).items():
        table.row(f"of which {piece}", f"{1000 * s:.1f} ms", f"{s / per_step['ce']:.2f}x `ce`")
    del trainers, steps

    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(path), [task], "mean").to(device)
    start = time.perf_counter()
    _, keys = predict(model, tokenizer, task, train[task.name], 64, device)
    datastore = Datastore(keys, [e.label for e in train[task.name]],
                          [e.id for e in train[task.name]], len(task.labels))
    for vote in ("cosine", "distance"):
        datastore.index(vote)
    build = time.perf_counter() - start
    encoded = []  # the dev set's representations, the queries below: one pass, timed
    encode = timer.seconds(
        lambda: encoded.append(predict(model, tokenizer, task, dev, 64, device)[1]),
        warmup=0) / len(dev)
    table.row("datastore build (a forward pass over the training set, both faiss indexes)",
              f"{build:.1f} s", "")
    table.row("encoding the dev set", f"{1000 * encode:.2f} ms per query", "")
    queries = encoded[0]
    for vote in ("cosine", "distance"):
        def knn(vote=vote):
            scores, rows = datastore.search(queries, args.k, vote)
            datastore.vote(scores, rows, vote, 10.0)
        s = timer.seconds(knn, 3) / len(dev)
        table.row(f"kNN search and vote, `--vote {vote}`", f"{1000 * s:.3f} ms per query",
                  f"+{100 * s / encode:.1f}% on the encoder")


def knnbert_pieces(trainer, batches, timer, repeats):
    """Seconds per step of each piece knnbert adds to a ce step."""
    moco, model, loss = trainer.moco, trainer.model, trainer.losses[trainer.tasks[0].name]
    inputs, labels, rows = next(iter(batches.values()))
    with autocast(trainer.device, trainer.args.precision):
        keys = moco.key_encoder(trainer.tasks[0].name, inputs)
    z = torch.randn(len(labels), keys.shape[1], device=trainer.device, requires_grad=True)

    def key_forward():
        with autocast(trainer.device, trainer.args.precision):
            moco.key_encoder(trainer.tasks[0].name, inputs)

    def key_forward_inference_mode():  # tried as a speed-up: no autograd bookkeeping
        with torch.inference_mode(), autocast(trainer.device, trainer.args.precision):
            moco.key_encoder.encoder(trainer.tasks[0].name, **inputs).z.float().clone()

    def loss_over_queue():
        loss.metric(z, labels, keys, moco.memory.keys, moco.memory.labels, rows,
                    moco.memory.ids).backward()

    return timer.best_of_rounds({
        "the key encoder's forward pass (under torch.no_grad, as train.py runs it)": key_forward,
        "the same under torch.inference_mode (not used)": key_forward_inference_mode,
        "the momentum update": lambda: moco.key_encoder.update(model),
        "the loss over the queue (forward and backward)": loss_over_queue,
        "the enqueue": lambda: moco.memory.enqueue(keys, labels, rows)}, repeats)


# ---------------------------------------------------------------------------------------------
# index: flat, IVF and HNSW datastores, from real keys to a million synthetic ones

NOISE = 0.5  # clustered_keys' noise


def clustered_keys(n, d, seed, clusters=None, noise=NOISE):
    """(keys (n, d), labels (n,)): synthetic keys, the stand-in for encoder outputs where we have
    none that many. A mixture of Gaussians: n / 20 centres of norm about 1 (about 1.4 apart), each
    key its centre plus noise of norm `noise`; a key's label is its cluster's, mod 5. The noise
    sets how hard the search is (at 0.6 every key's 64 nearest share its cluster and any index
    finds them; at 2 neighbourhoods are nearly random). NOISE = 0.5 was chosen so that the
    approximate indexes find no more of the true neighbours in 100k synthetic keys than in the
    152k real ones of `--real` (recall@64 measured: HNSW 0.88 against 0.93 at ef_search 128, IVF
    0.63 against 0.80 at nprobe 32), so the synthetic figures do not flatter them."""
    g = torch.Generator().manual_seed(seed)
    clusters = clusters or max(1, n // 20)
    centres = torch.randn(clusters, d, generator=torch.Generator().manual_seed(0)) / d ** 0.5
    which = torch.randint(0, clusters, (n,), generator=g)
    keys = centres[which] + noise * torch.randn(n, d, generator=g) / d ** 0.5
    return keys, which % 5


def real_keys(args, model, tokenizer, device):
    """(keys, labels, queries): the model's mean-pooled vectors of the --real tasks' training
    sentences pooled into one datastore, queried by SST's dev sentences. Encoding takes minutes on
    a CPU: --cache FILE keeps them for the next run."""
    if args.cache and os.path.exists(args.cache):
        saved = torch.load(args.cache, weights_only=True)
        if saved["real"] == args.real and len(saved["queries"]) >= args.queries:
            return saved["keys"], saved["labels"], saved["queries"][:args.queries]
    keys, labels, sst = [], [], get_task("sst", args.data_dir)  # the model's one head is SST's
    for name in args.real:
        task = get_task(name, args.data_dir)
        train = [e for e in load_split(task, "train", args.data_dir) if e.text_b is None]
        keys.append(predict(model, tokenizer, sst, train, 64, device, progress=f"{name} keys")[1])
        labels.append(torch.zeros(len(train), dtype=torch.long))  # one class: the vote's cost only
    dev = load_split(sst, "dev", args.data_dir)[:args.queries]
    queries = predict(model, tokenizer, sst, dev, 64, device)[1]
    keys, labels = torch.cat(keys), torch.cat(labels)
    if args.cache:
        torch.save({"real": args.real, "keys": keys, "labels": labels, "queries": queries},
                   args.cache)
    return keys, labels, queries


def bench_index(args, device, timer, out):
    import faiss
    from minknn.index import describe_index, index_settings, recall_at_k
    from minknn.datastore import Datastore
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_folder(path, 128)
    task = get_task("sst", args.data_dir)
    torch.manual_seed(0)
    model = Model(backbones.from_pretrained(path), [task], "mean").to(device)
    dev = load_split(task, "dev", args.data_dir)
    encode = timer.seconds(lambda: predict(model, tokenizer, task, dev, 64, device),
                           warmup=0) / len(dev)
    sets = []
    if args.real:
        real = real_keys(args, model, tokenizer, device)
        sets.append((f"{len(real[0]):,} real ({'+'.join(args.real)})", *real))
    sets += [(f"{n:,} clustered synthetic", *clustered_keys(n, args.dim, seed=1),
              clustered_keys(args.queries, args.dim, seed=2, clusters=n // 20)[0])
             for n in args.sizes]
    out.append(f"`python -m minknn.lab.bench index`: {device_name(device)}, faiss "
               f"{faiss.__version__} on {faiss.omp_get_max_threads()} threads; {args.queries} "
               f"queries, K {args.k}, the cosine vote; the encoder takes {1000 * encode:.2f} ms "
               f"per query (SST dev, batches of 64); search-and-vote time is the best of "
               f"{args.rounds} rounds over all queries at once; recall@{args.k} against the flat "
               f"(exact) search of the same keys\n")
    print(out[-1])
    table = Table(out, "keys", "index", "build s", "size MB", f"recall@{args.k}",
                  "search + vote ms/query", "share of the encoder's time")
    for name, keys, labels, queries in sets:
        exact = None
        for index, knob, values in (("flat", None, [None]), ("ivf", "nprobe", args.nprobe),
                                    ("hnsw", "ef_search", args.ef_search)):
            settings = index_settings(index, len(keys))
            store = Datastore(keys, labels, range(len(keys)), 5, settings)
            start = time.perf_counter()
            store.index("cosine")  # trained (IVF's k-means) and filled
            build = time.perf_counter() - start
            size = faiss.serialize_index(store.index("cosine")).nbytes / 2 ** 20
            for value in values:  # the search-time knob: one build serves every value
                if knob:
                    store.use_index({**settings, knob: value})

                def search_and_vote(store=store):
                    scores, rows = store.search(queries, args.k, "cosine")
                    store.vote(scores, rows, "cosine", None)
                seconds = timer.best_of_rounds({index: search_and_vote})[index] / len(queries)
                rows = store.search(queries, args.k, "cosine")[1]
                exact = rows if index == "flat" else exact
                table.row(name, describe_index(settings) + (f", {knob} {value}" if knob else ""),
                          f"{build:.1f}", f"{size:.0f}", f"{recall_at_k(rows, exact):.3f}",
                          f"{1000 * seconds:.3f}", f"{100 * seconds / encode:.1f}%")
