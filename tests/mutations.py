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
    ("knn", "minknn/knn.py",
     "return torch.full(scores.shape, 1 / scores.shape[1], dtype=torch.float64)",
     "return torch.softmax(scores.double(), dim=1)",
     "the cosine vote weighted by a softmax of the similarities, not one vote each"),
    ("knn", "minknn/knn.py",
     "return torch.full(scores.shape, 1 / scores.shape[1], dtype=torch.float64)",
     "return scores.double() / scores.double().sum(1, keepdim=True)",
     "the cosine vote weighted by each neighbour's share of the similarities"),
    ("knn", "minknn/knn.py", "1 / scores.shape[1], dtype", "1 / scores.shape[0], dtype",
     "the cosine vote's 1/K taken from the number of queries"),
    ("knn", "minknn/knn.py", "return torch.softmax(-scores.double() / temperature, dim=1)",
     "return torch.softmax(scores.double() / temperature, dim=1)",
     "the distance vote without the minus: the farthest neighbour weighs most"),
    ("knn", "minknn/knn.py", "return torch.softmax(-scores.double() / temperature, dim=1)",
     "return torch.softmax(-scores.double() / temperature, dim=0)",
     "the distance vote's softmax over the queries instead of the neighbours"),
    ("knn", "minknn/knn.py", "return torch.softmax(-scores.double() / temperature, dim=1)",
     "return torch.softmax(-scores.double() * temperature, dim=1)",
     "the distance vote multiplied by the temperature"),
    ("knn", "minknn/knn.py", "-scores.double().clamp(min=0).sqrt() / temperature",
     "-scores.double() / temperature",
     "the euclidean vote on the squared distances (no root)"),
    ("knn", "minknn/knn.py", "-scores.double().clamp(min=0).sqrt() / temperature",
     "-scores.double().sqrt() / temperature",
     "the euclidean vote's root without the clamp: NaN for a squared distance rounded below 0"),
    ("knn", "minknn/knn.py", "return (1 - phi) * probabilities + phi * knn_probs",
     "return phi * probabilities + (1 - phi) * knn_probs",
     "the mix swapped: phi weighs the model, 1 - phi the kNN vote"),
    ("knn", "minknn/knn.py", "return (1 - phi) * probabilities + phi * knn_probs",
     "return probabilities + phi * knn_probs",
     "the mix without 1 - phi on the model"),
    ("knn", "minknn/knn.py", "knn += alpha[:, j, None] * self.values[rows[:, j]]",
     "knn += alpha[:, j, None] * self.values[j]",
     "the vote adds datastore row j (the rank) instead of the j-th neighbour's row"),
    ("knn", "minknn/knn.py", "knn += alpha[:, j, None] * self.values[rows[:, j]]",
     "knn += self.values[rows[:, j]]", "the vote counts the neighbours' labels without weights"),
    ("knn", "minknn/knn.py", "knn += alpha[:, j, None] * self.values[rows[:, j]]",
     "knn += alpha[:, j] * self.values[rows[:, j]]",
     "the vote's weights not broadcast over the classes"),
    ("knn", "minknn/knn.py", "        for j in range(rows.shape[1]):\n            knn +=",
     "        for j in range(rows.shape[0]):\n            knn +=",
     "the vote loops over the queries instead of the K neighbours"),

]
