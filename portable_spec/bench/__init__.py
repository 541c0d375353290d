"""Side-by-side measurements of the reference loop against what a user would otherwise run (plain decoding,
HF generate, HF prompt lookup). Imports the core only."""
