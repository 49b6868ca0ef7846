"""Skipping the padding: the batch's real tokens packed into one sequence, and attention over each
example's own span of it (what MosaicBERT and ModernBERT do on a GPU).

A batch padded to its longest example, (B, T), holds N real tokens (attention_mask 1), and on short
sentences N is about half of B T. Every matmul, GELU and LayerNorm of the encoder works on each
token alone, so minknn/bert.py runs them on the N real tokens only, packed into one (N, H) matrix
in the order of the rows: `Packing` moves tensors between the two layouts, built once a batch.

Attention alone mixes tokens, and only within an example. By default (--attention fused or
explicit) each layer puts Q, K and V back into the (B, T) layout, hides the padding keys with the
additive mask `Packing.mask` builds, and packs its output again: attention is about 2% of the FLOPs
at these lengths, so its padding is left in. --attention packed skips that padding too: each
example's tokens are one span of the packed sequence (`Packing.spans`) and attention runs over
each span alone (`packed_attention`), through one of two fused kernels; `packed_kernel` chooses,
in one place:
    varlen   flash attention over the spans (torch.nn.attention.varlen): CUDA, fp16 or bf16, no
             dropout, so evaluation
    nested   F.scaled_dot_product_attention on a nested jagged tensor, a row per example: training
Neither takes an additive term, so MPNet's relative-position bias keeps the padded call.

It is not the default, and runs on a GPU only (PACKED_DEVICES). On an H100 and an H200 with
MiniLM (RESULTS.md, "How does minknn run on a GPU?") it was 2.8x to 6x slower than the padded call
in training and no faster in evaluation: a step of MiniLM at batch 32 is bound by the CPU
launching kernels, not by the GPU, so there is little to save by skipping padding, and a nested
tensor is a Python subclass whose dispatch took half of a training step's CPU time. On the CPU it
never runs: attention's padding is the 2% above there, and RESULTS.md measures it on GPUs only.
Either way the result equals the padded call on every real token (tests/test_bert.py checks
outputs and gradients on the CPU, through nested tensors; tests/test_cuda.py the GPU's kernels).
Shapes in comments: B batch, T tokens, N real tokens, H hidden, nh heads, hs = H / nh.
"""
import torch
import torch.nn.functional as F


def varlen_kernel():
    """Flash attention over packed sequences, torch.nn.attention.varlen's varlen_attn, or None
    where this torch has none (2.11 and 2.13 have it, with these arguments); CUDA only, fp16 and
    bf16, no dropout. Imported on first use, not with this file: the module imports
    torch._dynamo, 2 s of every command's start on this project's CPU, where it never runs."""
    if "fn" not in _VARLEN:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            varlen_attn = None
        _VARLEN["fn"] = varlen_attn
    return _VARLEN["fn"]


_VARLEN = {}  # varlen_kernel's import, once

# the devices on which "packed" attention runs over the packed tokens: on the CPU the padded call
# always runs (tests monkeypatch this to run the packed kernels on the CPU)
PACKED_DEVICES = ("cuda",)


class Packing:
    """Where the N real tokens of a (B, T) batch sit (attention_mask 1), to move tensors between
    the padded layout (B, T, ...) and the packed one (N, ...) in the order of the rows. With no
    padding both are views of the same memory and nothing is copied."""

    def __init__(self, attention_mask, pack=True):
        self.B, self.T = attention_mask.shape
        self.attention_mask = attention_mask
        # pack=False (the ONNX export, minknn/tools/onnx_export.py): every position goes through the
        # layers and the padding keys are masked, with no shape that depends on the mask's
        # values (an exported graph takes any mask), and no test of them
        self.padded = not attention_mask.all() if pack else True
        # the real tokens' places in the flattened (B T) positions, (N,)
        self.index = attention_mask.flatten().nonzero().squeeze(1) if pack and self.padded \
            else None
        # (1, nh, T, T) or None: a term every layer adds to its attention scores, beside the
        # padding's mask. BERT has none; MPNet's encoder puts its relative-position bias here.
        self.bias = None
        self._spans, self._masks = None, {}

    def mask(self, dtype):
        """The additive mask of the padded attention call, in `dtype` (q's: bf16 under autocast,
        where fp32's most negative number would round to -inf), built once a batch and read by
        every layer: the most negative number at padding keys, (B, 1, 1, T), broadcast over heads
        and queries, plus MPNet's bias; (1, nh, T, T) for the bias alone, and None when there is
        neither, which lets PyTorch pick its faster mask-free attention kernel."""
        if dtype not in self._masks:
            mask = None
            if self.padded:
                pad = self.attention_mask[:, None, None, :] == 0
                mask = torch.zeros(pad.shape, dtype=dtype, device=pad.device)
                mask = mask.masked_fill(pad, torch.finfo(dtype).min)
            if self.bias is not None:  # (1, nh, T, T) + (B, 1, 1, T) -> (B, nh, T, T)
                bias = self.bias.to(dtype)
                mask = bias if mask is None else bias + mask
            self._masks[dtype] = mask
        return self._masks[dtype]

    def spans(self):
        """Where each row's tokens start in the packed (N, ...) order, (B + 1,), in int64 and in
        int32 (row b holds offsets[b]:offsets[b + 1]; the rows' tokens stay together, as pack()
        keeps their order), and the longest and shortest row's lengths: what kernels over packed
        sequences take. Computed once a batch (the lengths are read back from the GPU: one
        synchronisation, not one a layer)."""
        if self._spans is None:
            lengths = self.attention_mask.sum(1)
            shortest, longest = torch.stack(lengths.aminmax()).tolist()
            offsets = F.pad(lengths.cumsum(0), (1, 0))
            self._spans = (offsets, offsets.to(torch.int32), longest, shortest)
        return self._spans

    def pack(self, x):
        """(B, T, ...) -> (N, ...): the real tokens only."""
        x = x.flatten(0, 1)
        return x if self.index is None else x[self.index]

    def unpack(self, x):
        """(N, ...) -> (B, T, ...), zeros at the padding (unpacked: whatever the layers left)."""
        if self.index is not None:
            x = x.new_zeros(self.B * self.T, *x.shape[1:]).index_copy(0, self.index, x)
        return x.view(self.B, self.T, *x.shape[1:])



def packed_kernel(kernel, qkv, dropout_p, packing):
    """How attention runs over the packed tokens, skipping the padding, or None for the padded
    (B, T) call with its mask: the one place that chooses. qkv: the packed Q, K and V
    (N, 3, nh, hs), whose device, dtype (bf16 under autocast) and head size decide.
        "varlen"  flash attention over the rows' spans (torch.nn.attention.varlen): CUDA, fp16 or
                  bf16, no dropout (so: evaluation), head size a multiple of 8 up to 256
        "nested"  F.scaled_dot_product_attention on a nested jagged tensor, a row per sequence
                  (any dtype, dropout too: training)
    Neither takes an additive term, so MPNet's relative bias keeps the padded call; so do
    --attention explicit and fused, and a batch with no padding, where the padded call already
    computes nothing wasted."""
    if (kernel != "packed" or packing.index is None or packing.bias is not None
            or qkv.device.type not in PACKED_DEVICES or packing.spans()[3] == 0):
        return None  # (a row with no real token at all: the padded call handles it)
    if (dropout_p == 0 and qkv.device.type == "cuda"
            and qkv.dtype in (torch.float16, torch.bfloat16) and qkv.size(-1) % 8 == 0
            and qkv.size(-1) <= 256 and varlen_kernel() is not None):
        return "varlen"
    return "nested"


def packed_attention(how, q, k, v, packing, dropout_p):
    """Attention of each row's tokens to each other, on the packed layout: q, k, v (N, nh, hs),
    the rows' tokens one after another (Packing.spans). Returns (N, nh, hs). The same as the
    padded call on every real token (tests/test_bert.py on the CPU, tests/test_cuda.py on a GPU).
    """
    offsets, cu, longest, _ = packing.spans()  # cu: flash attention's offsets are int32
    q, k, v = (x.contiguous() for x in (q, k, v))  # views into the one QKV matmul's output
    if how == "varlen":
        return varlen_kernel()(q, k, v, cu, cu, longest, longest)

    def rows(x):  # (N, nh, hs) -> (B, nh, jagged T, hs): SDPA's layout, a row per sequence
        return torch.nested.nested_tensor_from_jagged(x, offsets,
                                                      max_seqlen=longest).transpose(1, 2)
    out = F.scaled_dot_product_attention(rows(q), rows(k), rows(v), dropout_p=dropout_p)
    return out.transpose(1, 2).values()  # back to (N, nh, hs)

