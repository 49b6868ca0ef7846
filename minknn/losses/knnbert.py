"""KNN-BERT's supervised contrastive loss over a labelled memory (Li et al., "KNN-BERT: Fine-Tuning
Pre-Trained Models with KNN Classifier", eq. 3).

    L_sc(q) = 1/|S(q)| sum_{k_j in S(q)}
              -log( exp(q.k_j / tau) / sum_{k_i in N(q) + {k_j}} exp(q.k_i / tau) )

    q = z / ||z||      the query: the L2-normalised pooled representation of a training example
    k_i                the memory's keys (already L2-normalised), each with a label: the MoCo queue
                       or the memory bank (minknn/memory.py, --memory queue|bank)
    P(q) = keys with q's label (positives), except the query's own older keys (below);
    N(q) = keys with another label (negatives)
    S(q) = the M_m most similar and the M_l least similar positives (--m_most, --m_least); a
           class with at most M_m + M_l positives in memory uses all of them

Each term is -s_j + log(exp(s_j) + sum_N exp(s_i)) = softplus(logsumexp_N(s) - s_j) with
s = q.k / tau.

The query's own older keys (each key carries its example's training-set row, minknn/memory.py) are
left out of P(q). When the training set fits in the queue (the default) every query has one, at
cosine about 0.995: it would always rank first, take one of the M_m slots, and add a term that
is an augmentation-style positive (the same text through the key encoder). The paper builds its
positives "from the same class of the given example instead of using limited augmentation-based
methods" (sec. 3), and its selection is about how the query relates to *other* members of its
class (a tight cluster, hard positives drawn towards it); whether the own key is there would
otherwise depend on the queue size and the batch order. It is never a negative (same label).

The batch loss is the mean of L_sc(q) over the queries with at least one positive in memory; a
query without one contributes nothing (the authors' code skipped the whole loss then), and a
batch without any gives 0. Trained as (1 - lam) CE + lam L_sc (eq. 6).

Hyper-parameters: tau = 0.07 (`temperature` in the code) and lam = 0.1 (the paper's); --m_most 50
and --m_least 100, the paper's best pair on RTE (Table 5: 75.7; using ALL positives collapsed to
52.0). The paper picks them by training-set size from {10, 50, 100, 200, 400}.

Few-shot runs: a class with at most M_m + M_l keys in memory uses every positive, the paper's
"ALL". minknn keeps that (eq. 3 as written; the paper gives no rule to shrink M) and prints one
warning line on the first step. The collapse the paper reports is on full RTE, ~1,250 positives
per class pulled together, many "significantly different with the query"; a few-shot class has
a few dozen, and there it measured harmless: on MR with 64 examples, all positives, 10/10 and 3/7
gave the same dev accuracy within 0.01 (RESULTS.md, "KNN-BERT's positives in few-shot runs").

The authors' code loops over the queue per query (and doubled the epoch time); here the selection
is a rank computed for every (query, key) pair at once: sort each query's similarities to its
positives, then S(q) = positives whose rank from the top is < M_m or whose rank from the
bottom is < M_l. Cost: a (B, K) matrix, 32 x 32000 at the defaults.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from minknn import warn


def select_positives(s, positive, m_most, m_least):
    """(B, K) mask of S(q): among each row's positives, the m_most largest and m_least
    smallest s."""
    # Rank each row's keys without a loop: sort the row with the non-positives at -inf (so they
    # come last), then scatter 0, 1, 2, ... back to the sorted positions: rank[b, k] is key k's
    # place in row b, 0 for the most similar positive, n_pos - 1 for the least similar. Keep a
    # positive whose rank from the top is < m_most or whose rank from the bottom is < m_least.
    # BEGIN part knnbert
    n_pos = positive.sum(1, keepdim=True)                              # (B, 1)
    order = s.masked_fill(~positive, float("-inf")).argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(s.shape[1], device=s.device).expand_as(order))
    # rank: 0 for the most similar positive, n_pos - 1 for the least similar; negatives rank
    # after them
    return positive & ((rank < m_most) | (rank >= n_pos - m_least))
    # END part knnbert


def knnbert_loss(q, labels, rows, keys, key_labels, key_rows, m_most, m_least, temperature):
    """q (B, d) unit queries, labels (B,), rows (B,) their training-set rows; keys (K, d) unit
    keys, key_labels (K,), key_rows (K,) their examples' rows. A scalar."""
    # s = q k^T / tau, (B, K). Positives: keys of the query's label, minus its own older keys
    # (rows against key_rows); S(q) from select_positives. Negatives: keys of another label. Each
    # selected k_j gives softplus(logsumexp_N(s) - s_j): k_j itself stays in its denominator.
    # Average over each query's S(q), then over the queries with at least one selected key.
    # BEGIN part knnbert
    s = q @ keys.T / temperature                                       # (B, K)
    same_class = labels[:, None] == key_labels[None, :]
    own = rows[:, None] == key_rows[None, :]                            # the query's older keys
    positive = same_class & ~own
    selected = select_positives(s, positive, m_most, m_least)
    # (B, 1); -inf if none
    log_negatives = s.masked_fill(same_class, float("-inf")).logsumexp(1, keepdim=True)
    # -log(e^s_j / (e^s_j + sum_N e^s_i))
    terms = F.softplus(log_negatives - s) * selected
    n_selected = selected.sum(1)
    has_positive = n_selected > 0
    per_query = terms.sum(1) / n_selected.clamp(min=1)
    return (per_query * has_positive).sum() / has_positive.sum().clamp(min=1)
    # END part knnbert


def warn_if_every_positive_is_used(key_labels, m_most, m_least):
    """One line when some class has no more than M_m + M_l keys in memory: there S(q) = P(q)."""
    counts = [n for n in key_labels.bincount().tolist() if n > 0]
    small = [n for n in counts if n <= m_most + m_least]
    if small:
        warn(f"knnbert: {len(small)} of {len(counts)} classes have at most --m_most + --m_least "
             f"= {m_most + m_least} keys in memory (fewest {min(small)}): their queries use "
             f"every positive (the paper's 'ALL'; see minknn/losses/knnbert.py)")


M_MOST, M_LEAST = 50, 100  # the defaults of --m_most and --m_least


class KNNBertLoss(nn.Module):
    lam = 0.1
    part = "knnbert"               # the assignment's (minknn/assignment/parts.py)
    uses_memory = True             # called with the batch's keys and the memory (Objective.forward)
    flags = {"m_most": {"type": int, "default": M_MOST, "min": 0,  # train.py's flags for it
                        "help": "most similar positives"},
             "m_least": {"type": int, "default": M_LEAST, "min": 0,
                         "help": "least similar positives"}}

    @staticmethod
    def refuse(m_most, m_least):
        """Why these flags cannot build the loss (one line), or None."""
        if m_most + m_least < 1:
            return (f"--m_most and --m_least must be >= 0 and select at least one positive, got "
                    f"{m_most} and {m_least}")
        return None

    def __init__(self, num_classes=None, dim=None, m_most=M_MOST, m_least=M_LEAST,
                 temperature=0.07):
        super().__init__()
        self.m_most, self.m_least, self.temperature = m_most, m_least, temperature
        self.checked = False  # the classes' sizes in memory, looked at on the first call

    def forward(self, z, labels, batch_keys, memory_keys, memory_labels, rows, memory_rows):
        if not self.checked:  # checked once, on the memory the run starts with
            warn_if_every_positive_is_used(memory_labels, self.m_most, self.m_least)
            self.checked = True
        # batch_keys (the key encoder's view of this batch) are not used: they join the memory
        # after the step. The query is the normalised z.
        # BEGIN part knnbert
        return knnbert_loss(F.normalize(z, dim=-1), labels, rows, memory_keys, memory_labels,
                            memory_rows, self.m_most, self.m_least, self.temperature)
        # END part knnbert
