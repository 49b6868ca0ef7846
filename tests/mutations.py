"""Plausible student mistakes, one per entry, for tests/mutate.py: (part, file, the correct text,
the mistake, what the student did). Each text occurs once in its file, inside a solution block of
its part; the part's own test command must fail on the mistake with a message naming the part.
Not copied into the student edition (minknn/assignment.py): it quotes the solution."""

MUTATIONS = [
    # --- BERT: embeddings, attention, the layer; pooling ---
    ("attention", "minknn/bert.py", "    probs = F.dropout(probs, p=dropout_p)  # BERT drops",
     "    probs = probs  # BERT drops", "attention dropout removed"),
    ("attention", "minknn/bert.py", "k.transpose(-2, -1) / math.sqrt(q.size(-1))",
     "k.transpose(-2, -1)", "scores not scaled by 1 / sqrt(hs)"),
    ("attention", "minknn/bert.py", "k.transpose(-2, -1) / math.sqrt(q.size(-1))",
     "k.transpose(-2, -1) / q.size(-1)", "scores divided by hs, not sqrt(hs)"),
    ("attention", "minknn/bert.py", "scores = q @ k.transpose(-2, -1)",
     "scores = k @ q.transpose(-2, -1)", "scores K Q^T, transposed"),
    ("attention", "minknn/bert.py", "    if mask is not None:\n        scores = scores + mask\n",
     "", "the padding mask ignored"),
    ("attention", "minknn/bert.py", "        scores = scores + mask\n",
     "        scores = scores.masked_fill(mask < 0, float('-inf'))\n",
     "padding masked with -inf (a row of padding only gives NaN)"),
    ("attention", "minknn/bert.py", "    probs = F.softmax(scores, dim=-1)\n",
     "    probs = F.softmax(scores, dim=-2)\n", "softmax over the queries, not the keys"),
    ("attention", "minknn/bert.py", "        scores = scores + mask\n    probs = F.softmax(scores, "
     "dim=-1)\n", "        pass\n    probs = F.softmax(scores, dim=-1) + mask\n",
     "mask added after the softmax"),
    ("attention", "minknn/bert.py", "    probs = F.dropout(probs, p=dropout_p)  # BERT drops "
     "attention weights, not just outputs\n    return probs @ v",
     "    return F.dropout(probs @ v, p=dropout_p)", "dropout on the output, not the weights"),
    ("attention", "minknn/bert.py", "    probs = F.softmax(scores, dim=-1)\n    probs = "
     "F.dropout(probs, p=dropout_p)", "    probs = F.softmax(F.dropout(scores, p=dropout_p), "
     "dim=-1)\n    probs = probs", "dropout on the scores, before the softmax"),
    ("attention", "minknn/bert.py", "probs = F.dropout(probs, p=dropout_p)",
     "probs = probs * (torch.rand_like(probs) >= dropout_p)",
     "dropout without the 1 / (1 - p) scaling"),
    ("embeddings", "minknn/bert.py", "positions = torch.arange(input_ids.size(1), "
     "device=input_ids.device).expand_as(input_ids)\n        ids, positions, types = "
     "(packing.pack(x) for x in (input_ids, positions, token_type_ids))",
     "ids, types = (packing.pack(x) for x in (input_ids, token_type_ids))\n        "
     "positions = torch.arange(ids.size(0), device=ids.device)",
     "positions counted over the packed tokens (0 to N - 1), not within each row"),
    ("embeddings", "minknn/bert.py", "positions = torch.arange(input_ids.size(1), ",
     "positions = 1 + torch.arange(input_ids.size(1), ", "positions start at 1"),
    ("embeddings", "minknn/bert.py", "e = (self.word_embeddings(ids) + self.position_embeddings("
     "positions)\n             + self.token_type_embeddings(types))",
     "e = self.word_embeddings(ids) + self.token_type_embeddings(types)",
     "the position embeddings left out"),
    ("embeddings", "minknn/bert.py", "e = (self.word_embeddings(ids) + self.position_embeddings("
     "positions)\n             + self.token_type_embeddings(types))",
     "e = self.word_embeddings(ids) + self.position_embeddings(positions)",
     "the token-type embeddings left out"),
    ("embeddings", "minknn/bert.py", "e = (self.word_embeddings(ids) + self.position_embeddings(",
     "e = (self.LayerNorm(self.word_embeddings(ids)) + self.position_embeddings(",
     "LayerNorm on the word embeddings alone (and again on the sum)"),
    ("embeddings", "minknn/bert.py", "return self.dropout(self.LayerNorm(e))",
     "return self.dropout(e)", "LayerNorm left out"),
    ("embeddings", "minknn/bert.py", "return self.dropout(self.LayerNorm(e))",
     "return self.LayerNorm(self.dropout(e))", "dropout before LayerNorm"),
    ("embeddings", "minknn/bert.py", "return self.dropout(self.LayerNorm(e))",
     "return self.LayerNorm(e)", "dropout left out"),
    ("embeddings", "minknn/bert.py", "return self.dropout(self.LayerNorm(e))",
     "return F.dropout(self.LayerNorm(e), self.dropout.p)",
     "dropout in eval mode too (F.dropout without training=)"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.LayerNorm(self.dropout(self.dense(x)))", "no residual in add and norm"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return residual + self.LayerNorm(self.dropout(self.dense(x)))",
     "the norm before the add"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.LayerNorm(residual) + self.dropout(self.dense(x))",
     "the residual normed instead of the sum (pre-LN style)"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.dropout(self.LayerNorm(residual + self.dense(x)))",
     "dropout after LayerNorm"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.LayerNorm(self.dropout(residual + self.dense(x)))",
     "dropout on the sum with the residual"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.LayerNorm(residual + self.dense(x))", "dropout left out"),
    ("layer", "minknn/bert.py", "return self.LayerNorm(residual + self.dropout(self.dense(x)))",
     "return self.LayerNorm(residual + F.dropout(self.dense(x), self.dropout.p))",
     "dropout in eval mode too (F.dropout without training=)"),
    ("layer", "minknn/bert.py", "        return self.output(self.self(h, packing), h)",
     "        a = self.self(h, packing)\n        return self.output(a, a)",
     "the attention block's residual is the attention's output"),
    ("layer", "minknn/bert.py", "        return F.gelu(self.dense(a))",
     "        return F.gelu(self.dense(a), approximate=\"tanh\")", "GELU's tanh approximation"),
    ("layer", "minknn/bert.py", "        return F.gelu(self.dense(a))",
     "        return F.relu(self.dense(a))", "ReLU for GELU"),
    ("layer", "minknn/bert.py", "        return F.gelu(self.dense(a))",
     "        return self.dense(F.gelu(a))", "GELU before the projection W_1"),
    ("layer", "minknn/bert.py", "        return self.output(self.intermediate(a), a)",
     "        return self.output(self.intermediate(a), h)",
     "the feed-forward block's residual is the layer's input h"),
    ("layer", "minknn/bert.py", "        return self.output(self.intermediate(a), a)",
     "        return self.output(self.intermediate(h), a)", "the feed-forward block reads h"),
    ("pooling", "minknn/model.py", "        return h[:, 0]", "        return h[:, -1]",
     "cls pooling takes the last position"),
    ("pooling", "minknn/model.py", "        return h[:, 0]", "        return h[0]",
     "cls pooling takes the first example, not the first token"),
    ("pooling", "minknn/model.py", "        return (h * m).sum(1) / m.sum(1).clamp(min=1)",
     "        return h.mean(1)", "mean over all positions, padding included"),
    ("pooling", "minknn/model.py", "        return (h * m).sum(1) / m.sum(1).clamp(min=1)",
     "        return (h * m).sum(1) / h.size(1)", "mean divided by T"),
    ("pooling", "minknn/model.py", "        return (h * m).sum(1) / m.sum(1).clamp(min=1)",
     "        return (h * m).sum(1) / m.sum()", "mean divided by the batch's count of tokens"),
    ("pooling", "minknn/model.py", "        return (h * m).sum(1) / m.sum(1).clamp(min=1)",
     "        return (h * m).sum(1) / m.sum(1)", "mean without the clamp: 0/0 on an empty row"),
    ("pooling", "minknn/model.py", "        return h.masked_fill(m == 0, torch.finfo(h.dtype).min)"
     ".max(1).values", "        return h.max(1).values", "max over padding too"),
    ("pooling", "minknn/model.py", "        return h.masked_fill(m == 0, torch.finfo(h.dtype).min)"
     ".max(1).values", "        return (h * m).max(1).values",
     "max with padding zeroed (beats all-negative real values)"),
    ("pooling", "minknn/model.py", "    m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)",
     "    m = attention_mask.unsqueeze(-1).float()  # (B, T, 1)",
     "the mask cast to float32 (bf16 hidden states pool to float32)"),

    # --- training: the optimiser and the step ---

    # --- the losses ---

    # --- proxy inference, the MoCo memory, the kNN vote, PCGrad ---

]
