"""The nfc standard library, written in the .nf language itself.

There is no Python operator code here: every standard operator (linear layers, convolutions,
pooling, activations, normalisation, losses, shape ops, capsule ops, recurrent cells) is a
tensor expression in `nn.nf`, imported by user programs with `import std.nn`. The frontend
resolves `std.*` imports to the `.nf` files of this package. docs/stdlib.md lists every op
with its signature, semantics and parameters.
"""
