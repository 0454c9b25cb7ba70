"""The data wing: corpora and their splits (:mod:`.corpus`), tokenizers of bytes, words
and wordpieces (:mod:`.tokenizer`), and preparing enwik8, WikiText-2 and any folder of
text (:mod:`.prepare`), the corpus of English from named Debian packages
(:mod:`.english`), and the overlap of a corpus with the benchmark texts (:mod:`.overlap`).
Nothing here imports from :mod:`sharnn.training`, :mod:`sharnn.coding`, the API or the
command line (``tests/test_layers.py``).
"""
