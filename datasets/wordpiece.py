"""A WordPiece vocabulary: trained from word counts, applied greedily (longest match first).

Training follows the ``tokenizers`` package's WordPiece trainer: each word starts as its
characters (all but the first written ``##c``, a continuation), and the most frequent adjacent
pair of pieces is merged, again and again, until the vocabulary has the requested size or no
pair occurs ``min_frequency`` times. Encoding a word takes the longest vocabulary piece at its
start, then the longest ``##`` piece at the rest, and so on; a word that cannot be covered is
``[UNK]``. Text is lower-cased and split into runs of letters/digits and single other characters.
"""

import heapq
import re
from collections import Counter, defaultdict

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))
PREFIX = "##"
MAX_WORD_CHARS = 100  # longer "words" (URLs, hashes) are [UNK], as in BERT


def words(text):
    """The lower-cased words and punctuation characters of ``text``."""
    return re.findall(r"\w+|[^\w\s]", text.lower())


def train(word_counts, vocab_size, min_frequency=2):
    """The vocabulary (a list, specials first, then every character, then merges in order)
    trained from ``{word: count}``; it is larger than ``vocab_size`` only when the characters
    alone are more."""
    pieces = [_split(word) for word in word_counts]
    counts = list(word_counts.values())
    vocab = list(SPECIALS) + sorted({piece for split in pieces for piece in split})
    known = set(vocab)
    pairs, where = Counter(), defaultdict(set)
    for i, split in enumerate(pieces):
        _count(split, counts[i], i, pairs, where, +1)
    heap = [(-count, pair) for pair, count in pairs.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        count, pair = heapq.heappop(heap)
        if -count != pairs.get(pair):
            continue  # stale: a fresher entry with the pair's current count was pushed
        if -count < min_frequency:
            break
        merged = (
            pair[0] + pair[1][len(PREFIX) :] if pair[1].startswith(PREFIX) else pair[0] + pair[1]
        )
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        changed = set()
        for i in list(where[pair]):
            changed.update(_count(pieces[i], counts[i], i, pairs, where, -1))
            pieces[i] = _merge(pieces[i], pair, merged)
            changed.update(_count(pieces[i], counts[i], i, pairs, where, +1))
        for touched in changed:
            if pairs.get(touched, 0) > 0:
                heapq.heappush(heap, (-pairs[touched], touched))
    return vocab


class WordPiece:
    """Encodes text with a trained vocabulary (``train``)."""

    def __init__(self, vocab):
        self.vocab = list(vocab)
        self.index = {piece: i for i, piece in enumerate(self.vocab)}
        self.cache = {}

    def encode(self, text):
        """The token indices of ``text``."""
        return [index for word in words(text) for index in self.encode_word(word)]

    def encode_word(self, word):
        """The token indices of one word (memoised)."""
        if word not in self.cache:
            self.cache[word] = self._greedy(word)
        return self.cache[word]

    def _greedy(self, word):
        if len(word) > MAX_WORD_CHARS:
            return [UNK]
        indices, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else PREFIX + word[start:end]
                if piece in self.index:
                    indices.append(self.index[piece])
                    start = end
                    break
            else:
                return [UNK]
        return indices


def _split(word):
    return [word[0]] + [PREFIX + char for char in word[1:]]


def _count(split, count, i, pairs, where, sign):
    """Add (``sign`` +1) or remove (-1) word ``i``'s adjacent pairs; return the pairs touched."""
    touched = list(zip(split, split[1:]))
    for pair in touched:
        pairs[pair] += sign * count
        if sign > 0:
            where[pair].add(i)
        else:
            where[pair].discard(i)
    return touched


def _merge(split, pair, merged):
    out, i = [], 0
    while i < len(split):
        if i + 1 < len(split) and (split[i], split[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(split[i])
            i += 1
    return out
