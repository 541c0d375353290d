"""vLLM adapter: portable-spec drafters served through vLLM's own `method: "dflash"` speculative decoding.

`plugin.register` (the `vllm.general_plugins` entry point) maps the checkpoint's architecture names to
`draft_model`'s classes: vLLM's DFlash model plus load-time checks, and, for depth_causal, the core ShiftMix
before every layer. `validate` holds the checks and imports no vLLM. Importing this package imports no vLLM.
"""
