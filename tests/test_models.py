"""Every model builds, maps small inputs to one logit per class, and trains a step."""

import pytest
import torch

import models

# (name, input shape): the smallest images each architecture is meant for.
CASES = [
    ("cnn", (1, 8, 8)),
    ("cnn", (1, 28, 28)),
    ("mlp", (1, 8, 8)),
    ("mlp", (3, 32, 32)),
    ("vgg16", (3, 32, 32)),
    ("vgg19", (3, 32, 32)),
    ("resnet20", (3, 32, 32)),
    ("resnet56", (1, 28, 28)),
    ("resnet110", (3, 32, 32)),
    ("resnet50", (3, 64, 64)),
    ("resnet50", (1, 32, 32)),
    ("alexnet", (3, 64, 64)),
]


@pytest.mark.parametrize("name,shape", CASES)
def test_output_shape(name, shape):
    torch.manual_seed(0)
    model = models.create(name, num_classes=7, input_shape=shape)
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(2, *shape))
    assert logits.shape == (2, 7)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "name,parameters",
    [
        ("resnet20", 269_722),
        ("resnet56", 853_018),
        ("resnet110", 1_727_962),
        ("vgg16", 14_728_266),
        ("resnet50", 23_528_522),
    ],
)
def test_parameter_counts_match_the_published_architectures(name, parameters):
    shape = (3, 224, 224) if name == "resnet50" else (3, 32, 32)
    model = models.create(name, num_classes=10, input_shape=shape)
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_small_cnn_learns_a_step():
    torch.manual_seed(0)
    model = models.create("cnn", 3, (1, 8, 8))
    images, labels = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(ValueError, match="resnet20.*vgg16"):
        models.create("lenet", 10, (1, 28, 28))
    assert {
        "cnn",
        "mlp",
        "vgg16",
        "vgg19",
        "resnet20",
        "resnet56",
        "resnet110",
        "resnet50",
        "alexnet",
    } <= set(models.available())
