"""The grammars of the .nf language and the textual IR (package data)."""
