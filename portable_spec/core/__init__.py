"""The torch reference, which is the specification: checkpoint format, drafter, target, verification, the
decode loop, kernel dispatch and the writing rules. Imports no other layer of portable_spec."""
