"""minknn/lab/attack.py: the word-substitution attack, on hand-made classifiers whose right answer is
known, then python -m minknn.lab.attack end to end on a tiny run."""
import csv
import json
import math
import os

import pytest
import torch

import evaluate
import train
from helpers import DATA
from minknn import MinknnError, backbones
from minknn.lab.attack import main as attack_main
from minknn.lab.attack import COLUMNS, read_done, run_attack, sentence_encoder, write_rows
from minknn.lab.wordswap import (STOPWORDS, Neighbours, Oracle, Settings, Synonyms, Text,
                                 angular_similarity, attack, cut_to_fit, ranked, read_wordnet,
                                 summary)
from minknn.model import pool
from minknn.tasks.data import Example, load_split
from minknn.tasks.registry import TASKS
from minknn.tokenizer import Tokenizer

POSITIVE = "great"  # the word the hand-made classifiers key on


def keyed(texts, word=POSITIVE):
    """Class 1 (p 0.9) when `word` is in the text, else class 0 (p(1) 0.2)."""
    return torch.tensor([[0.1, 0.9] if word in t.lower().split() else [0.8, 0.2] for t in texts])


def table(words):
    """neighbours: each word of `words` -> its list of (candidate, cosine)."""
    return lambda word: words.get(word.lower(), [])


def same_meaning(texts):  # a sentence encoder that finds every window the same
    return torch.ones(len(texts), 4)


def logged(classify):
    """classify, and the list of every text it was asked about, in order."""
    asked = []

    def wrapped(texts):
        asked.extend(texts)
        return classify(texts)
    return wrapped, asked


def test_text_swaps_and_deletes_words_and_keeps_what_lies_between_them():
    t = Text("  What a GREAT film, isn't it?! ")
    assert t.words == ["What", "a", "GREAT", "film", "isn't", "it"], t.words
    assert t.render() == t.text
    assert t.render({2: "fine"}) == "  What a fine film, isn't it?! ", "render: a swap"
    assert t.render({3: ""}) == "  What a GREAT , isn't it?! ", "render: a deletion"
    assert t.window({}, 0, 3) == "What a GREAT", "window at the start: moved inward"
    assert t.window({}, 5, 3) == "film, isn't it", "window at the end: moved inward"
    assert t.window({3: "movie"}, 3, 3) == "GREAT movie, isn't", "window: centred, swaps applied"
    assert cut_to_fit("one two, three four", lambda s: len(s.split()) <= 2) == "one two,"[:-1]


def test_importance_ranks_the_word_the_classifier_keys_on_first():
    """Deleting "great" drops p(1) from 0.9 to 0.2; deleting any other word drops nothing. A rank
    sorted ascending, or by p(y) after deletion the wrong way round, puts it last. Stopwords
    (the, was, and) are never swapped, so never ranked: no query is spent deleting them."""
    t = Text("the plot was great and long")
    p = keyed([t.text])[0]
    classify, asked = logged(keyed)
    order = ranked(t, 1, p, Oracle(classify))
    assert order == [3, 1, 5], f"'great' (index 3) first, then ties in text order; got {order}"
    assert len(asked) == 3, f"one deletion per word that is not a stopword (3), asked {asked}"

    def graded(texts):  # p(1) falls by 0.1 per missing word of "plot great long", graded
        weight = {"plot": 0.05, "great": 0.3, "long": 0.1}
        p1 = [0.5 + sum(w for word, w in weight.items() if word in text.split()) for text in texts]
        return torch.tensor([[1 - q, q] for q in p1])
    order = ranked(t, 1, graded([t.text])[0], Oracle(graded))
    assert order == [3, 5, 1], f"by the drop of p(y), largest first: great, long, plot; got {order}"


def test_the_attack_finds_the_key_word_and_swaps_it():
    text = "What a Great film it was, truly"
    r = attack(text, 1, keyed, table({"great": [("fine", 0.9)]}), same_meaning)
    assert r["status"] == "succeeded", r
    assert r["perturbed"] == "What a Fine film it was, truly", f"one swap, case kept: {r['perturbed']}"
    assert r["swaps"] == {2: ("Great", "Fine")}, r["swaps"]
    assert (r["original_prediction"], r["perturbed_prediction"]) == (1, 0), r
    # 1 original + 3 deletions (Great, film, truly; the rest are stopwords) + 1 candidate
    assert r["queries"] == 5, f"queries: {r['queries']}"


def test_of_the_swaps_that_flip_the_most_meaning_preserving_is_kept():
    text = "a great film " + " ".join(f"w{i}" for i in range(15))  # longer than the window

    def encode(texts):  # "fine" keeps the meaning better than "okay"
        return torch.tensor([[1.0, 0.3 if "okay" in t else 0.1 if "fine" in t else 0.0] for t in texts])
    r = attack(text, 1, keyed, table({"great": [("okay", 0.9), ("fine", 0.8)]}), encode)
    assert r["swaps"] == {1: ("great", "fine")}, f"both flip; 'fine' is closer in meaning: {r['swaps']}"


def test_a_swap_below_the_meaning_threshold_is_rejected():
    """The encoder finds "bad" far from the window before the swap: the swap is refused, though it
    would flip the prediction. Checked on the wrong text (the window after the swap against
    itself), every swap would pass."""
    words = ["the", "great", "film"] + [f"x{i}" for i in range(14)]
    text = " ".join(words)

    def encode(texts):
        return torch.tensor([[0.0, 1.0] if "bad" in t.split() else [1.0, 0.0] for t in texts])
    neighbours = table({"great": [("bad", 0.9)]})
    r = attack(text, 1, keyed, neighbours, encode)
    assert r["status"] == "failed" and not r["swaps"], f"a 90-degree meaning change passed: {r}"
    # the same swap on a text shorter than the window skips the meaning check (TextAttack's)
    r = attack("the great film", 1, keyed, neighbours, encode, Settings(max_share=1))
    assert r["status"] == "succeeded", r
    assert angular_similarity(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])).item() == \
        pytest.approx(0.5), "angular similarity of orthogonal vectors is 1 - (pi/2)/pi"
    assert Settings().min_meaning == pytest.approx(1 - 0.5 / math.pi)


def test_never_a_stopword_never_a_word_twice_never_more_than_the_allowed_share():
    """A classifier that each swap moves a little but never flips: the attack swaps until the cap,
    ceil(0.3 x 21) = 7 words (TextAttack rounds up). Each call for a word's candidates gives new
    names ("movie1x", then "movie2x"), so a word visited twice shows in the texts asked about."""
    words = ["this", "movie", "is", "not", "nice", "but", "the", "actors", "were", "really",
             "great", "and", "story", "was", "fun", "a", "lot", "overall", "for", "me", "today"]
    text = " ".join(words)
    original = set(words)

    def stubborn(texts):  # p(1) = 0.6 + 0.3 * the share of the original words still there
        p1 = [0.6 + 0.3 * len(original & set(t.split())) / len(original) for t in texts]
        return torch.tensor([[1 - q, q] for q in p1])
    calls = {}

    def anything(word):
        calls[word] = calls.get(word, 0) + 1
        return [(f"{word}{calls[word]}x", 0.9), (f"{word}{calls[word]}y", 0.8)]
    classify, asked = logged(stubborn)
    r = attack(text, 1, classify, anything, same_meaning, Settings(max_share=0.3))
    assert r["status"] == "failed", r
    assert len(r["swaps"]) == 7, f"up to ceil(0.3 x 21) = 7 words should change; swapped {r['swaps']}"
    for t in asked:
        tw = t.split()
        if len(tw) != len(words):
            continue  # a deletion of the importance step
        changed = [i for i, (a, b) in enumerate(zip(words, tw)) if a != b]
        assert len(changed) <= 7, f"asked about a text with {len(changed)} words changed > 7: {t}"
        assert not [words[i] for i in changed if words[i] in STOPWORDS], f"a stopword was swapped: {t}"
        assert all(tw[i][len(words[i]):-1] == "1" for i in changed), f"a word swapped twice: {t}"
    # with no cap, every word is swapped once and none is tried again
    calls.clear()
    classify, asked = logged(stubborn)
    r = attack(text, 1, classify, anything, same_meaning, Settings(max_share=1))
    assert len(r["swaps"]) == 10 and set(calls.values()) == {1}, \
        f"each of the 10 words that are not stopwords should be tried once: {calls}"


def test_a_short_text_keeps_the_flip_that_lowers_the_gold_class_most():
    """Under 15 words every candidate passes the meaning check with similarity 1, so of the swaps
    that flip, the one with the lowest p(y) is kept (TextAttack's order)."""
    def classify(texts):
        p1 = [0.9 if "great" in t else 0.4 if "okay" in t else 0.1 if "fine" in t else 0.5 for t in texts]
        return torch.tensor([[1 - q, q] for q in p1])
    r = attack("a great film", 1, classify, table({"great": [("okay", 0.9), ("fine", 0.8)]}),
               same_meaning, Settings(max_share=1))
    assert r["swaps"] == {1: ("great", "fine")}, f"both flip; 'fine' lowers p(y) most: {r['swaps']}"


def test_with_three_classes_a_flip_counts_only_if_it_lowers_the_gold_class_most():
    """Swap A flips the prediction to class 2 but leaves p(y) at 0.45; swap B lowers p(y) to 0.35
    without flipping. TextAttack keeps B (the lowest p(y)) and goes on; with no other word to swap,
    the attack fails."""
    def classify(texts):
        rows = {"great": [0.1, 0.8, 0.1], "alpha": [0.05, 0.45, 0.5], "beta": [0.33, 0.35, 0.32]}
        return torch.tensor([next((v for k, v in rows.items() if k in t), [0.4, 0.3, 0.3])
                             for t in texts])  # the last: "great" deleted
    r = attack("great", 1, classify, table({"great": [("alpha", 0.9), ("beta", 0.8)]}), same_meaning)
    assert r["status"] == "failed" and r["swaps"] == {0: ("great", "beta")}, r


def test_a_classifier_that_ignores_its_input_is_never_fooled():
    blind = lambda texts: torch.tensor([[0.3, 0.7]]).expand(len(texts), 2)
    texts = ["a great film", "the worst plot ever written", "fine", "...", "", "the and of"]
    for text in texts:
        r = attack(text, 1, blind, lambda w: [("bad", 0.9), ("awful", 0.8)], same_meaning)
        assert r["status"] == "failed" and not r["swaps"], f"an input-blind classifier fooled: {r}"
    assert attack("a great film", 0, blind, lambda w: [], same_meaning)["status"] == "skipped", \
        "an example already misclassified is skipped, not attacked"


def random_classifier(seed):
    """A deterministic classifier of the words' hashes: class scores from a fixed random table."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(512, 3, generator=g)

    def classify(texts):
        rows = [sum((weights[sum(map(ord, w)) % 512] for w in t.split()), torch.zeros(3)) for t in texts]
        return torch.softmax(torch.stack(rows), 1)
    return classify


def test_the_same_inputs_give_the_same_attacks():
    classify = random_classifier(0)
    neighbours = lambda w: [(w[::-1], 0.9), (w + "s", 0.8), ("z" + w, 0.7)]
    texts = ["one film about two brothers", "a slow and boring tale of three cities", "fun"]
    runs = [[attack(t, int(classify([t])[0].argmax()), classify, neighbours, same_meaning,
                    Settings(max_share=1)) for t in texts] for _ in range(2)]
    assert runs[0] == runs[1], "two attacks of the same inputs differ"
    assert any(r["status"] == "succeeded" for r in runs[0]), "the premise: some attack succeeds"


def test_the_query_budget_stops_an_attack():
    """The attack needs 5 queries (the original, 3 deletions, 1 candidate): a budget of 5 lets
    it succeed, a budget of 4 stops it after the ranking, with 4 spent."""
    def run(budget):
        return attack("What a Great film it was, truly", 1, keyed, table({"great": [("fine", 0.9)]}),
                      same_meaning, Settings(queries=budget))
    assert (run(5)["status"], run(5)["queries"]) == ("succeeded", 5), run(5)
    assert (run(4)["status"], run(4)["queries"]) == ("failed", 4), run(4)


def test_neighbours_are_whole_words_by_cosine_without_stopwords_or_the_word_itself():
    vocab = ["[PAD]", "[unused0]", "good", "fine", "##ly", "the", "bad", "nice", "2010", "ok"]
    rows = {"good": [1, 0], "fine": [0.9, 0.1], "##ly": [1, 0], "the": [1, 0], "bad": [-1, 0],
            "nice": [0.6, 0.8], "2010": [1, 0], "ok": [0.8, 0.6]}
    t = torch.tensor([rows.get(w, [0.0, 1.0]) for w in vocab])
    found = Neighbours(t, vocab, n=3, min_cos=0.5)("Good")
    names = [w for w, _ in found]
    assert names == ["fine", "ok", "nice"], f"by cosine, whole words, no stopword, not 'good': {names}"
    assert all(c >= 0.5 for _, c in found)
    assert Neighbours(t, vocab, n=3, min_cos=0.7)("good") == found[:2], "min_cos cuts 'nice' (0.6)"
    assert Neighbours(t, vocab)("unknownword") == [], "a word outside the vocabulary has none"
    bpe = ["<s>", "Ġgood", "Ġfine", "fine", "Ġthe"]
    found = Neighbours(torch.tensor([[0, 1], [1, 0], [1, 0.1], [1, 0], [1, 0]]), bpe, lowercase=False)("good")
    assert [w for w, _ in found] == ["fine"], f"BPE: 'Ġfine' is a word, 'fine' a piece: {found}"


def test_summary_follows_textattack():
    results = [{"status": "succeeded", "swaps": {0: 1}, "words": 10, "queries": 20},
               {"status": "succeeded", "swaps": {0: 1, 1: 1}, "words": 5, "queries": 30},
               {"status": "failed", "swaps": {}, "words": 5, "queries": 40},
               {"status": "skipped", "swaps": {}, "words": 20, "queries": 1}]
    s = summary(results)
    expected = {"n": 4, "succeeded": 2, "failed": 1, "skipped": 1, "original_accuracy": 75.0,
                "accuracy_under_attack": 25.0, "attack_success_rate": 100 * 2 / 3,
                "perturbed_word_share": 100 * (0.1 + 0.4) / 2, "words_per_input": 10.0,
                "queries": 30.0}
    for k, v in expected.items():
        assert s[k] == pytest.approx(v), f"summary's {k}: {s[k]}, expected {v}"


def test_a_killed_attack_resumes_without_redoing_examples(tmp_path):
    examples = [Example(text=t, id=f"e{i}") for i, t in
                enumerate(["a great film", "great acting", "dull", "great fun", "great plot"])]
    labels = [1, 1, 1, 1, 1]
    path = str(tmp_path / "attack.csv")
    neighbours = table({"great": [("fine", 0.9)]})

    def dies_after(n):
        count = {"originals": 0}

        def classify(texts):
            count["originals"] += any(t in {e.text for e in examples} for t in texts)
            if count["originals"] > n:
                raise KeyboardInterrupt
            return keyed(texts)
        return classify
    with pytest.raises(KeyboardInterrupt):
        run_attack(examples, labels, dies_after(2), neighbours, same_meaning, Settings(max_share=1),
                   path, ["neg", "pos"])
    assert [r["id"] for r in read_done(path)] == ["e0", "e1"], "the rows written before the kill"
    with open(path, "a") as f:  # a row cut short by the kill, inside its last field
        f.write('e2,succeeded,pos,pos,neg,2,1,3,1:dull>x,dull,du')
    classify, asked = logged(keyed)
    s = run_attack(examples, labels, classify, neighbours, same_meaning, Settings(max_share=1),
                   path, ["neg", "pos"])
    redone = {e.id for e in examples[:2] if e.text in asked}
    assert not redone, f"examples done before the kill were attacked again: {redone}"
    rows = read_done(path)
    assert [r["id"] for r in rows] == ["e0", "e1", "e2", "e3", "e4"], "each example once, in order"
    assert (s["n"], s["succeeded"], s["skipped"]) == (5, 4, 1), s
    with open(path, newline="") as f:
        assert next(csv.reader(f)) == COLUMNS
    assert rows[2]["perturbed"] == "dull", f"the cut row was kept or merged: {rows[2]}"


# --- python -m minknn.lab.attack on a tiny run --------------------------------------------

@pytest.fixture(scope="module")
def knn_run(tmp_path_factory, tiny_bert_dir):
    out = tmp_path_factory.mktemp("attack") / "run"
    train.main(["--task", "sst", "--loss", "knnbert", "--model", tiny_bert_dir, "--data_dir", DATA,
                "--out", str(out), "--epochs", "1", "--batch_size", "8", "--max_len", "32",
                "--device", "cpu", "--queue_size", "16"])
    return str(out)


def attack_flags(run, data_dir, tiny_bert_dir, *more):
    return ["--checkpoint", run, "--data_dir", data_dir, "--device", "cpu", "--attack_encoder",
            tiny_bert_dir, *more]


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet"])
def test_the_attacks_sentence_encoder_on_each_backbone(kind, request):
    """--attack_encoder may be any backbone's folder: its mean-pooled last hidden states, frozen,
    and its own input embedding table and vocabulary for the neighbours."""
    folder = request.getfixturevalue(f"tiny_{kind}_dir")
    encode, (table, vocab, _) = sentence_encoder(folder)
    texts = ["a great film", "not a good film at all"]
    bert = backbones.from_pretrained(folder).eval()
    batch = Tokenizer.from_folder(folder, 32)(texts)
    with torch.no_grad():
        want = pool(bert(**batch), batch["attention_mask"], "mean")
    torch.testing.assert_close(encode(texts), want, msg=lambda m: f"{kind}: the sentence encoder's "
                               f"vectors are not the mean-pooled hidden states: {m}")
    assert table.shape == (bert.config.vocab_size, bert.config.hidden_size) and \
        vocab == Tokenizer.from_folder(folder, 32).vocab, f"{kind}: the neighbours' table or vocabulary"


def test_evaluate_attack_queries_the_rule_it_names(knn_run, data_dir, tiny_bert_dir, tmp_path):
    """The originals' predictions in the attack CSV are the rule's, as evaluate.py --knn writes
    them: a classifier that bypassed the kNN vote for the head would give the head's."""
    scored = evaluate.main(["--checkpoint", knn_run, "--data_dir", data_dir, "--device", "cpu",
                            "--knn", "--k", "4", "--out", str(tmp_path / "p.csv")])["sst"]
    def read(path):
        with open(path, newline="") as f:
            return {r["id"]: r["prediction_name"] for r in csv.DictReader(f)}
    head, knn_only = read(tmp_path / "p.csv"), read(tmp_path / "p-knn-only-k4.csv")
    assert head != knn_only, "the premise: the head and kNN alone disagree on some example"
    for rule, expected in (("knn-only", knn_only), ("model", head)):
        out = tmp_path / f"attack-{rule}.csv"
        s = attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", rule, "--k", "4",
                                       "--attack_n", "12", "--out", str(out))
                          if rule != "model" else
                          attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", rule,
                                       "--attack_n", "12", "--out", str(out)))
        rows = read_done(str(out))
        assert len(rows) == s["n"] == 12, (len(rows), s)
        wrong = {r["id"]: (r["original_prediction"], expected[r["id"]]) for r in rows
                 if r["original_prediction"] != expected[r["id"]]}
        assert not wrong, f"--attack {rule}: the originals' predictions are not the {rule} rule's: {wrong}"
        report = json.load(open(tmp_path / f"attack-{rule}.json"))
        assert report["summary"]["n"] == 12 and report["settings"]["rule"] == rule
    assert scored["n"] > 12


def test_evaluate_attack_refuses_in_one_line(knn_run, data_dir, tiny_bert_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        attack_main(["--checkpoint", knn_run, "--attack_n", "5"])
    assert "the following arguments are required: --attack" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        attack_main(["--checkpoint", knn_run, "--attack", "knn-only", "--split", "train"])
    assert "find itself in the datastore" in capsys.readouterr().err
    with pytest.raises(MinknnError, match="no labels"):
        attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model", "--split", "test"))
    out = str(tmp_path / "a.csv")
    attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model", "--attack_n", "2",
                               "--out", out))
    with pytest.raises(MinknnError, match="other settings"):
        attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model", "--attack_n", "2",
                                   "--attack_queries", "50", "--out", out))
    with pytest.raises(MinknnError, match="no proxies"):
        attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "proxy"))
    assert os.path.exists(out)


def test_a_larger_attack_n_attacks_only_the_examples_the_csv_lacks(knn_run, data_dir, tiny_bert_dir,
                                                                    tmp_path):
    """A 4-example attack grown to 8 keeps its 4 rows (one is marked by hand: attacking it again
    would overwrite the mark) and adds the other 4; a smaller draw is summarised over its own
    examples only, the file untouched."""
    out = str(tmp_path / "a.csv")
    def attack(n):
        return attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model",
                                          "--attack_n", str(n), "--out", out))
    attack(4)
    first = read_done(out)
    first[0]["words"] = "999"  # a mark no attack of these short sentences would write
    write_rows(out, [[r[c] for c in COLUMNS] for r in first], mode="w")
    s = attack(8)
    rows = read_done(out)
    assert [r["id"] for r in rows[:4]] == [r["id"] for r in first], "the first draw's rows first"
    assert rows[0]["words"] == "999", "an example already in the CSV was attacked again"
    assert len(rows) == s["n"] == 8, f"growing --attack_n 4 to 8: {len(rows)} rows, summary {s}"
    torch.testing.assert_close(s["words_per_input"], sum(int(r["words"]) for r in rows) / 8,
                               msg="the summary's mean words per input is not the 8 rows' mean")
    s = attack(2)
    assert s["n"] == 2 and len(read_done(out)) == 8, f"--attack_n 2 after 8: summary {s}"
    with open(tmp_path / "a.json") as f:
        assert json.load(f)["settings"]["attack_n"] == 2, "the report's settings are not the last call's"


def test_evaluate_attack_on_agnews_four_classes(data_dir, tiny_bert_dir, tmp_path):
    """AG News, 4 classes (our real copy lacks train.csv; the fixture has one): a knnbert run on
    it, its test split attacked by kNN alone. Each row's gold class is the file's (a class name
    looked up one off fails here, and only here), its classes are AG News's, and its status agrees
    with them. The tiny model's attacks all fail or are skipped: the success rule for 3+ classes
    is test_with_three_classes_a_flip_counts_only_if_it_lowers_the_gold_class_most's."""
    run = str(tmp_path / "run")
    train.main(["--task", "agnews", "--loss", "knnbert", "--model", tiny_bert_dir, "--data_dir",
                data_dir, "--out", run, "--epochs", "1", "--batch_size", "8", "--max_len", "32",
                "--device", "cpu", "--queue_size", "8"])
    out = str(tmp_path / "a.csv")
    s = attack_main(attack_flags(run, data_dir, tiny_bert_dir, "--split", "test", "--attack",
                                   "knn-only", "--k", "4", "--out", out))
    task = TASKS["agnews"]
    gold = {e.id: task.labels[e.label] for e in load_split(task, "test", data_dir)}
    rows = read_done(out)
    assert len(rows) == s["n"] == len(gold) == 8, (len(rows), s)
    for r in rows:
        assert r["label"] == gold[r["id"]], f"agnews {r['id']}: gold class {r['label']}, the file has {gold[r['id']]}"
        classes = {r["original_prediction"], r["perturbed_prediction"]}
        assert classes <= set(task.labels), f"agnews {r['id']}: classes {classes} not AG News's"
        expected = ("skipped" if r["original_prediction"] != r["label"] else
                    "failed" if r["perturbed_prediction"] == r["label"] else "succeeded")
        assert r["status"] == expected, f"agnews {r['id']}: status {r['status']} for classes {r}"
    assert s["original_accuracy"] == 100 * sum(r["status"] != "skipped" for r in rows) / 8


def test_wordnet_synonyms_and_antonyms_are_read_from_its_data_files(tmp_path):
    """Two adjective synsets that are each other's direct antonyms (WordNet's data.adj format),
    one noun with no antonym; word numbers in the pointers are 1-based, in hex."""
    (tmp_path / "data.adj").write_text(
        "  1 This software and database is being provided ...\n"
        "00001740 00 a 02 able 0 capable(p) 0 001 ! 00002098 a 0201 | having the means\n"
        "00002098 00 a 01 unable 0 001 ! 00001740 a 0102 | not having the means\n")
    (tmp_path / "data.noun").write_text("00001000 03 n 01 entity 0 000 | that which exists\n")
    for name in ("data.verb", "data.adv"):
        (tmp_path / name).write_text("")
    synonyms, antonyms = read_wordnet(str(tmp_path))
    assert antonyms == {("capable", "unable"), ("unable", "capable")}, \
        "the pointer's source word is 'capable' (word 02 of its synset), its target 'unable' (01)"
    assert synonyms["able"] == ["capable"] and synonyms["capable"] == ["able"], synonyms
    assert Synonyms(synonyms)("Able") == [("capable", 1.0)]
    assert "entity" not in synonyms or synonyms["entity"] == [], "a one-word synset has none"


def test_the_summary_counts_successful_attacks_that_swapped_in_an_antonym(tmp_path):
    examples = [Example(text=t, id=f"e{i}") for i, t in enumerate(["a great film", "great fun", "dull"])]
    words = {"great": [("awful", 0.9)]}
    s = run_attack(examples[:1], [1], keyed, table(words), same_meaning, Settings(max_share=1),
                   str(tmp_path / "a.csv"), ["neg", "pos"], antonyms={("great", "awful")})
    assert s["antonym_attacks"] == 100.0, s
    s = run_attack(examples[1:2], [1], keyed, table(words), same_meaning, Settings(max_share=1),
                   str(tmp_path / "b.csv"), ["neg", "pos"], antonyms={("good", "bad")})
    assert s["antonym_attacks"] == 0.0, s


def strict_json(path):
    """The file's JSON, refusing NaN and Infinity (not JSON, though Python's json writes them)."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not valid JSON")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def test_an_attack_with_every_example_misclassified_says_na_and_writes_null(
        knn_run, data_dir, tiny_bert_dir, tmp_path, monkeypatch, capsys):
    """Every drawn example misclassified (the classifier asked always answers a class not the gold
    one): nothing is attacked, so the success rate, the perturbed share and the queries are means
    of nothing: printed as n/a with the reason, null in the .json (valid JSON), not NaN."""
    from minknn.lab import attack as module
    real = module.attack

    def always_wrong(text, label, classify, *rest):
        def wrong(texts):  # all the mass on the class after the gold one
            return torch.nn.functional.one_hot(torch.full((len(texts),), (label + 1) % 2), 2).float()
        return real(text, label, wrong, *rest)
    monkeypatch.setattr(module, "attack", always_wrong)
    out = tmp_path / "a.csv"
    capsys.readouterr()
    s = attack_main(attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model", "--attack_n", "3",
                                 "--out", str(out)))
    assert (s["n"], s["skipped"]) == (3, 3), s
    report = strict_json(tmp_path / "a.json")["summary"]
    for field in ("attack_success_rate", "perturbed_word_share", "queries"):
        assert report[field] is None, f"attack.summary: {field} of no attacked example is {report[field]}, not null"
    assert report["original_accuracy"] == 0.0
    printed = capsys.readouterr().out
    assert "nan" not in printed, printed
    assert "attack success rate              n/a (no example was classified correctly, so there is nothing " \
           "to attack)" in printed, printed


def test_summary_of_no_success_or_no_example_is_none_with_its_reason():
    from minknn.lab.attack import not_available
    s = summary([{"status": "failed", "swaps": {}, "words": 5, "queries": 40}])
    assert s["perturbed_word_share"] is None and s["attack_success_rate"] == 0.0
    assert not_available(s, "perturbed_word_share") == "no attack succeeded"
    s = summary([])
    assert s["original_accuracy"] is None and not_available(s, "original_accuracy") == "no example was drawn"


def test_an_attack_csv_without_its_settings_or_not_an_attacks_is_its_own_line(knn_run, data_dir, tiny_bert_dir,
                                                                              tmp_path):
    out = tmp_path / "a.csv"
    flags = attack_flags(knn_run, data_dir, tiny_bert_dir, "--attack", "model", "--attack_n", "2", "--out", str(out))
    attack_main(flags)
    (tmp_path / "a.json").unlink()
    with pytest.raises(MinknnError, match=rf"a.csv is an attack's output, but its settings file {tmp_path}/a.json "
                                          r"is missing, so .*; put that file back, or give --out another file"):
        attack_main(flags)
    out.write_text("text,label\nfine,1\n")  # some other CSV, given as --out by mistake
    with pytest.raises(MinknnError, match=r"a.csv is not an attack's output \(its first line is not the header "
                                          r"id,status,"):
        attack_main(flags)
    assert out.read_text() == "text,label\nfine,1\n", "a CSV not the attack's must be left as it was"


def test_an_attack_resumes_in_a_run_folder_moved_or_copied(knn_run, data_dir, tiny_bert_dir, tmp_path):
    """The attack's settings name the checkpoint by its sha256: moved, the run's attack (its default
    CSV beside the checkpoint) goes on, keeping its rows; another checkpoint is still refused."""
    import shutil
    first, moved = tmp_path / "run", tmp_path / "moved"
    shutil.copytree(knn_run, first)
    attack = ["--attack", "model", "--attack_n", "2"]
    attack_main(attack_flags(str(first), data_dir, tiny_bert_dir, *attack))
    (csv_path,) = first.glob("attack-*.csv")
    rows = read_done(str(csv_path))
    rows[0]["words"] = "999"  # a mark no attack of these short sentences would write
    write_rows(str(csv_path), [[r[c] for c in COLUMNS] for r in rows], mode="w")
    first.rename(moved)
    s = attack_main(attack_flags(str(moved), data_dir, tiny_bert_dir, *attack))
    assert s["n"] == 2 and read_done(str(moved / csv_path.name))[0]["words"] == "999", \
        "the moved run's attack was attacked again, not resumed"
    other = tmp_path / "other"
    train.main(["--task", "sst", "--loss", "knnbert", "--model", tiny_bert_dir, "--data_dir", DATA,
                "--out", str(other), "--epochs", "1", "--batch_size", "8", "--max_len", "32",
                "--device", "cpu", "--queue_size", "16", "--seed", "1"])
    with pytest.raises(MinknnError, match=r"holds an attack with other settings \(.*: checkpoint_sha256 \""):
        attack_main(attack_flags(str(other), data_dir, tiny_bert_dir, *attack, "--out",
                                 str(moved / csv_path.name)))
