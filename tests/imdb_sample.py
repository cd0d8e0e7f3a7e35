"""Small generated IMDB data in both real layouts (the real set cannot be downloaded here)."""

import csv
import random

POSITIVE = ["great", "wonderful", "superb", "moving", "brilliant", "loved"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "worst", "hated"]
NEUTRAL = ["the", "film", "plot", "actor", "scene", "story", "a", "was", "and", "it"]


def reviews(count, seed):
    """``count`` (text, label) pairs per class, negatives first: raw text with the features the
    normalisation handles (capitals, ``<br />``, commas, quotes, digits, ``!``)."""
    rng = random.Random(seed)
    out = []
    for label, words in ((0, NEGATIVE), (1, POSITIVE)):
        for _ in range(count):
            body = [
                rng.choice(words if rng.random() < 0.4 else NEUTRAL)
                for _ in range(rng.randint(4, 30))
            ]
            body[0] = body[0].capitalize()
            out.append(
                (f'{" ".join(body)}, "really" 10/10!<br /><br />{rng.choice(words)}.', label)
            )
    return out


def write_acl(directory, train, test):
    """The aclImdb folder (with an ``unsup`` part that must be ignored) in ``directory``."""
    for part, items in (("train", train), ("test", test)):
        for number, (text, label) in enumerate(items):
            folder = directory / "aclImdb" / part / ("neg", "pos")[label]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{number}_{7 if label else 2}.txt").write_text(text)
    (directory / "aclImdb" / "train" / "unsup").mkdir()
    (directory / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("unlabelled zebra zebra")


def write_csv(directory, train, test):
    """The authors' imdb_train.csv and imdb_test.csv in ``directory``."""
    for part, items in (("train", train), ("test", test)):
        with open(directory / f"imdb_{part}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["label", "review"])
            writer.writerows((label, text) for text, label in items)
