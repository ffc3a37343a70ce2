"""Passes over the nf IR, each registered through the `nfc.passes` entry-point group."""
