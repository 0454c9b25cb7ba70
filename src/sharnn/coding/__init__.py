"""The coding wing: lossless compression driven by a model (docs/compression.md).

- :mod:`.codec`: :func:`compress` and :func:`decompress`;
- :mod:`.arithmetic`: how a file's probabilities are computed: its ``Arithmetic``, one
  ``Predictor`` per arithmetic, and the walk over positions both directions share;
- :mod:`.coders`: what the walk codes through, each direction: constriction's range coder
  for a byte's distribution, the binary coder for mixing 3's bits;
- :mod:`.binary`: the binary arithmetic coder of mixing 3;
- :mod:`.container`: the ``.shz`` file: magic, versions, header, framing, validation;
- :mod:`.environment`: what the probabilities depend on (device, torch, CPU features,
  threads) and the settings coding runs under, restored after it;
- :mod:`.mixing`: the adaptive stage, the model's distribution mixed with context models
  that learn the file as it is coded (mixing version 1);
- :mod:`.matching`: mixing version 2: version 1 with a match model, three more context
  models and APMs;
- :mod:`.bitwise`: mixing version 3, the default: version 2's distribution refined one bit
  at a time by context models of bits, four mixers and three APMs, each bit coded as it
  is predicted;
- :mod:`.bitcontexts`: the 23 contexts of mixing 3's context models, hashed once a position;
- :mod:`.online`: online mode, a model that learns from the bytes already coded.
"""
