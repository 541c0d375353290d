"""Conformance suite: golden vectors + checks generated over every registered backend (the ONNX backend suite's shape).

To add a backend: subclass portable_spec.core.backends.Backend (block_logits, generate; optionally verify,
target_forward, unavailable_reason, kinds_supported) and register it in the `portable_spec.backends` entry-point group. `pytest tests/conformance`
and `portable-spec conformance` then run every check on it; known gaps go in expected_failures.json with a reason.
"""
