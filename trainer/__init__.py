"""Data-parallel training with a pluggable gradient synchronizer.

``main_trainer.py`` parses the command line and builds the pieces; this package holds them:
``loop`` (the ``Trainer``), ``evaluation``, ``metrics`` (metrics.jsonl, TensorBoard, console),
``checkpoint``, ``sampler`` and ``data`` (sharding), ``gradients`` (the flat gradient buffer),
``schedule`` (learning rate), ``config`` (per-model defaults), ``distributed`` (collective
helpers, usage errors, aborting on failure) and ``stopping`` (Ctrl-C and divergence, agreed by
all ranks).
"""
