"""The SparDL authors' LSTM sentiment classifier for IMDB (``lstmimdb``)."""

from torch import nn
from torch.nn import functional
from torch.nn.utils.rnn import pack_padded_sequence


class LSTMClassifier(nn.Module):
    """Embedding (``vocab_size`` x 50), one LSTM layer of 100 units, a linear layer to the
    classes, log-softmax: the authors' network (their vocabulary: 50,000 words + 1 rare index).

    Input: ``(B, L)`` token indices, each sequence ending in padding of negative values (see
    ``datasets.text.PAD``); the LSTM runs over each sequence's real tokens only (packed), and the
    classifier reads its last hidden state, so padding never changes a prediction.
    """

    def __init__(self, num_classes, vocab_size, embedding=50, hidden=100):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding)
        self.lstm = nn.LSTM(embedding, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        lengths = (tokens >= 0).sum(dim=1)
        packed = pack_padded_sequence(
            self.embedding(tokens.clamp(min=0)),
            lengths.cpu(),
            batch_first=True,
            enforce_sorted=False,
        )
        _, (hidden, _) = self.lstm(packed)
        return functional.log_softmax(self.classifier(hidden[-1]), dim=1)


def lstmimdb(num_classes, input_shape, vocab_size):
    """The authors' IMDB network for ``vocab_size`` token indices (``input_shape`` is the
    longest sequence: the LSTM takes any length)."""
    del input_shape
    return LSTMClassifier(num_classes, vocab_size)
