"""The training wing: the recipe (:mod:`.recipe`), Min-Trust LAMB (:mod:`.optim`), the loop
(:mod:`.trainer`), how a run starts or resumes (:mod:`.run_start`), its folder
(:mod:`.run_folder`), checkpoints (:mod:`.checkpoint`), metrics (:mod:`.metrics`), stopping
(:mod:`.stop`) and processes under torchrun (:mod:`.distributed`). Nothing here imports
from :mod:`sharnn.coding` (``tests/test_layers.py``).
"""
