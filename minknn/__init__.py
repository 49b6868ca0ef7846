"""minknn: fine-tune a hand-written BERT with kNN classifiers and metric-learning losses."""


class MinknnError(Exception):
    """A problem with the user's input (a file, a flag, a value). train.py and evaluate.py
    print its message as one line and exit with status 2, instead of a traceback."""
