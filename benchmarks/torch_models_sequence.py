"""PyTorch twins of nfc's recurrent and attention benchmark models: the character-level LSTM
language model, the four LSTM variants (MI-LSTM, SC-RNN, subLSTM, LLTM) and BERT. See
benchmarks/torch_models.py, which collects them into `TWINS`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch_twin import Twin

# ------------------------------------------------------------------------------------------------
# shared pieces (std.nn and examples/models/layers.nf)

def lstm_gates(z: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSTM update from gate pre-activations z = [i, f, g, o]."""
    i, f, g, o = z.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class LSTMLM(Twin):
    """examples/models/lstm_lm.nf: character-level LSTM language model."""

    NF_FILE = "examples/models/lstm_lm.nf"
    DEFAULTS = {"batch": 16, "steps": 32, "vocab": 128, "embed": 64, "hidden": 256}
    LR, MOMENTUM = 1.0, 0.0

    def build(self, batch, steps, vocab, embed, hidden):
        self.param("emb", (vocab, embed), "normal(0.0, 0.1)")
        self.param("w", (embed + hidden, 4 * hidden), "glorot_uniform")
        self.param("b", (4 * hidden,), "zeros")
        self.param("wo", (hidden, vocab), "glorot_uniform")
        self.param("bo", (vocab,), "zeros")

    def input_specs(self):
        c = self.cfg
        shape = (c["batch"], c["steps"])
        return {"ids": (shape, "int", c["vocab"]), "targets": (shape, "int", c["vocab"])}

    def forward(self, ids, targets):
        n, steps = ids.shape
        h = torch.zeros(n, self.cfg["hidden"], dtype=self.w.dtype)
        c = torch.zeros_like(h)
        total = torch.zeros((), dtype=self.w.dtype)
        for t in range(steps):
            x = self.emb[ids[:, t]]
            h, c = lstm_gates(torch.cat([x, h], 1) @ self.w + self.b, c)
            total = total + F.cross_entropy(h @ self.wo + self.bo, targets[:, t])
        return {"loss": total / steps}


class RNNTwin(Twin):
    """A recurrent classifier over x[batch, steps, inputs] (the four LSTM variants)."""

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], c["steps"], c["inputs"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}


class MILSTM(RNNTwin):
    """examples/models/mi_lstm.nf: multiplicative-integration LSTM."""

    NF_FILE = "examples/models/mi_lstm.nf"
    DEFAULTS = {"batch": 64, "steps": 8, "inputs": 784, "hidden": 1024, "classes": 10}

    def build(self, batch, steps, inputs, hidden, classes):
        self.param("w", (inputs, 4 * hidden), "glorot_uniform")
        self.param("u", (hidden, 4 * hidden), "glorot_uniform")
        self.param("b", (4 * hidden,), "zeros")
        self.param("wo", (hidden, classes), "glorot_uniform")
        self.param("bo", (classes,), "zeros")

    def forward(self, x, y):
        h = torch.zeros(x.shape[0], self.cfg["hidden"], dtype=x.dtype)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            h, c = lstm_gates((x[:, t] @ self.w) * (h @ self.u) + self.b, c)
        logits = h @ self.wo + self.bo
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class SCRNN(RNNTwin):
    """examples/models/sc_rnn.nf: structurally constrained RNN (fixed alpha = 0.95)."""

    NF_FILE = "examples/models/sc_rnn.nf"
    DEFAULTS = {"batch": 64, "steps": 8, "inputs": 784, "hidden": 128, "context": 64,
                "classes": 10}

    def build(self, batch, steps, inputs, hidden, context, classes):
        self.param("bw", (inputs, context), "glorot_uniform")
        self.param("a", (inputs, hidden), "glorot_uniform")
        self.param("p", (context, hidden), "glorot_uniform")
        self.param("r", (hidden, hidden), "glorot_uniform")
        self.param("wu", (hidden, classes), "glorot_uniform")
        self.param("wv", (context, classes), "glorot_uniform")
        self.param("bo", (classes,), "zeros")

    def forward(self, x, y):
        alpha = 0.95
        h = torch.zeros(x.shape[0], self.cfg["hidden"], dtype=x.dtype)
        s = torch.zeros(x.shape[0], self.cfg["context"], dtype=x.dtype)
        for t in range(x.shape[1]):
            xt = x[:, t]
            s = (1 - alpha) * (xt @ self.bw) + alpha * s
            h = torch.sigmoid(s @ self.p + xt @ self.a + h @ self.r)
        logits = h @ self.wu + self.bo + s @ self.wv
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class SubLSTM(RNNTwin):
    """examples/models/sublstm.nf: subtractive-gating LSTM."""

    NF_FILE = "examples/models/sublstm.nf"
    DEFAULTS = {"batch": 64, "steps": 8, "inputs": 784, "hidden": 128, "classes": 10}

    def build(self, batch, steps, inputs, hidden, classes):
        self.param("w", (inputs + hidden, 4 * hidden), "glorot_uniform")
        self.param("b", (4 * hidden,), "zeros")
        self.param("wo", (hidden, classes), "glorot_uniform")
        self.param("bo", (classes,), "zeros")

    def forward(self, x, y):
        h = torch.zeros(x.shape[0], self.cfg["hidden"], dtype=x.dtype)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            i, f, z, o = torch.sigmoid(torch.cat([x[:, t], h], 1) @ self.w + self.b).chunk(4, 1)
            c = f * c + z - i
            h = torch.sigmoid(c) - o
        logits = h @ self.wo + self.bo
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class LLTM(RNNTwin):
    """examples/models/lltm.nf: the LLTM of PyTorch's extension tutorial."""

    NF_FILE = "examples/models/lltm.nf"
    DEFAULTS = {"batch": 64, "steps": 8, "inputs": 784, "state_size": 128, "classes": 10}

    def build(self, batch, steps, inputs, state_size, classes):
        self.param("w", (state_size + inputs, 3 * state_size), "glorot_uniform")
        self.param("b", (3 * state_size,), "zeros")
        self.param("wo", (state_size, classes), "glorot_uniform")
        self.param("bo", (classes,), "zeros")

    def forward(self, x, y):
        h = torch.zeros(x.shape[0], self.cfg["state_size"], dtype=x.dtype)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            gi, go, gz = (torch.cat([h, x[:, t]], 1) @ self.w + self.b).chunk(3, 1)
            c = c + F.elu(gz) * torch.sigmoid(gi)
            h = torch.tanh(c) * torch.sigmoid(go)
        logits = h @ self.wo + self.bo
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class BERT(Twin):
    """examples/models/bert.nf: a small post-LN BERT encoder with pooler and classifier."""

    NF_FILE = "examples/models/bert.nf"
    DEFAULTS = {"batch": 8, "seq": 32, "vocab": 128, "hidden": 64, "heads": 4, "ffn": 256,
                "layers": 2, "classes": 2}
    LR, MOMENTUM = 0.1, 0.9

    def build(self, batch, seq, vocab, hidden, heads, ffn, layers, classes):
        d, n02 = hidden, "normal(0.0, 0.02)"
        self.param("tok", (vocab, d), n02)
        self.param("pos", (seq, d), n02)
        self.param("ln_g", (d,), "ones")
        self.param("ln_b", (d,), "zeros")
        for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv"), ("wo", "bo")):
            self.param(w, (layers, d, d), n02)
            self.param(b, (layers, d), "zeros")
        self.param("g1", (layers, d), "ones")
        self.param("b1", (layers, d), "zeros")
        self.param("w1", (layers, d, ffn), n02)
        self.param("c1", (layers, ffn), "zeros")
        self.param("w2", (layers, ffn, d), n02)
        self.param("c2", (layers, d), "zeros")
        self.param("g2", (layers, d), "ones")
        self.param("b2", (layers, d), "zeros")
        self.param("wp", (d, d), n02)
        self.param("bp", (d,), "zeros")
        self.param("wc", (d, classes), n02)
        self.param("bc", (classes,), "zeros")

    def input_specs(self):
        c = self.cfg
        return {"ids": ((c["batch"], c["seq"]), "int", c["vocab"]),
                "y": ((c["batch"],), "int", c["classes"])}

    def forward(self, ids, y):
        c = self.cfg
        d, heads = c["hidden"], c["heads"]
        n, s = ids.shape
        x = F.layer_norm(self.tok[ids] + self.pos, (d,), self.ln_g, self.ln_b, eps=1e-12)
        for i in range(c["layers"]):
            q, k, v = (x @ self.named(w)[i] + self.named(b)[i]
                       for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
            q, k, v = (t.view(n, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))
            prob = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(d // heads), dim=-1)
            ctx = (prob @ v).transpose(1, 2).reshape(n, s, d)
            a = F.layer_norm(x + ctx @ self.wo[i] + self.bo[i], (d,), self.g1[i], self.b1[i],
                             eps=1e-12)
            f = F.gelu(a @ self.w1[i] + self.c1[i]) @ self.w2[i] + self.c2[i]
            x = F.layer_norm(a + f, (d,), self.g2[i], self.b2[i], eps=1e-12)
        pooled = torch.tanh(x[:, 0] @ self.wp + self.bp)
        logits = pooled @ self.wc + self.bc
        return {"loss": F.cross_entropy(logits, y), "logits": logits}



def char_corpus() -> np.ndarray:
    """The text of Python's documentation topics as int32 character codes (non-ASCII -> '?'),
    the corpus of the character-level LSTM language model."""
    import pydoc_data.topics

    text = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    codes = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return codes.astype(np.int32)
