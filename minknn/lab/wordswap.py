"""The word-substitution attack itself, in TextFooler's shape (Jin et al. 2020, "Is BERT Really
Robust?"), written out and offline: KNN-BERT's robustness test (Li et al., sec. 4.6, Table 4).
python -m minknn.lab.attack (minknn/lab/attack.py) runs it on a trained run.

The attacked classifier is a black box: classify(texts) -> (N, C) probabilities, any inference
rule of a trained run (minknn/tools/inference.py; --attack model, proxy, knn or knn-only; main()
in attack.py builds it from evaluate.py's flags, read as evaluate.py reads them). The goal is
untargeted: any class but the gold one. For one correctly classified text of n words
(TextAttack's recipe textfooler_jin_2019, its GreedyWordSwapWIR with wir_method "delete"):

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
TextAttack's figures (attack.py's run_attack writes a resumable CSV of every example).
"""
import math
import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minknn import MinknnError

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
