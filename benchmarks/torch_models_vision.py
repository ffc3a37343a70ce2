"""PyTorch twins of nfc's feed-forward and convolutional benchmark models: MLP-3, LeNet-5,
ResNet-18, SqueezeNet, the capsule networks (CapsNet, matrix capsules), the ShuffleNet unit and
MobileNet. See benchmarks/torch_models.py, which collects them into `TWINS`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_twin import BNTwin, Twin

# ------------------------------------------------------------------------------------------------
# shared pieces (std.nn and examples/models/layers.nf)

def squash(x: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """std.nn squash over the last axis."""
    n2 = (x * x).sum(-1, keepdim=True)
    return x * (n2 / (1.0 + n2)) * torch.rsqrt(n2 + eps)


def capsule_length(x: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """std.nn capsule_length: sqrt(|x|^2 + eps) over the last axis."""
    return torch.sqrt((x * x).sum(-1) + eps)


def margin_loss(lengths: torch.Tensor, labels: torch.Tensor, m_pos: float = 0.9,
                m_neg: float = 0.1, lam: float = 0.5) -> torch.Tensor:
    """std.nn margin_loss, mean over the batch."""
    t = F.one_hot(labels, lengths.shape[1]).to(lengths.dtype)
    hi = torch.relu(m_pos - lengths)
    lo = torch.relu(lengths - m_neg)
    return (t * hi * hi + lam * (1 - t) * lo * lo).sum() / lengths.shape[0]



# ------------------------------------------------------------------------------------------------
# TVM_T's models

class MLP3(Twin):
    """examples/mlp.nf: MLP-3 784-256-128-10."""

    NF_FILE = "examples/mlp.nf"
    DEFAULTS = {"batch": 256, "inputs": 784, "hidden1": 256, "hidden2": 128, "classes": 10}
    LR, MOMENTUM = 0.1, 0.9

    def build(self, batch, inputs, hidden1, hidden2, classes):
        self.param("w1", (inputs, hidden1), "he_normal")
        self.param("b1", (hidden1,), "zeros")
        self.param("w2", (hidden1, hidden2), "he_normal")
        self.param("b2", (hidden2,), "zeros")
        self.param("w3", (hidden2, classes), "glorot_uniform")
        self.param("b3", (classes,), "zeros")

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], c["inputs"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}

    def forward(self, x, y):
        h1 = torch.relu(x @ self.w1 + self.b1)
        h2 = torch.relu(h1 @ self.w2 + self.b2)
        logits = h2 @ self.w3 + self.b3
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class LeNet5(Twin):
    """examples/lenet5.nf: LeNet-5 on 1x28x28."""

    NF_FILE = "examples/lenet5.nf"
    DEFAULTS = {"batch": 64, "classes": 10}
    LR, MOMENTUM = 0.01, 0.9

    def build(self, batch, classes):
        self.param("k1", (6, 1, 5, 5), "he_normal")
        self.param("c1", (6,), "zeros")
        self.param("k2", (16, 6, 5, 5), "he_normal")
        self.param("c2", (16,), "zeros")
        self.param("w3", (400, 120), "he_normal")
        self.param("b3", (120,), "zeros")
        self.param("w4", (120, 84), "he_normal")
        self.param("b4", (84,), "zeros")
        self.param("w5", (84, classes), "glorot_uniform")
        self.param("b5", (classes,), "zeros")

    def input_specs(self):
        b = self.cfg["batch"]
        return {"x": ((b, 1, 28, 28), "float", 0), "y": ((b,), "int", self.cfg["classes"])}

    def forward(self, x, y):
        a1 = torch.relu(F.conv2d(x, self.k1, self.c1, padding=2))
        p1 = F.max_pool2d(a1, 2, 2)
        a2 = torch.relu(F.conv2d(p1, self.k2, self.c2))
        p2 = F.max_pool2d(a2, 2, 2)
        h3 = torch.relu(p2.flatten(1) @ self.w3 + self.b3)
        h4 = torch.relu(h3 @ self.w4 + self.b4)
        logits = h4 @ self.w5 + self.b5
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


def _resnet_layout(width: int) -> list[tuple[str, int, int, bool]]:
    """(block prefix, in channels, out channels, downsampling) of resnet18.nf's 8 blocks."""
    out = []
    cin = width
    for stage in range(4):
        cout = width * 2 ** stage
        for blk in "ab":
            down = blk == "a" and stage > 0
            out.append((f"s{stage + 1}{blk}", cin, cout, down))
            cin = cout
    return out


class ResNet18(BNTwin):
    """examples/models/resnet18.nf: ResNet-18 for small images."""

    NF_FILE = "examples/models/resnet18.nf"
    DEFAULTS = {"batch": 16, "image": 32, "width": 16, "classes": 10}
    LR, MOMENTUM = 0.05, 0.9

    def build(self, batch, image, width, classes):
        self.param("stem_k", (width, 3, 3, 3), "he_normal")
        self.bn_decl("stem", width)
        for p, cin, cout, down in _resnet_layout(width):
            self.param(f"{p}_k1", (cout, cin, 3, 3), "he_normal")
            self.bn_decl(f"{p}_1", cout)
            self.param(f"{p}_k2", (cout, cout, 3, 3), "he_normal")
            self.bn_decl(f"{p}_2", cout)
            if down:
                self.param(f"{p}_kd", (cout, cin, 1, 1), "he_normal")
                self.bn_decl(f"{p}_d", cout)
        self.param("fc_w", (8 * width, classes), "glorot_uniform")
        self.param("fc_b", (classes,), "zeros")

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], 3, c["image"], c["image"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}

    def forward(self, x, y):
        h = torch.relu(self.bn(F.conv2d(x, self.stem_k, padding=1), "stem"))
        for p, _, _, down in _resnet_layout(self.cfg["width"]):
            stride = 2 if down else 1
            a = torch.relu(self.bn(F.conv2d(h, self.named(f"{p}_k1"), stride=stride, padding=1),
                                   f"{p}_1"))
            z = self.bn(F.conv2d(a, self.named(f"{p}_k2"), padding=1), f"{p}_2")
            s = self.bn(F.conv2d(h, self.named(f"{p}_kd"), stride=2), f"{p}_d") if down else h
            h = torch.relu(z + s)
        logits = h.mean((2, 3)) @ self.fc_w + self.fc_b
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class SqueezeNet(Twin):
    """examples/models/squeezenet.nf: SqueezeNet v1.1 layout for small images."""

    NF_FILE = "examples/models/squeezenet.nf"
    DEFAULTS = {"batch": 16, "image": 32, "squeeze": 16, "classes": 10}
    LR, MOMENTUM = 0.01, 0.9
    FIRES = (("f2", 4, 1, 4), ("f3", 8, 1, 4), ("f4", 8, 2, 8), ("f5", 16, 2, 8))
    """(name, in channels, squeeze, expand) in multiples of `squeeze`."""

    def build(self, batch, image, squeeze, classes):
        s = squeeze
        self.param("k0", (4 * s, 3, 3, 3), "he_normal")
        self.param("b0", (4 * s,), "zeros")
        for name, cin, sq, ex in self.FIRES:
            self.param(f"{name}_ks", (sq * s, cin * s, 1, 1), "he_normal")
            self.param(f"{name}_bs", (sq * s,), "zeros")
            self.param(f"{name}_k1", (ex * s, sq * s, 1, 1), "he_normal")
            self.param(f"{name}_b1", (ex * s,), "zeros")
            self.param(f"{name}_k3", (ex * s, sq * s, 3, 3), "he_normal")
            self.param(f"{name}_b3", (ex * s,), "zeros")
        self.param("k10", (classes, 16 * s, 1, 1), "normal(0.0, 0.01)")
        self.param("b10", (classes,), "zeros")

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], 3, c["image"], c["image"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}

    def fire(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Squeeze 1x1, then expand 1x1 and 3x3 concatenated."""
        s = torch.relu(F.conv2d(x, self.named(f"{name}_ks"), self.named(f"{name}_bs")))
        e1 = torch.relu(F.conv2d(s, self.named(f"{name}_k1"), self.named(f"{name}_b1")))
        e3 = torch.relu(F.conv2d(s, self.named(f"{name}_k3"), self.named(f"{name}_b3"), padding=1))
        return torch.cat([e1, e3], 1)

    def forward(self, x, y):
        h = torch.relu(F.conv2d(x, self.k0, self.b0, stride=2))
        h = F.max_pool2d(h, 3, 2)
        h = self.fire(self.fire(h, "f2"), "f3")
        h = F.max_pool2d(h, 3, 2)
        h = self.fire(self.fire(h, "f4"), "f5")
        logits = torch.relu(F.conv2d(h, self.k10, self.b10)).mean((2, 3))
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


# ------------------------------------------------------------------------------------------------
# NeoFlow's models

class CapsNet(Twin):
    """examples/models/capsnet.nf: CapsuleNet with three rounds of dynamic routing."""

    NF_FILE = "examples/models/capsnet.nf"
    DEFAULTS = {"batch": 16, "image": 28, "kernel": 9, "channels": 256, "types": 32, "pdim": 8,
                "ddim": 16, "classes": 10, "rounds": 3}
    LR, MOMENTUM = 0.01, 0.9

    def build(self, batch, image, kernel, channels, types, pdim, ddim, classes, rounds):
        grid = (image - 2 * kernel + 1) // 2 + 1
        self.param("k1", (channels, 1, kernel, kernel), "he_normal")
        self.param("b1", (channels,), "zeros")
        self.param("kp", (types, pdim, channels, kernel, kernel), "normal(0.0, 0.01)")
        self.param("bp", (types, pdim), "zeros")
        self.param("wd", (types * grid * grid, classes, ddim, pdim), "normal(0.0, 0.05)")

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], 1, c["image"], c["image"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}

    def forward(self, x, y):
        c = self.cfg
        h = torch.relu(F.conv2d(x, self.k1, self.b1))
        types, pdim = self.kp.shape[:2]
        # primary capsules: a strided conv whose output channels are (type, component)
        caps = F.conv2d(h, self.kp.flatten(0, 1), self.bp.flatten(), stride=2)
        n, _, gh, gw = caps.shape
        caps = caps.view(n, types, pdim, gh, gw).permute(0, 1, 3, 4, 2)
        u = squash(caps.reshape(n, types * gh * gw, pdim))
        uhat = torch.einsum("ijed,nid->nije", self.wd, u)
        blog = torch.zeros(uhat.shape[:3], dtype=uhat.dtype)
        for _ in range(c["rounds"]):
            coupling = torch.softmax(blog, dim=2)
            v = squash(torch.einsum("nij,nije->nje", coupling, uhat))
            blog = blog + torch.einsum("nije,nje->nij", uhat, v)
        lengths = capsule_length(v)
        return {"loss": margin_loss(lengths, y), "lengths": lengths}


def capsule_conv(a: torch.Tensor, k: torch.Tensor, stride: int = 2) -> torch.Tensor:
    """std.nn capsule_conv: y[b,o,p,q,i,j] = sum(c,r,s,t) a[b,c,sp+r,sq+s,i,t] k[o,c,r,s,t,j]."""
    kh, kw = k.shape[2:4]
    ho = (a.shape[2] - kh) // stride + 1
    wo = (a.shape[3] - kw) // stride + 1
    out = 0
    for r in range(kh):
        for s in range(kw):
            win = a[:, :, r:r + stride * (ho - 1) + 1:stride, s:s + stride * (wo - 1) + 1:stride]
            out = out + torch.einsum("bcpqit,octj->bopqij", win, k[:, :, r, s])
    return out


class MatrixCapsule(Twin):
    """examples/capsule.nf: conv, 4x4 pose capsules, a matrix-capsule convolution, margin loss."""

    NF_FILE = "examples/capsule.nf"
    DEFAULTS = {"batch": 16, "classes": 10}
    LR, MOMENTUM = 0.01, 0.9

    def build(self, batch, classes):
        self.param("k0", (32, 1, 3, 3), "he_normal")
        self.param("c0", (32,), "zeros")
        self.param("k1", (4, 2, 3, 3, 4, 4), "normal(0.0, 0.05)")
        self.param("w2", (1024, 160), "glorot_uniform")

    def input_specs(self):
        b = self.cfg["batch"]
        return {"x": ((b, 1, 12, 12), "float", 0), "y": ((b,), "int", self.cfg["classes"])}

    def forward(self, x, y):
        n = x.shape[0]
        a0 = torch.relu(F.conv2d(x, self.k0, self.c0))                      # [n, 32, 10, 10]
        p0 = a0.reshape(n, 2, 16, 10, 10).permute(0, 1, 3, 4, 2).reshape(n, 2, 10, 10, 4, 4)
        p1 = capsule_conv(p0, self.k1)                                       # [n, 4, 4, 4, 4, 4]
        u1 = squash(p1.reshape(n, 64, 16))
        v2 = squash((u1.reshape(n, 1024) @ self.w2).reshape(n, self.cfg["classes"], 16))
        lengths = capsule_length(v2)
        return {"loss": margin_loss(lengths, y), "lengths": lengths}


class ShuffleNetUnit(Twin):
    """examples/shufflenet_unit.nf: one ShuffleNet v1 unit with a stem and a classifier.

    That file's running variance moves towards the biased batch variance (torch uses the
    unbiased one), so the batch norm here is written out to match it.
    """

    NF_FILE = "examples/shufflenet_unit.nf"
    DEFAULTS = {"batch": 8, "groups": 2, "channels": 16, "classes": 10}
    LR, MOMENTUM = 0.05, 0.9

    def build(self, batch, groups, channels, classes):
        c, g = channels, groups
        self.param("k0", (c, 3, 3, 3), "he_normal")
        self.param("k1", (c // 2, c // g, 1, 1), "he_normal")
        self.param("k2", (c // 2, 1, 3, 3), "he_normal")
        self.param("k3", (c, c // 2 // g, 1, 1), "he_normal")
        for i, width in ((1, c // 2), (2, c // 2), (3, c)):
            self.param(f"g{i}", (width,), "ones")
            self.param(f"s{i}", (width,), "zeros")
        for i, width in ((1, c // 2), (2, c // 2), (3, c)):
            self.state(f"m{i}", (width,), "zeros")
            self.state(f"v{i}", (width,), "ones")
        self.param("wo", (c, classes), "glorot_uniform")
        self.param("bo", (classes,), "zeros")

    def input_specs(self):
        b = self.cfg["batch"]
        return {"x": ((b, 3, 16, 16), "float", 0), "y": ((b,), "int", self.cfg["classes"])}

    def bn(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Batch norm number i; in training the running statistics use the biased variance."""
        g, s, m, v = (self.named(f"{k}{i}").view(1, -1, 1, 1) for k in "gsmv")
        if not self.training:
            return (x - m) * torch.rsqrt(v + 1e-5) * g + s
        mean = x.mean((0, 2, 3), keepdim=True)
        var = ((x - mean) ** 2).mean((0, 2, 3), keepdim=True)
        with torch.no_grad():
            self.named(f"m{i}").copy_(0.9 * self.named(f"m{i}") + 0.1 * mean.flatten())
            self.named(f"v{i}").copy_(0.9 * self.named(f"v{i}") + 0.1 * var.flatten())
        return (x - mean) * torch.rsqrt(var + 1e-5) * g + s

    def forward(self, x, y):
        g = self.cfg["groups"]
        h = torch.relu(F.conv2d(x, self.k0, stride=2, padding=1))
        a1 = torch.relu(self.bn(F.conv2d(h, self.k1, groups=g), 1))
        n, c, hh, ww = a1.shape
        shuffled = a1.view(n, g, c // g, hh, ww).transpose(1, 2).reshape(n, c, hh, ww)
        a2 = self.bn(F.conv2d(shuffled, self.k2, padding=1, groups=c), 2)
        a3 = self.bn(F.conv2d(a2, self.k3, groups=g), 3)
        out = torch.relu(a3 + h)
        logits = out.mean((2, 3)) @ self.wo + self.bo
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


class MobileNet(BNTwin):
    """examples/models/mobilenet.nf: depthwise-separable blocks."""

    NF_FILE = "examples/models/mobilenet.nf"
    DEFAULTS = {"batch": 16, "image": 32, "width": 32, "classes": 10}
    LR, MOMENTUM = 0.05, 0.9

    def build(self, batch, image, width, classes):
        w = width
        self.param("k0", (w, 3, 3, 3), "he_normal")
        self.bn_decl("", w, ("g0", "b0", "m0", "v0"), sep="")
        for i, cin in ((1, w), (2, 2 * w)):
            self.param(f"d{i}_k", (cin, 1, 3, 3), "he_normal")
            self.bn_decl(f"d{i}", cin)
            self.param(f"p{i}_k", (2 * cin, cin, 1, 1), "he_normal")
            self.bn_decl(f"p{i}", 2 * cin)
        self.param("fc_w", (4 * w, classes), "glorot_uniform")
        self.param("fc_b", (classes,), "zeros")

    def input_specs(self):
        c = self.cfg
        return {"x": ((c["batch"], 3, c["image"], c["image"]), "float", 0),
                "y": ((c["batch"],), "int", c["classes"])}

    def forward(self, x, y):
        h = torch.relu(self.bn(F.conv2d(x, self.k0, stride=2, padding=1), "",
                               ("g0", "b0", "m0", "v0"), sep=""))
        for i, stride in ((1, 1), (2, 2)):
            kd = self.named(f"d{i}_k")
            h = torch.relu(self.bn(F.conv2d(h, kd, stride=stride, padding=1,
                                            groups=kd.shape[0]), f"d{i}"))
            h = torch.relu(self.bn(F.conv2d(h, self.named(f"p{i}_k")), f"p{i}"))
        logits = h.mean((2, 3)) @ self.fc_w + self.fc_b
        return {"loss": F.cross_entropy(logits, y), "logits": logits}

