"""The models wing: the networks and what describes, builds, steps and shares them.

- :mod:`.config`: :class:`SHARNNConfig`, everything that defines a model, and its variants;
- :mod:`.sharnn`: the SHA-RNN (paper §3), top to bottom; :mod:`.lstm`: its LSTMs;
- :mod:`.transformer`: the decoder-only baseline built from the same config;
- :mod:`.build`: the :class:`LanguageModel` protocol, the class chosen by
  ``config.architecture``, the model fingerprint;
- :mod:`.step`: one inference position, the reference and the fast step side by side;
- :mod:`.integer_step`: the integer step, the same bits on every machine, on the numba
  kernels of :mod:`.integer_products` and :mod:`.integer_kernels` and the tables and
  quantized weights of :mod:`.exact`;
- :mod:`.inference`: which of those steps computes a position, for generation and coding;
- :mod:`.hub`: the Hugging Face Hub layout, one mixin for both architectures;
- :mod:`.shipped`: the models shipped inside the package, and the default one.

Nothing here imports from :mod:`sharnn.training`, :mod:`sharnn.coding`, the API or the
command line (``tests/test_layers.py``).
"""
