"""A word-substitution attack in TextFooler's shape (Jin et al. 2020, "Is BERT Really Robust?"),
written out and offline: KNN-BERT's robustness test (Li et al., sec. 4.6, Table 4).

    python -m minknn.lab.attack --checkpoint RUN --split test --attack knn --phi 0.5
    python -m minknn.lab.attack --checkpoint RUN --attack model --attack_candidates wordnet

The attacked classifier is a black box: classify(texts) -> (N, C) probabilities, any inference
rule of a trained run (minknn/inference.py; --attack model, proxy, knn or knn-only; main() below
builds it from evaluate.py's flags, read as evaluate.py reads them). The goal is untargeted: any
class but the gold one. For one correctly classified text of n words (TextAttack's recipe
textfooler_jin_2019, its GreedyWordSwapWIR with wir_method "delete"):

  1. importance of word i = p(y | x) - p(y | x without word i)            (n queries)
  2. for each word, most important first: its candidate substitutes that pass the constraints;
     one that flips the prediction ends the attack (the most meaning-preserving of those that
     flip); else keep the one that lowers p(y) most, if it lowers it below the current text's.

Constraints, TextAttack's values unless said:
  - no word modified twice, and never a STOPWORD (TextFooler's released list, below);
  - at most ceil(`max_share` x n) words changed, `max_share` = 30% (TextDefender's default, Li
    et al. 2021; TextFooler itself has no cap); stopwords are matched lower-cased ("The" too);
  - candidates, up to `candidates` = 50 per word, from one of two offline sources:
      Neighbours: the nearest whole-word entries of a BERT's input embedding table, at cosine
        >= 0.5. TextFooler searches counter-fitted word vectors instead (Mrksic et al. 2016),
        which push antonyms apart; distributional neighbours keep many ("good" -> "bad"), so a
        swap can change the meaning a human reads (read_wordnet's antonyms count how often).
        Their cosines are also lower than counter-fitted ones: few words pass 0.5 here.
      Synonyms: the words that share a WordNet synset with it (PWWS's source, Ren et al. 2019);
        lemmas only ("films" has none), and every sense of the word, rare ones included.
  - meaning: the angular similarity 1 - arccos(cos(u, v)) / pi of the sentence vectors of the
    text before and after the swap, each a window of 15 words around the swapped word, at least
    1 - 0.5 / pi = 0.841 (the threshold TextAttack's recipe uses for the Universal Sentence
    Encoder; as a cosine, >= cos 0.5 = 0.878). Texts shorter than the window skip it, as
    TextAttack's skip_text_shorter_than_window. The encoder is any sentence encoder (main():
    --attack_encoder, all-MiniLM-L6-v2 as pretrained, frozen, mean-pooled), never the attacked
    model.
  - not here: TextFooler's part-of-speech match (it needs NLTK's tagger, downloaded at run time).
  - queries: unlimited unless `queries` is set (TextAttack's default); each distinct text counts
    once, the original included. An attack whose next step needs more queries than are left
    stops there and fails (TextAttack would spend the rest first).
Texts are words and the separators between them (WORD): punctuation and spaces stay as written.
An example's result: skipped (already misclassified), succeeded or failed; summary() gives
TextAttack's figures, run_attack() a resumable CSV of every example.

main(): the attack on a fixed draw of --attack_n labelled examples of --split (the same draw for
every run), each cut to the words that fit the run's --max_len. Every attacked example is a row of
<run>/attack-<split>-<candidates>-<rule>.csv (--out to name it), written as it ends, so a killed
attack resumes where it stopped, and a rerun with another --attack_n attacks only the drawn
examples the file lacks (IMDB's draw of 300 holds its draw of 60); the summary (TextAttack's
figures over the drawn examples, and the seconds this call took) goes beside it, in its .json,
with the settings a rerun must share to resume (the checkpoint by its sha256, so a run folder
moved or copied keeps its attacks). A figure that is a mean of nothing (the success rate when no
example was classified correctly) is null there and printed as n/a, with the reason.
--attack_candidates wordnet takes WordNet's synonyms (Debian's wordnet-base).
"""
import csv
import dataclasses
import io
import json
import math
import os
import re
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import evaluate  # the flags, read as evaluate.py reads them, and its files' path
from minknn import MinknnError, backbones, progress_bar
from minknn.cli import run
from minknn.data import Example, labelled
from minknn.datastore import knn_settings, run_datastore
from minknn.files import atomic_save, file_sha256, read_json, write_json
from minknn.inference import RULES, load_run, read_task_data, rule_answers
from minknn.kinds import kind_of
from minknn.model import pool
from minknn.options import check_rule_flags
from minknn.tokenizer import Tokenizer
from minknn.weights import resolve_model_path

# TextFooler's stopwords (github.com/jind11/TextFooler, as TextAttack's recipe lists them)
STOPWORDS = frozenset("""
a about above across after afterwards again against ain all almost alone along already also
although am among amongst an and another any anyhow anyone anything anyway anywhere are aren
aren't around as at back been before beforehand behind being below beside besides between beyond
both but by can cannot could couldn couldn't d didn didn't doesn doesn't don don't down due during
either else elsewhere empty enough even ever everyone everything everywhere except first for former
formerly from hadn hadn't hasn hasn't haven haven't he hence her here hereafter hereby herein
hereupon hers herself him himself his how however hundred i if in indeed into is isn isn't it it's
its itself just latter latterly least ll may me meanwhile mightn mightn't mine more moreover most
mostly must mustn mustn't my myself namely needn needn't neither never nevertheless next no nobody
none noone nor not nothing now nowhere o of off on once one only onto or other others otherwise our
ours ourselves out over per please s same shan shan't she she's should've shouldn shouldn't somehow
something sometime somewhere such t than that that'll the their theirs them themselves then thence
there thereafter thereby therefore therein thereupon these they this those through throughout thru
thus to too toward towards under unless until up upon used ve was wasn wasn't we were weren weren't
what whatever when whence whenever where whereafter whereas whereby wherein whereupon wherever
whether which while whither who whoever whole whom whose why with within without won won't would
wouldn wouldn't y yet you you'd you'll you're you've your yours yourself yourselves
""".split())

WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")  # "don't" is one word, "well-made" two


@dataclass
class Settings:
    candidates: int = 50                  # nearest neighbours per word (TextAttack: 50)
    min_cos: float = 0.5                  # their cosine in the embedding table (TextAttack: 0.5)
    max_share: float = 0.3                # words changed / words (TextDefender: 0.3)
    window: int = 15                      # words around the swap that the meaning encoder reads
    min_meaning: float = 1 - 0.5 / math.pi  # angular similarity of the two windows
    queries: int | None = None            # the query budget (None: unlimited)


class Text:
    """A text as its words and the separators around them, so that words can be swapped or
    deleted and the rest kept as written: render({i: "new"}) is the text with word i replaced,
    render({i: ""}) the text without it."""

    def __init__(self, text):
        self.text, self.spans = text, [m.span() for m in WORD.finditer(text)]
        self.words = [text[a:b] for a, b in self.spans]

    def render(self, swaps=None, start=0, end=None):
        """Words start..end-1 (default: the whole text) with swaps applied, and what lies between
        them as written; the whole text keeps what is before its first word and after its last."""
        swaps, n = swaps or {}, len(self.words)
        end = n if end is None else end
        if start == end:  # no words: all of a text without any, else nothing
            return self.text if n == 0 else ""
        first = 0 if start == 0 and end == n else self.spans[start][0]
        last = len(self.text) if start == 0 and end == n else self.spans[end - 1][1]
        pieces, at = [], first
        for i in range(start, end):
            a, b = self.spans[i]
            pieces += [self.text[at:a], swaps.get(i, self.words[i])]
            at = b
        return "".join(pieces) + self.text[at:last]

    def window(self, swaps, i, size):
        """The `size` words around word i (moved inward at the text's ends), rendered."""
        start = min(max(0, i - size // 2), max(0, len(self.words) - size))
        return self.render(swaps, start, min(len(self.words), start + size))


def cut_to_fit(text, fits):
    """The longest prefix of text, in whole words, for which fits(prefix) holds (e.g. "its tokens
    fit the model's --max_len"), so that an attack never spends queries on words the model does
    not read. Binary search over the word count."""
    if fits(text):
        return text
    t = Text(text)
    lo, hi = 0, len(t.words)  # fits(the first lo words) holds, fits(all of them) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(text[:t.spans[mid - 1][1]]) else (lo, mid)
    return text[:t.spans[lo - 1][1]] if lo else ""


class Neighbours:
    """Candidate substitutes: the nearest whole-word entries of an input embedding table, by
    cosine. vocab: the tokens in id order (WordPiece: a word is an alphabetic entry, "##ing" is
    not; byte-level BPE: "Ġword"); table: (len(vocab), H); lowercase: the vocabulary is uncased."""

    def __init__(self, table, vocab, lowercase=True, n=50, min_cos=0.5):
        bpe = any(token.startswith("Ġ") for token in vocab)  # a word is "Ġword", else "word"
        rows, self.words = [], []
        for i, token in enumerate(vocab):
            word = token[1:] if bpe and token.startswith("Ġ") else None if bpe else token
            if word and word.isascii() and word.isalpha() and word.lower() not in STOPWORDS:
                rows.append(i)
                self.words.append(word)
        if not rows:
            raise MinknnError("the vocabulary has no whole-word entries to draw candidates from")
        self.row = {w: j for j, w in enumerate(self.words)}
        self.vectors = F.normalize(table[rows].float(), dim=1)
        self.lowercase, self.n, self.min_cos, self.cache = lowercase, n, min_cos, {}

    def __call__(self, word):
        """Up to n (candidate, cosine) pairs for word, most similar first; [] for a word that is
        not one entry of the vocabulary."""
        key = word.lower() if self.lowercase else word
        if key not in self.cache:
            j = self.row.get(key)
            if j is None:
                self.cache[key] = []
            else:
                cos = self.vectors @ self.vectors[j]
                cos[j] = -math.inf  # never the word itself
                top = cos.topk(min(self.n, len(cos) - 1))
                self.cache[key] = [(self.words[r], c) for c, r in
                                   zip(top.values.tolist(), top.indices.tolist())
                                   if c >= self.min_cos]
        return self.cache[key]


def same_case(candidate, word):
    """candidate written in word's case: "Good" -> "Fine", "GOOD" -> "FINE"."""
    if word.isupper() and len(word) > 1:
        return candidate.upper()
    return candidate[0].upper() + candidate[1:] if word[0].isupper() else candidate


def angular_similarity(u, v):
    """1 - arccos(cos(u, v)) / pi, row by row: 1 for the same direction, 0 for opposite ones."""
    cos = F.cosine_similarity(u, v, dim=-1).clamp(-1, 1)
    return 1 - torch.arccos(cos) / math.pi


class Budget(Exception):
    """The query budget is spent."""


class Oracle:
    """The attacked classifier, counting its queries: each distinct text once (TextAttack counts
    a text asked twice twice; the greedy search asks few twice)."""

    def __init__(self, classify, budget=None):
        self.classify, self.budget, self.seen = classify, budget, {}

    def __call__(self, texts):
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if self.budget is not None and len(self.seen) + len(new) > self.budget:
            raise Budget  # the step needs more queries than are left: the attack stops
        if new:
            p = self.classify(new)
            if not torch.isfinite(p).all():
                raise MinknnError("the attacked classifier returned non-finite probabilities")
            self.seen.update(zip(new, p))
        return torch.stack([self.seen[t] for t in texts])


def attack(text, label, classify, neighbours, encode, settings=Settings()):
    """One text's attack. classify: texts -> (N, C) probabilities; neighbours: word -> [(candidate,
    cosine)]; encode: texts -> (N, H) sentence vectors. Returns a dict: status (skipped: already
    misclassified; succeeded; failed), the original and perturbed texts and predictions, the
    swaps {word index: (old, new)}, the number of words and of queries."""
    t, oracle, swaps = Text(text), Oracle(classify, settings.queries), {}
    p = oracle([text])[0]
    status = "failed" if int(p.argmax()) == label else "skipped"
    if status == "failed" and t.words:
        try:
            status = search(t, label, p, oracle, neighbours, encode, settings, swaps)
        except Budget:
            pass
    return {"status": status, "label": label, "original": text, "perturbed": t.render(swaps),
            "original_prediction": int(p.argmax()),
            "perturbed_prediction": int(oracle.seen[t.render(swaps)].argmax()),
            "swaps": {i: (t.words[i], w) for i, w in sorted(swaps.items())},
            "words": len(t.words), "queries": len(oracle.seen)}


def ranked(t, label, p, oracle):
    """1. The words that may be swapped (not stopwords), most important first: importance = how
    much deleting the word lowers p(y); ties in text order. Stopwords are not deleted, as their
    rank is never used (TextAttack ranks only the words it may modify)."""
    free = [i for i, w in enumerate(t.words) if w.lower() not in STOPWORDS]
    if not free:
        return []
    drop = p[label] - oracle([t.render({i: ""}) for i in free])[:, label]
    return [free[j] for j in torch.argsort(drop, descending=True, stable=True).tolist()]


def search(t, label, p, oracle, neighbours, encode, s, swaps):
    """The greedy search (the module docstring, steps 1 and 2) from the text t, whose
    probabilities are p; fills swaps {word index: new word} and returns succeeded or failed."""
    n, current = len(t.words), p[label]  # current: p(y) of the text with the swaps kept so far
    cap = math.ceil(s.max_share * n)  # words that may change (TextAttack rounds up)
    for i in ranked(t, label, p, oracle):  # 2. the words, most important first
        if len(swaps) + 1 > cap:
            break
        options = [same_case(c, t.words[i]) for c, _ in neighbours(t.words[i])]
        options = [c for c in options if c != t.words[i]]
        if not options:
            continue
        if n >= s.window:  # meaning: the window before this swap against each after it
            before = t.window(swaps, i, s.window)
            after = [t.window({**swaps, i: c}, i, s.window) for c in options]
            vectors = encode([before] + after)
            meaning = angular_similarity(vectors[:1], vectors[1:])
        else:  # shorter than the window: no meaning check (TextAttack's)
            meaning = torch.ones(len(options))
        keep = (meaning >= s.min_meaning).nonzero().flatten().tolist()
        if not keep:
            continue
        options, meaning = [options[j] for j in keep], meaning[keep]
        probs = oracle([t.render({**swaps, i: c}) for c in options])
        order = torch.argsort(probs[:, label], stable=True)  # lowest p(y) first
        if probs[order[0], label] >= current:
            continue  # no swap of this word lowers p(y): on to the next word
        flips = probs[order].argmax(1) != label
        if not flips[0]:  # keep the swap that lowers p(y) most
            swaps[i], current = options[order[0]], probs[order[0], label]
            continue
        # success. Of the swaps that flip and lower p(y) most (the first ones in that order,
        # TextAttack's choice), keep the closest in meaning
        lead = order[:int(flips.int().cumprod(0).sum())]
        swaps[i] = options[int(lead[meaning[lead].argmax()])]
        return "succeeded"
    return "failed"


WORDNET_FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "s": "data.adj",
                 "r": "data.adv"}


def read_wordnet(folder):
    """(synonyms, antonyms) of WordNet's data files in folder (WordNet's $WNSEARCHDIR; Debian's
    wordnet-base installs them in /usr/share/wordnet), single words only: synonyms maps a word to
    the other words of every synset it is in, in file order; antonyms is the set of (word,
    antonym) pairs, both ways, of the direct antonyms ("!" pointers). A line of data.adj:
        00001740 00 a 01 able 0 005 ... ! 00002098 a 0101 | gloss
    offset, lexicographer file, part of speech, word count (hex), (word, lex id) each, pointer
    count, then (symbol, target offset, target pos, source and target word numbers in hex) each."""
    synsets, links, synonyms = {}, [], {}
    for file in sorted(set(WORDNET_FILES.values())):
        with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(" "):
                    continue  # the licence at the top
                fields = line.split("|")[0].split()
                n = int(fields[3], 16)
                words = [re.sub(r"\(.*\)$", "", w).lower() for w in fields[4:4 + 2 * n:2]]
                synsets[file, fields[0]] = words
                single = [w for w in words if w.isalpha()]
                for w in single:
                    synonyms.setdefault(w, []).extend(o for o in single if o != w)
                at = 4 + 2 * n
                for k in range(int(fields[at])):
                    symbol, offset, pos, st = fields[at + 1 + 4 * k:at + 5 + 4 * k]
                    if symbol == "!":
                        links.append((words[int(st[:2], 16) - 1], WORDNET_FILES[pos], offset,
                                      int(st[2:], 16) - 1))
    antonyms = set()
    for word, file, offset, j in links:
        other = synsets[file, offset][j]
        if word.isalpha() and other.isalpha():
            antonyms.update({(word, other), (other, word)})
    return {w: list(dict.fromkeys(o)) for w, o in synonyms.items()}, antonyms


class Synonyms:
    """Candidate substitutes from WordNet (read_wordnet's synonyms): up to n words that share a
    synset with the word, in WordNet's file order, each with cosine 1 (no embedding to measure
    it in). PWWS's source (Ren et al. 2019); WordNet's synsets hold no antonyms."""

    def __init__(self, synonyms, n=50):
        self.synonyms, self.n = synonyms, n

    def __call__(self, word):
        return [(w, 1.0) for w in self.synonyms.get(word.lower(), [])[:self.n]
                if w not in STOPWORDS]


def summary(results):
    """TextAttack's attack summary of a list of attack() results: counts, and figures in %."""
    status = [r["status"] for r in results]
    ok, failed, skipped = (status.count(k) for k in ("succeeded", "failed", "skipped"))
    n, attacked = len(results), [r for r in results if r["status"] != "skipped"]
    won = [r for r in results if r["status"] == "succeeded"]

    def mean(xs, scale=1):  # None: a mean of nothing (not_available says why); JSON's null,
        return scale * sum(xs) / len(xs) if xs else None  # not NaN
    return {"n": n, "succeeded": ok, "failed": failed, "skipped": skipped,
            "original_accuracy": 100 * (n - skipped) / n if n else None,
            "accuracy_under_attack": 100 * failed / n if n else None,
            "attack_success_rate": mean([r["status"] == "succeeded" for r in attacked], 100),
            "perturbed_word_share": mean([len(r["swaps"]) / r["words"] for r in won], 100),
            "words_per_input": mean([r["words"] for r in results]),
            "queries": mean([r["queries"] for r in attacked])}


def not_available(summary, field):
    """Why summary()'s field is None: the examples it would be a mean over are none."""
    if not summary["n"]:
        return "no example was drawn"
    if summary["n"] == summary["skipped"]:
        return "no example was classified correctly, so there is nothing to attack"
    return "no attack succeeded"


# --- what main() plugs in: the meaning encoder, the candidates, a resumable run ---

def sentence_encoder(path="minilm", device="cpu", batch_size=64):
    """(encode, neighbours' inputs) of a pretrained model folder ('minilm': all-MiniLM-L6-v2, a
    sentence-similarity model): encode(texts) -> (N, H) mean-pooled last hidden states, frozen;
    and its input embedding table with its vocabulary and case, for Neighbours."""
    bert = backbones.from_pretrained(path).to(device).eval()
    # a window of 15 words is far shorter than 128 tokens
    tokenizer = Tokenizer.from_folder(resolve_model_path(path), min(128, bert.config.max_tokens))

    @torch.inference_mode()
    def encode(texts):
        vectors = []
        for i in range(0, len(texts), batch_size):
            batch = {k: v.to(device) for k, v in tokenizer(texts[i:i + batch_size]).items()}
            vectors.append(pool(bert(**batch), batch["attention_mask"], "mean").float().cpu())
        return torch.cat(vectors)
    table = bert.embeddings.word_embeddings.weight.detach().cpu()
    return encode, (table, tokenizer.vocab, tokenizer.lowercase)
STATUSES = ("succeeded", "failed", "skipped")
COLUMNS = ["id", "status", "label", "original_prediction", "perturbed_prediction", "words",
           "swapped", "queries", "swaps", "original", "perturbed"]


def read_done(path):
    """The rows of an attack CSV that a killed run left, as dicts. A last row the kill cut short
    (no newline at its end) is dropped and the file rewritten without it."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text)))
    if rows and rows[0] != COLUMNS:
        raise MinknnError(f"{path}: not an attack CSV of this minknn (its header is not "
                          f"{','.join(COLUMNS)}); give --out another file")
    good = [r for r in rows[1:] if len(r) == len(COLUMNS) and r[1] in STATUSES]
    if rows and not text.endswith("\n"):
        good = good[:len(rows) - 2]  # the last row is cut short, even if it parses
    if len(good) < len(rows) - 1 or not rows:
        write_rows(path, good, mode="w")
    return [dict(zip(COLUMNS, r)) for r in good]


def write_rows(path, rows, mode="a"):
    """Appends rows (lists of COLUMNS' values) to path, header first when it is new; each row is
    on disk (flushed and fsynced) before the next example starts."""
    new = mode == "w" or not os.path.exists(path)
    text = io.StringIO()
    w = csv.writer(text)
    if new:
        w.writerow(COLUMNS)
    w.writerows(rows)
    if mode == "w":
        atomic_save(text.getvalue(), path, lambda s, f: f.write(s.encode()))
        return
    with open(path, "a", newline="", encoding="utf-8") as f:
        f.write(text.getvalue())
        f.flush()
        os.fsync(f.fileno())


def run_attack(examples, labels, classify, neighbours, encode, settings, path, names,
               antonyms=None):
    """Attacks each example (ids and texts; labels: their class indices) and appends its row to
    the CSV at path; examples already in it (a killed run's, or another draw's) are not attacked
    again, and its rows of other examples are kept. names: the classes' names. Returns summary()
    of the examples' rows; with antonyms (read_wordnet()[1]), also the share of the successful
    attacks that swapped a word for an antonym, in %."""
    done = read_done(path)
    ids = {row["id"] for row in done}
    todo = [(e, y) for e, y in zip(examples, labels) if e.id not in ids]
    bar = progress_bar(todo, desc="attack", initial=len(examples) - len(todo), total=len(examples))
    for example, label in bar:
        r = attack(example.text, label, classify, neighbours, encode, settings)
        swaps = "; ".join(f"{i}:{old}>{new}" for i, (old, new) in r["swaps"].items())
        row = [example.id, r["status"], names[label], names[r["original_prediction"]],
               names[r["perturbed_prediction"]], r["words"], len(r["swaps"]), r["queries"],
               swaps, r["original"], r["perturbed"]]
        write_rows(path, [row])
        done.append(dict(zip(COLUMNS, map(str, row))))
        bar.set_postfix(succeeded=sum(d["status"] == "succeeded" for d in done))
    asked = {e.id for e in examples}
    done = [d for d in done if d["id"] in asked]
    result = summary([{"status": d["status"], "words": int(d["words"]),
                       "queries": int(d["queries"]), "swaps": range(int(d["swapped"]))}
                      for d in done])
    if antonyms is not None:
        won = [[pair.split(":", 1)[1].lower().split(">") for pair in d["swaps"].split("; ")]
               for d in done if d["status"] == "succeeded"]
        hit = [any(tuple(pair) in antonyms for pair in swaps) for swaps in won]
        result["antonym_attacks"] = 100 * sum(hit) / len(hit) if hit else None
    return result


# ---------------------------------------------------------------------------------------------
# python -m minknn.lab.attack: the attack on one inference rule of a trained run

def get_args(argv=None):
    p = evaluate.make_parser(__doc__.split("\n")[0], rules=False)
    g = p.add_argument_group("attack")
    g.add_argument("--attack", required=True, choices=RULES, help="attack this rule's "
                   "predictions with word substitutions: the model (its head), proxy inference, "
                   "the model mixed with kNN at --phi, or kNN alone")
    g.add_argument("--attack_n", type=int, default=300, help="examples attacked, a fixed draw")
    g.add_argument("--attack_queries", type=int, help="query budget per example (default: none)")
    g.add_argument("--attack_candidates", default="embedding", choices=["embedding", "wordnet"],
                   help="each word's substitutes: the nearest words of --attack_encoder's input "
                   "embedding table, or WordNet's synonyms ($WNSEARCHDIR, else "
                   "/usr/share/wordnet: Debian's wordnet-base)")
    g.add_argument("--attack_encoder", default="minilm", help="the sentence encoder of the "
                   "meaning constraint and the candidates' embedding table: 'minilm' or a model "
                   "folder")
    args = p.parse_args(argv)
    args.knn, args.proxy = args.attack in ("knn", "knn-only"), args.attack == "proxy"
    check_rule_flags(p, args, args.knn, ["attack_n", "attack_queries"],
                              "attack --attack knn or knn-only")
    if args.knn and args.split == "train":
        p.error("--attack knn on --split train: each example would find itself in the datastore; "
                "attack --split dev or test")
    return args


def rule_classifier(args, model, losses, tokenizer, task, device, datastore):
    """The attacked classifier, a black box: texts -> (N, C) probabilities of --attack's rule
    (minknn/inference.py rule_answers, as evaluate.py scores it)."""
    def classify(texts):
        examples = [Example(text=t) for t in texts]
        return rule_answers(model, tokenizer, task, examples, args, device, losses[task.name],
                            [args.attack], datastore)[0][args.attack]
    return classify


def attack_settings(args, ckpt, task, key, knn):
    """(the attack's CSV, its .json report, the settings it runs with): a killed attack resumes
    only with the settings it started with, but --attack_n may change (the examples done, by
    id, are kept)."""
    rule, s = args.attack, knn_settings(args, task)
    name = {"model": "model", "proxy": f"proxy-alpha{args.proxy_alpha}",
            "knn": f"knn-phi{s.phi}-k{s.k}", "knn-only": f"knn-only-k{s.k}"}[rule]
    path = args.out or os.path.join(os.path.dirname(ckpt["file"]),
                                    f"attack-{args.split}-{args.attack_candidates}-{name}.csv")
    report = os.path.splitext(path)[0] + ".json"
    # the checkpoint by its bytes' sha256, which survives a move or a copy of the run; its path
    # is kept for the reader, not compared
    asked = {"checkpoint": os.path.abspath(ckpt["file"]),
             "checkpoint_sha256": file_sha256(ckpt["file"]), "split": args.split, "rule": rule,
             "attack_n": args.attack_n, "encoder": args.attack_encoder,
             "candidates": args.attack_candidates,
             "attack": dataclasses.asdict(Settings(queries=args.attack_queries)),
             **({"k": s.k, "vote": s.vote, "temperature": s.temperature, "key": key,
                 **({"phi": s.phi} if rule == "knn" else {})} if knn else {}),
             **({"proxy_alpha": args.proxy_alpha} if rule == "proxy" else {})}
    if os.path.exists(path):
        check_same_attack(path, report, asked)
    return path, report, asked, name


def check_same_attack(path, report, asked):
    """An existing CSV at the attack's path is resumed only when it is an attack's output (its
    header), its settings file is beside it, and that holds these settings (asked), --attack_n
    aside; else one line on which of the three is wrong."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), None)
    if header != COLUMNS:
        raise MinknnError(f"--attack: {path} is not an attack's output (its first line is not "
                          f"the header {','.join(COLUMNS)}); give --out another file")
    if not os.path.exists(report):
        raise MinknnError(f"--attack: {path} is an attack's output, but its settings file "
                          f"{report} is missing, so it cannot be told which run and rule its "
                          f"rows attacked; put that file back, or give --out another file (or "
                          f"delete {path} to attack again)")
    saved = read_json(report)
    saved = saved.get("settings") if isinstance(saved, dict) else None
    if not isinstance(saved, dict):
        raise MinknnError(f"--attack: {report} holds no \"settings\" object (was it edited?); "
                          f"put the attack's own back, or give --out another file")
    # an attack saved before the checkpoint's sha256 was: its checkpoint by path, as then
    same_place = "checkpoint_sha256" not in saved and saved.get("checkpoint") == asked["checkpoint"]
    ignored = {"checkpoint", "attack_n"} | ({"checkpoint_sha256"} if same_place else set())
    differ = [f"{k} {json.dumps(saved.get(k))}, not {json.dumps(asked.get(k))}"
              for k in sorted(set(saved) | set(asked))
              if k not in ignored and saved.get(k) != asked.get(k)]
    if differ:
        raise MinknnError(f"--attack: {path} holds an attack with other settings ({report}: "
                          f"{'; '.join(differ)}); give --out another file")


def main(argv=None):
    args = get_args(argv)
    ckpt, model, losses, tokenizer, tasks, knn_tasks, device = load_run(  # as evaluate.py does
        args, args.proxy, args.knn, lambda ckpt: evaluate.predictions_base(args, ckpt))
    task = tasks[0]
    if len(tasks) > 1 or task.kind != "classify" or task.pair:
        what = f"{len(tasks)} tasks" if len(tasks) > 1 else \
            f"a {'pair' if task.pair else task.kind} task"
        raise MinknnError(f"--attack swaps words of single texts of a one-task classification "
                          f"run; this run has {what}")
    examples, _, train = read_task_data(args, ckpt, task, task in knn_tasks, args.attack_n,
                                        "--attack_n")
    if not labelled(examples):
        raise MinknnError(f"--attack needs the gold classes, and the {task.name} {args.split} "
                          f"split has no labels; use --split dev (or test where it has labels)")
    key = model.knn_key(args.knn_key)
    path, report, asked, name = attack_settings(args, ckpt, task, key, train is not None)
    # WordNet's data: the synonyms of --attack_candidates wordnet, and, where it is installed,
    # how many successful attacks swapped a word for one of its antonyms
    wordnet = os.environ.get("WNSEARCHDIR", "/usr/share/wordnet")
    found = os.path.exists(os.path.join(wordnet, "data.adj"))
    if args.attack_candidates == "wordnet" and not found:
        raise MinknnError(f"--attack_candidates wordnet: no WordNet data in {wordnet} (install "
                          f"Debian's wordnet-base, or set WNSEARCHDIR to a folder with data.adj)")
    write_json(report, {"settings": asked, "summary": None})
    datastore = None if train is None else \
        run_datastore(args, ckpt, model, tokenizer, task, train, key, device)[0]
    synonyms, antonyms = read_wordnet(wordnet) if found else (None, None)
    settings = Settings(queries=args.attack_queries)
    encode, (table, vocab, lowercase) = sentence_encoder(args.attack_encoder, device)
    neighbours = Synonyms(synonyms, settings.candidates) if args.attack_candidates == "wordnet" \
        else Neighbours(table, vocab, lowercase, settings.candidates, settings.min_cos)

    def fits(text):  # all its tokens inside the run's --max_len
        return len(tokenizer.encode([text])[0][0]) < tokenizer.max_len
    examples = [dataclasses.replace(e, text=cut_to_fit(e.text, fits), id=e.id or str(i))
                for i, e in enumerate(examples)]
    labels = kind_of(task).gold(task, examples).tolist()
    classify = rule_classifier(args, model, losses, tokenizer, task, device, datastore)
    start = time.time()
    summary = run_attack(examples, labels, classify, neighbours, encode, settings, path,
                         task.labels, antonyms)
    summary["seconds"] = round(time.time() - start, 1)
    write_json(report, {"settings": asked, "summary": summary, "csv": path})
    print(f"{task.name} {args.split}, attack on {args.attack} ({name}), {summary['n']} examples:")
    for label, field, unit in REPORT:
        if field not in summary:
            continue
        value = summary[field]
        if value is None:  # a mean of nothing: say why, not nan%
            print(f"  {label:<32} n/a ({not_available(summary, field)})")
        else:
            print(f"  {label:<32} {value:.2f}{unit}" if isinstance(value, float)
                  else f"  {label:<32} {value}")
    print(f"every example in {path}; the summary in {report}")
    return summary


REPORT = [("successful attacks", "succeeded", ""), ("failed attacks", "failed", ""),
          ("skipped attacks (already wrong)", "skipped", ""),
          ("original accuracy", "original_accuracy", "%"),
          ("accuracy under attack", "accuracy_under_attack", "%"),
          ("attack success rate", "attack_success_rate", "%"),
          ("average perturbed word share", "perturbed_word_share", "%"),
          ("average words per input", "words_per_input", ""),
          ("average queries", "queries", ""),
          ("successful, with a WordNet antonym", "antonym_attacks", "%")]


if __name__ == "__main__":
    run(main)
