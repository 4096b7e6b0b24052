"""The target of a position that is not scored, named once.

The masked LM scores its masked tokens alone and retrieval its answer digits alone; every
other target is ``IGNORE``, which the loss, perplexity and accuracy skip (PyTorch's and
torchmetrics' ``ignore_index``). A module of its own, so that the datasets, the tasks and
the LightningModule share it without importing one another (and without Lightning).
"""

IGNORE = -100
