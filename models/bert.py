"""BERT for masked-language-model pre-training, built from ``torch.nn`` modules.

Embeddings (token, position, segment; summed, layer-normalised, dropout), a stack of post-norm
Transformer encoder layers (GELU, dropout 0.1), and BERT's prediction head (dense, GELU, layer
norm, then a decoder whose weight is the token embedding's, plus a bias). No pooler: it serves
next-sentence prediction, which this pre-training leaves out. Weights start as BERT's:
normal(0, 0.02), biases 0, layer norms 1 and 0.
"""

import torch
from torch import nn
from torch.nn import functional

from datasets.wordpiece import PAD

MAX_POSITIONS = 512


class BertMLM(nn.Module):
    """BERT with ``layers`` x ``hidden`` (``heads`` attention heads, ``intermediate`` feed-
    forward units) over ``vocab_size`` pieces. Input ``(B, L)`` token indices (``[PAD]`` = 0
    is not attended to), L <= 512; output ``(B, L, vocab_size)`` logits."""

    def __init__(self, vocab_size, layers, hidden, heads, intermediate, dropout=0.1):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(MAX_POSITIONS, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            hidden,
            heads,
            intermediate,
            dropout,
            activation="gelu",
            layer_norm_eps=1e-12,
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))
        self.apply(_initialise)

    def forward(self, tokens):
        if tokens.shape[1] > MAX_POSITIONS:
            raise ValueError(
                f"sequences of {tokens.shape[1]} tokens: BERT takes at most {MAX_POSITIONS}"
            )
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.tokens(tokens) + self.positions(positions) + self.segments.weight[0]
        hidden = self.dropout(self.embedding_norm(hidden))
        hidden = self.encoder(hidden, src_key_padding_mask=tokens == PAD)
        hidden = self.transform_norm(functional.gelu(self.transform(hidden)))
        return functional.linear(hidden, self.tokens.weight, self.decoder_bias)


def _initialise(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.MultiheadAttention):
        nn.init.normal_(module.in_proj_weight, std=0.02)
        nn.init.zeros_(module.in_proj_bias)


def bert_tiny(num_classes, input_shape, vocab_size):
    """BERT-Tiny: 2 layers, hidden 128, 2 heads, feed-forward 512 (trains on a CPU)."""
    return _bert(
        num_classes, input_shape, vocab_size, layers=2, hidden=128, heads=2, intermediate=512
    )


def bert_base(num_classes, input_shape, vocab_size):
    """BERT-Base, the paper's size: 12 layers, hidden 768, 12 heads, feed-forward 3072."""
    return _bert(
        num_classes, input_shape, vocab_size, layers=12, hidden=768, heads=12, intermediate=3072
    )


def bert_large(num_classes, input_shape, vocab_size):
    """BERT-Large: 24 layers, hidden 1024, 16 heads, feed-forward 4096 (not a trainer model: the
    GPU-cluster projection's gradient shapes, syncbench.gpu_projection)."""
    return _bert(
        num_classes, input_shape, vocab_size, layers=24, hidden=1024, heads=16, intermediate=4096
    )


def _bert(num_classes, input_shape, vocab_size, **size):
    if num_classes != vocab_size:
        raise ValueError(
            f"a masked language model predicts its {vocab_size} vocabulary pieces, "
            f"not {num_classes} classes"
        )
    if input_shape[0] > MAX_POSITIONS:
        raise ValueError(
            f"sequences of {input_shape[0]} tokens: BERT takes at most {MAX_POSITIONS}"
        )
    return BertMLM(vocab_size, **size)
