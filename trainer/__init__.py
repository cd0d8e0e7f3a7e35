"""Data-parallel training with a pluggable gradient synchronizer.

``main_trainer.py`` starts and ends a run; this package holds everything else: ``cli`` (the
flags and their checks), ``build`` (the data, model, synchronization and trainer of a run),
``resume`` (which checkpoint fits), ``loop`` (the ``Trainer``), ``flat`` (the blocking
synchronization, and the protocol every synchronization speaks: ``overlap``, ``torch_ddp`` and
``sharded`` are the others), ``evaluation``, ``metrics`` (metrics.jsonl, TensorBoard, console),
``checkpoint``, ``sampler`` and ``data`` (sharding), ``gradients`` (the flat gradient buffer),
``schedule`` (learning rate), ``config`` (per-model defaults), ``distributed`` (collective
helpers, usage errors, aborting on failure) and ``stopping`` (Ctrl-C and divergence, agreed by
all ranks).
"""
