"""Per-model training defaults from ``configs/<model>.json``, overridden by command-line flags.

A config file is one JSON object whose keys are a subset of ``DEFAULTS``; keys it leaves out take
the value of ``DEFAULTS``. A flag given on the command line beats both.
"""

import json
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

DEFAULTS = {
    "dataset": "digits",  # data set trained on
    "batch_size": 32,  # samples per worker per iteration
    "lr": 0.1,  # base learning rate (after warm-up)
    "max_epochs": 10,  # epochs to train
    "warmup_epochs": 0.0,  # epochs of linear warm-up from lr/P to lr
    "lr_milestones": [],  # epochs (0-based) at whose start the lr is multiplied by lr_gamma
    "lr_gamma": 0.1,  # decay factor at each milestone
    "momentum": 0.9,  # SGD momentum, applied after synchronization
    "weight_decay": 1e-4,  # SGD weight decay, applied after synchronization
    "eval_batch_size": 256,  # samples per worker per evaluation batch
    "loader_workers": 0,  # DataLoader worker processes per rank
    "clip_grad_norm": 0.0,  # clip each worker's gradient to this L2 norm before syncing (0: off)
    "data_options": {},  # keyword options of the data set's loader (datasets.options)
}


class ConfigError(ValueError):
    """A config file is missing, unreadable, or holds unknown keys or wrongly typed values."""


def config_path(model):
    """The default config file of ``model``: ``configs/<model>.json``."""
    return CONFIG_DIR / f"{model}.json"


def load_config(path):
    """Read the config file at ``path`` and return ``DEFAULTS`` updated with its values."""
    path = Path(path)
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold one JSON object")
    problems = [
        f"{key} must be {_kind(DEFAULTS[key])}, got {value!r}"
        for key, value in values.items()
        if key in DEFAULTS and not _same_kind(value, DEFAULTS[key])
    ]
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        problems.insert(0, f"unknown key(s) {', '.join(unknown)} (valid: {', '.join(DEFAULTS)})")
    if problems:  # all of them at once, not one per attempt
        raise ConfigError(f"config file {path}: {'; '.join(problems)}")
    return {**DEFAULTS, **values}


def merge(config, overrides):
    """Return ``config`` with every key of ``overrides`` whose value is not None replaced."""
    return {
        key: value if overrides.get(key) is None else overrides[key]
        for key, value in config.items()
    }


def _same_kind(value, default):
    if isinstance(value, bool):  # JSON true/false would pass as the int 1/0
        return False
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):  # epochs, whole as on the command line
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
    return isinstance(value, type(default))


def _kind(default):
    """What a value of the key whose default is ``default`` must look like, for messages."""
    return (
        "a list of whole epochs, like [30, 60]"
        if isinstance(default, list)
        else f"like {default!r}"
    )
