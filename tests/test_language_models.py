"""The language models: exact sizes, padding that changes nothing, the registry's tasks."""

import pytest
import torch

import models
from datasets.text import PAD
from datasets.wordpiece import PAD as PIECE_PAD


def parameters(model):
    return sum(p.numel() for p in model.parameters())


def test_lstmimdb_has_the_authors_size():
    model = models.create("lstmimdb", 2, (500,), vocab_size=50_001)
    embedding = 50_001 * 50
    lstm = 4 * 100 * (50 + 100) + 2 * 4 * 100  # four gates: input and recurrent weights, two biases
    linear = 100 * 2 + 2
    assert parameters(model) == embedding + lstm + linear == 2_561_052


def _bert_size(vocab, layers, hidden, intermediate, positions=512):
    embeddings = (vocab + positions + 2) * hidden + 2 * hidden  # token, position, segment; norm
    layer = (
        4 * (hidden * hidden + hidden)
        + 2 * hidden
        + hidden * intermediate
        + intermediate
        + intermediate * hidden
        + hidden
        + 2 * hidden
    )
    head = hidden * hidden + hidden + 2 * hidden + vocab  # transform, norm, decoder bias (tied)
    return embeddings + layers * layer + head


@pytest.mark.parametrize(
    "name, layers, hidden, intermediate, expected",
    [
        ("bert-tiny", 2, 128, 512, 4_416_698),
        (
            "bert-base",
            12,
            768,
            3072,
            109_514_298,
        ),  # BERT-Base's 109,482,240 less the pooler, plus the MLM head
    ],
)
def test_bert_presets_have_their_sizes(name, layers, hidden, intermediate, expected):
    with torch.device("meta"):  # sizes only: no memory, no initialisation time
        model = models.create(name, 30_522, (128,), vocab_size=30_522)
    assert parameters(model) == _bert_size(30_522, layers, hidden, intermediate) == expected
    assert len(model.encoder.layers) == layers
    assert model.encoder.layers[0].self_attn.num_heads == {"bert-tiny": 2, "bert-base": 12}[name]
    assert model.decoder_bias.shape == (30_522,)


def test_lstm_ignores_padding():
    torch.manual_seed(0)
    model = models.create("lstmimdb", 2, (20,), vocab_size=30)
    sequences = [torch.randint(0, 30, (n,)) for n in (5, 12, 1)]
    batch = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=PAD)
    together = model(batch)
    alone = torch.cat([model(s.unsqueeze(0)) for s in sequences])
    assert torch.allclose(together, alone, atol=1e-6)
    assert torch.allclose(together.exp().sum(dim=1), torch.ones(3))  # log-softmax


def test_bert_attends_to_real_tokens_only():
    torch.manual_seed(0)
    model = models.create("bert-tiny", 50, (16,), vocab_size=50).eval()
    tokens = torch.randint(5, 50, (1, 6))
    padded = torch.cat([tokens, torch.full((1, 4), PIECE_PAD)], dim=1)
    out = model(padded)
    assert out.shape == (1, 10, 50)
    assert torch.allclose(out[:, :6], model(tokens), atol=1e-5)


def test_models_name_their_task_and_need_a_vocabulary():
    assert [models.task(name) for name in ("vgg16", "lstmimdb", "bert-tiny", "bert-base")] == [
        "image-classification",
        "text-classification",
        "masked-lm",
        "masked-lm",
    ]
    with pytest.raises(ValueError, match="lstmimdb reads text: it needs a vocab_size"):
        models.create("lstmimdb", 2, (500,))
    with pytest.raises(ValueError, match="predicts its 100 vocabulary pieces, not 2 classes"):
        models.create("bert-tiny", 2, (128,), vocab_size=100)
    with pytest.raises(ValueError, match="at most 512"):
        models.create("bert-tiny", 100, (513,), vocab_size=100)
