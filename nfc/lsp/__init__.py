"""The .nf language server (`nfc lsp`): `analysis` runs the frontend and keeps what hover,
go-to-definition and completion need; `server` speaks LSP through pygls (the `lsp` extra).
See docs/tools.md.
"""
