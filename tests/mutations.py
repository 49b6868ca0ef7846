"""Plausible student mistakes, one per entry, for tests/mutate.py: (part, file, the correct text,
the mistake, what the student did). Each text occurs once in its file, inside a solution block of
its part; the part's own test command must fail on the mistake with a message naming the part.
Not copied into the student edition (minknn/assignment.py): it quotes the solution."""

MUTATIONS = [
    # --- BERT: embeddings, attention, the layer; pooling ---
    ("attention", "minknn/bert.py", "    probs = F.dropout(probs, p=dropout_p)  # BERT drops",
     "    probs = probs  # BERT drops", "attention dropout removed"),

    # --- training: the optimiser and the step ---

    # --- the losses ---

    # --- proxy inference, the MoCo memory, the kNN vote, PCGrad ---

]
