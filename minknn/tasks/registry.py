"""The task registry: every task minknn trains on, one entry each. Adding a task is one entry here
(and, for a new file format, one reader in minknn/tasks/readers.py); your own CSV, TSV or JSON Lines
files need none (train.py --train_file: minknn/tasks/own_task.py).

An entry says where the task's official files are (their folder under the data root and their
names, by the source they hold), how to read them, its classes, its kind (minknn/kinds.py), how
its train/dev/test splits are made (minknn/tasks/data.py) and how many examples each official source
has. Where a benchmark has no labelled test split of its own, the split is made here, once, the
same for every run:
    SentEval MR, CR, SUBJ, MPQA   no official split: 80 / 10 / 10 % of a fixed shuffle
    TREC, IMDB, AG News, Reuters  official train and test; dev = 10 % of train
    GLUE (rte, cola, glue-sst2, qnli, stsb)   GLUE's test labels are hidden, so, as KNN-BERT (after
                                  Gunel et al. 2021), GLUE's dev set is the test split and dev is
                                  10 % of GLUE's train. mrpc keeps GLUE's dev as its dev split and
                                  has no labelled test: it is the minBERT extension's MRPC, and the
                                  multi-task results in the README were measured on that split

Class names (Task.names, minknn/tasks/data.py) are what reads a class as text: train.py --proxy_init
names and AncSetFit's statements (minknn/losses/ancsetfit.py). They are the labels where those are
words, and the dataset's documented meaning where its files hold codes: TREC's coarse classes as
Li and Roth 2002 ("Learning Question Classifiers", COLING, Table 1) and the task's own page
(cogcomp.seas.upenn.edu/Data/QA/QC/) describe them, "abbreviation", "description and abstract
concept", "entity", "human being", "location", and "number" for their "numeric value" (the
tokenizer splits "numeric" into pieces, nu ##meric); AG News's "Sci/Tech" as "science and
technology". Reuters' 90 topics (codes such as 'acq', 'dlr') and AAPD's subject codes have
none here: no proxy loss trains a multi-label task, so nothing reads them.
AncSetFit's statement of a class is Task.template filled with its description (default: its name).
Where AncSetFit's code (github.com/AmaliePauli/AncSetfit, templates.py) gives the dataset a
template and words, they are theirs: SST-5 "The movie is {}" with terrible, bad, okay, good,
great; CR "The movie is {}" (sic: CR reviews products) with bad, good; SST-2 and IMDB "The movie
review is {}"; AG News "The topic is about {}" with its labels as written; TREC their fine-grained
TREC-QC template, "The question is regarding {}", with the coarse names above. Every other task
takes the one generic statement, "This sentence is {name}.", chosen before any result on it.
"""
import dataclasses

from minknn import MinknnError
from minknn.tasks.data import Task, source_paths
from minknn.tasks.readers import (aapd_label_names, glue_tsv, read_aapd, read_agnews,
                                  read_goemotions, read_imdb, read_minbert_pairs,
                                  read_minbert_sentiment, read_reuters, read_senteval_classes,
                                  read_sst_binary, read_sst_fine, read_trec)

THREE_WAY = {"train": ("all", 0.0, 0.8), "dev": ("all", 0.8, 0.9), "test": ("all", 0.9, 1.0)}
DEV_FROM_TRAIN = {"train": ("train", 0.0, 0.9), "dev": ("train", 0.9, 1.0), "test": "test"}
GLUE = {"train": ("train", 0.0, 0.9), "dev": ("train", 0.9, 1.0), "test": "dev"}

SST5 = ["very negative", "negative", "neutral", "positive", "very positive"]
POLARITY = ["negative", "positive"]
NLI = ["entailment", "not_entailment"]
# AncSetFit's statements (the module docstring): (template, description of each class)
MOVIE_5 = {"template": "The movie is {}", "descriptions": ["terrible", "bad", "okay", "good",
                                                           "great"]}
MOVIE_REVIEW = {"template": "The movie review is {}"}
TREC_COARSE = ["abbreviation", "description and abstract concept", "entity", "human being",
               "location", "number"]
MINBERT = "https://raw.githubusercontent.com/gpoesia/minbert-default-final-project/" \
          "7ac8260577fc12a86c7aaf38918056c30054ef39/data/"

REUTERS_FILES = tuple(f"reut2-{i:03d}.sgm" for i in range(22))
REUTERS_90 = [  # the ModApte topics with at least one training and one test story (R90)
    "acq", "alum", "barley", "bop", "carcass", "castor-oil", "cocoa", "coconut", "coconut-oil",
    "coffee", "copper", "copra-cake", "corn", "cotton", "cotton-oil", "cpi", "cpu", "crude", "dfl",
    "dlr", "dmk", "earn", "fuel", "gas", "gnp", "gold", "grain", "groundnut", "groundnut-oil",
    "heat", "hog", "housing", "income", "instal-debt", "interest", "ipi", "iron-steel", "jet",
    "jobs", "l-cattle", "lead", "lei", "lin-oil", "livestock", "lumber", "meal-feed", "money-fx",
    "money-supply", "naphtha", "nat-gas", "nickel", "nkr", "nzdlr", "oat", "oilseed", "orange",
    "palladium", "palm-oil", "palmkernel", "pet-chem", "platinum", "potato", "propane", "rand",
    "rape-oil", "rapeseed", "reserves", "retail", "rice", "rubber", "rye", "ship", "silver",
    "sorghum", "soy-meal", "soy-oil", "soybean", "strategic-metal", "sugar", "sun-meal", "sun-oil",
    "sunseed", "tea", "tin", "trade", "veg-oil", "wheat", "wpi", "yen", "zinc"]
GOEMOTIONS = [  # data/emotions.txt, in its order (27 = neutral)
    "admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion", "curiosity",
    "desire", "disappointment", "disapproval", "disgust", "embarrassment", "excitement", "fear",
    "gratitude", "grief", "joy", "love", "nervousness", "optimism", "pride", "realization",
    "relief", "remorse", "sadness", "surprise", "neutral"]


def senteval(name, folder, files, labels, count, **statement):
    return Task(name, f"senteval/{folder}", read_senteval_classes, {"all": files}, labels,
                splits=THREE_WAY, counts={"all": count}, names=labels, **statement)


TASKS = {t.name: t for t in [
    # CS224N minBERT (the default final project's files)
    Task("sst", "minbert", read_minbert_sentiment, url=MINBERT, labels=SST5, names=SST5, **MOVIE_5,
         files={"train": "ids-sst-train.csv", "dev": "ids-sst-dev.csv",
                "test": "ids-sst-test-student.csv"},
         counts={"train": 8544, "dev": 1101, "test": 2210},
         blobs={"ids-sst-train.csv": "9cb7333cb1dae49c2bd2a4b56a24882a6e8704b5",
                "ids-sst-dev.csv": "3171aa629a340809d2db4a50df8f6e5ec9420ab0",
                "ids-sst-test-student.csv": "bbd2313758825f86e24416d6aad64cd93370cf7a"}),
    Task("cfimdb", "minbert", read_minbert_sentiment, url=MINBERT, labels=POLARITY,
         names=POLARITY,
         files={"train": "ids-cfimdb-train.csv", "dev": "ids-cfimdb-dev.csv",
                "test": "ids-cfimdb-test-student.csv"},
         counts={"train": 1707, "dev": 245, "test": 488},
         blobs={"ids-cfimdb-train.csv": "cd57bcbd2f7214ea6dd1783d3e885d324b1f478d",
                "ids-cfimdb-dev.csv": "8a0f5dcf3d40189b96c801a12cd79bf8003e61de",
                "ids-cfimdb-test-student.csv": "1e789c709b3ca0511f027a309b6d8bd21cde41b2"}),
    # quora-train.csv (22 MB) and quora-test-student.csv are missing from our reference copy
    # (../shared/data/SOURCES.md): their blob ids come from the repository's listing, unchecked
    # here; quora-dev.csv has 20,214 rows, two of them without a label (readers.read_minbert_pairs)
    Task("quora", "minbert", read_minbert_pairs, url=MINBERT, pair=True, positive=1,
         labels=["not duplicate", "duplicate"], names=["not duplicate", "duplicate"],
         files={"train": "quora-train.csv", "dev": "quora-dev.csv",
                "test": "quora-test-student.csv"},
         counts={"train": 141506, "dev": 20212, "test": 40431},
         blobs={"quora-train.csv": "a3b5546f6a0e65b60a328a5d294d1038f5bed1da",
                "quora-dev.csv": "de7cfa32428fd470b93f778fccc45a619e01336f",
                "quora-test-student.csv": "f257ef00558555afb50819578a58205732b16354"}),
    Task("sts", "minbert", read_minbert_pairs, url=MINBERT, kind="similarity", pair=True, labels=[],
         files={"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test-student.csv"},
         counts={"train": 6040, "dev": 863, "test": 1725},
         blobs={"sts-train.csv": "12b17760e7795fee35aeeabc290d5651de02622a",
                "sts-dev.csv": "9392860e584717976b8d817cc40c9e6ceeec27e0",
                "sts-test-student.csv": "25f0cf8fafdd1f82b9e2bb460c708af34341ce60"}),

    # SentEval (its processed files, data/downstream layout)
    senteval("mr", "MR", ("rt-polarity.neg", "rt-polarity.pos"), POLARITY, 10662),
    # SentEval's 3,775 less 4 blank lines
    senteval("cr", "CR", ("custrev.neg", "custrev.pos"), POLARITY, 3771,
             template="The movie is {}", descriptions=["bad", "good"]),
    senteval("subj", "SUBJ", ("subj.objective", "subj.subjective"), ["objective", "subjective"],
             10000),
    # SentEval's 10,606 less 3 blank lines
    senteval("mpqa", "MPQA", ("mpqa.neg", "mpqa.pos"), POLARITY, 10603),
    Task("trec", "senteval/TREC", read_trec, {"train": "train_5500.label", "test": "TREC_10.label"},
         labels=["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"], names=TREC_COARSE,
         template="The question is regarding {}", splits=DEV_FROM_TRAIN,
         counts={"train": 5452, "test": 500}),
    # phrases in train, sentences in dev/test
    Task("sst2", "senteval/SST/binary", read_sst_binary, labels=POLARITY, names=POLARITY,
         **MOVIE_REVIEW,
         files={"train": "sentiment-train", "dev": "sentiment-dev", "test": "sentiment-test"},
         counts={"train": 67349, "dev": 872, "test": 1821}),
    # sst's sentences, with a labelled test split
    Task("sst5", "senteval/SST/fine", read_sst_fine, labels=SST5, names=SST5, **MOVIE_5,
         files={"train": "sentiment-train", "dev": "sentiment-dev", "test": "sentiment-test"},
         counts={"train": 8544, "dev": 1101, "test": 2210}),

    # GLUE (download_glue_data.py's glue_data/<TASK>/ layout); see GLUE above for the splits
    Task("rte", "glue/RTE", glue_tsv("sentence1", "sentence2"),
         {"train": "train.tsv", "dev": "dev.tsv"},
         labels=NLI, names=["entailment", "not entailment"], pair=True, splits=GLUE,
         counts={"train": 2490, "dev": 277}),
    Task("cola", "glue/CoLA",
         glue_tsv("sentence", columns=("source", "label", "original", "sentence")),
         {"train": "train.tsv", "dev": "dev.tsv"}, labels=["unacceptable", "acceptable"],
         names=["unacceptable", "acceptable"],
         splits=GLUE, counts={"train": 8551, "dev": 1043}, metrics=("mcc", "acc", "macro_f1")),
    Task("glue-sst2", "glue/SST-2", glue_tsv("sentence"), {"train": "train.tsv", "dev": "dev.tsv"},
         labels=POLARITY, names=POLARITY, **MOVIE_REVIEW, splits=GLUE,
         counts={"train": 67349, "dev": 872}),
    Task("qnli", "glue/QNLI", glue_tsv("question", "sentence"),
         {"train": "train.tsv", "dev": "dev.tsv"},  # train.tsv: not in our copy
         labels=NLI, names=["entailment", "not entailment"], pair=True, splits=GLUE,
         counts={"train": 104743, "dev": 5463}),
    Task("stsb", "glue/STS-B", glue_tsv("sentence1", "sentence2", label="score"),
         {"train": "train.tsv", "dev": "dev.tsv"},
         labels=[], kind="similarity", pair=True, splits=GLUE, counts={"train": 5749, "dev": 1500}),
    # GLUE's MRPC has no single official download of the tsv files (download_glue_data.py builds
    # them from Microsoft's .msi), so there is no url: point --data_dir at a copy
    Task("mrpc", "glue/MRPC",
         glue_tsv("#1 String", "#2 String", label="Quality", id=("#1 ID", "#2 ID")),
         {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         labels=["not paraphrase", "paraphrase"], names=["not paraphrase", "paraphrase"],
         pair=True, positive=1,
         counts={"train": 3668, "dev": 408, "test": 1725}, metrics=("acc", "f1", "macro_f1")),

    # long documents and topics
    Task("imdb", "imdb", read_imdb, {"train": "aclImdb_v1.tar.gz", "test": "aclImdb_v1.tar.gz"},
         labels=POLARITY, names=POLARITY, **MOVIE_REVIEW, splits=DEV_FROM_TRAIN,
         counts={"train": 25000, "test": 25000},
         url="https://ai.stanford.edu/~amaas/data/sentiment/"),
    Task("agnews", "agnews/ag_news_csv", read_agnews, {"train": "train.csv", "test": "test.csv"},
         labels=["World", "Sports", "Business", "Sci/Tech"],
         names=["world", "sports", "business", "science and technology"],
         template="The topic is about {}", descriptions=["World", "Sports", "Business", "Sci/Tech"],
         splits=DEV_FROM_TRAIN,
         counts={"train": 120000, "test": 7600}),  # train.csv: not in our copy

    # multi-label
    Task("reuters", "reuters21578", read_reuters, {"train": REUTERS_FILES, "test": REUTERS_FILES},
         labels=REUTERS_90, kind="multilabel", splits=DEV_FROM_TRAIN,
         counts={"train": 7770, "test": 3019}),
    Task("goemotions", "goemotions/data", read_goemotions,
         {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         labels=GOEMOTIONS, names=GOEMOTIONS, kind="multilabel",
         counts={"train": 43410, "dev": 5426, "test": 5427}),
    # not in our copy; labels: get_task
    Task("aapd", "aapd", read_aapd, labels=None, kind="multilabel",
         files={"train": ("text_train", "label_train"), "dev": ("text_val", "label_val"),
                "test": ("text_test", "label_test")},
         counts={"train": 53840, "dev": 1000, "test": 1000}),
]}


def get_task(name, data_dir=None):
    """The registry's entry. AAPD ships no list of its labels: they are read from its training
    label file (readers.aapd_label_names), so its entry is completed here from the data."""
    if name not in TASKS:
        raise MinknnError(f"unknown --task '{name}'; choose one of: {', '.join(TASKS)}")
    task = TASKS[name]
    if task.labels is None:
        label_file = source_paths(task, "train", data_dir)[1]
        task = dataclasses.replace(task, labels=aapd_label_names(label_file))
    return task
