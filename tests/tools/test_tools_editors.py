"""The editor files of editors/ (VS Code extension and snippets, Neovim setup) and the copies
docs/tools.md shows: valid JSON, JavaScript and Lua, consistent with each other and with the
command line, and every snippet body, its placeholders filled, compiles with nfc."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nfc.cli import build_parser
from nfc.frontend import compile_source

ROOT = Path(__file__).resolve().parents[2]
VSCODE = ROOT / "editors" / "vscode"
NVIM = ROOT / "editors" / "nvim"
TOOLS_MD = (ROOT / "docs" / "tools.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", TOOLS_MD, re.S)


# ---- the VS Code extension ------------------------------------------------------------------

def test_package_json_names_files_that_exist():
    pkg = json.loads((VSCODE / "package.json").read_text())
    assert (VSCODE / pkg["main"]).is_file()
    (lang,) = pkg["contributes"]["languages"]
    assert lang["extensions"] == [".nf"] and pkg["activationEvents"] == [f"onLanguage:{lang['id']}"]
    assert (VSCODE / lang["configuration"]).is_file()
    (snip,) = pkg["contributes"]["snippets"]
    assert snip["language"] == lang["id"] and (VSCODE / snip["path"]).is_file()


def test_language_configuration_matches_the_grammar():
    conf = json.loads((VSCODE / "language-configuration.json").read_text())
    comment = conf["comments"]["lineComment"]
    pairs = conf["brackets"]
    # the comment starts a comment and each pair brackets something, as nfc parses them
    src = "model m {\n  input x: f32[2]\n  y[i] = (x[i] * 2.0)  " + comment + " a note\n" \
          "  output y\n}\n"
    compile_source(src, "m.nf")
    for left, right in pairs:
        assert left in src and right in src


def test_docs_show_the_files():
    # docs/tools.md shows the extension's files; they must be these
    (pkg_doc,) = _blocks("json")
    assert json.loads(pkg_doc) == json.loads((VSCODE / "package.json").read_text())
    conf = (VSCODE / "language-configuration.json").read_text().strip()
    assert f"`language-configuration.json`: `{conf}`" in TOOLS_MD
    (js_doc,) = _blocks("js")
    assert js_doc == (VSCODE / "extension.js").read_text()
    lua = _blocks("lua")
    assert lua == [(NVIM / "nfc.lua").read_text(), (NVIM / "nfc-0.10.lua").read_text()]


def test_the_server_command_exists():
    # every editor starts `nfc lsp`
    js = (VSCODE / "extension.js").read_text()
    assert '{ command: "nfc", args: ["lsp"] }' in js
    for f in NVIM.glob("*.lua"):
        assert 'cmd = { "nfc", "lsp" }' in f.read_text(), f
    assert build_parser().parse_args(["lsp"]).command == "lsp"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: the "
                    "JavaScript of the extension is not syntax-checked")
def test_extension_js_parses():
    subprocess.run(["node", "--check", str(VSCODE / "extension.js")], check=True, timeout=60)


LUAC = shutil.which("luac") or shutil.which("luac5.4") or shutil.which("luac5.3")


@pytest.mark.skipif(LUAC is None, reason="luac is not installed (apt-get install lua5.4): the "
                    "Neovim setup is not syntax-checked")
def test_neovim_lua_parses():
    for f in sorted(NVIM.glob("*.lua")):
        subprocess.run([str(LUAC), "-p", str(f)], check=True, timeout=60)


# ---- snippets -------------------------------------------------------------------------------

class Snippet:
    """A VS Code snippet body parsed: text, tabstops `$1`/`${1}`, placeholders `${1:default}`
    (nested), choices `${1|a,b|}`, escapes `\\$`, `\\}`, `\\\\` (and `\\,` `\\|` in choices)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.defaults: dict[int, list] = {}  # tabstop -> parsed default (first one given)
        self.choices: dict[int, list[str]] = {}
        self.tree = self._parse(0, top=True)[0]

    def _parse(self, i: int, top: bool = False) -> tuple[list, int]:
        out: list = []
        s = self.text
        while i < len(s):
            c = s[i]
            if c == "\\" and i + 1 < len(s) and s[i + 1] in "$}\\":
                out.append(s[i + 1])
                i += 2
            elif c == "}" and not top:
                return out, i
            elif c == "$":
                m = re.match(r"\$(\d+)|\$\{(\d+)\}", s[i:])
                if m:
                    out.append(("stop", int(m.group(1) or m.group(2))))
                    i += m.end()
                    continue
                m = re.match(r"\$\{(\d+):", s[i:])
                if m:
                    n = int(m.group(1))
                    inner, j = self._parse(i + m.end())
                    assert j < len(s), f"unclosed placeholder in {s!r}"
                    self.defaults.setdefault(n, inner)
                    out.append(("stop", n))
                    i = j + 1
                    continue
                m = re.match(r"\$\{(\d+)\|((?:[^|\\]|\\.)*)\|\}", s[i:])
                assert m, f"unsupported '$' at {s[i:i + 12]!r} (variables are not used here)"
                opts = re.split(r"(?<!\\),", m.group(2))
                self.choices[int(m.group(1))] = [re.sub(r"\\(.)", r"\1", o) for o in opts]
                out.append(("stop", int(m.group(1))))
                i += m.end()
            else:
                out.append(c)
                i += 1
        assert top, f"unclosed placeholder in {s!r}"
        return out, i

    def variants(self) -> int:
        """How many fillings test every choice (choice k of each list, or its last)."""
        return max((len(c) for c in self.choices.values()), default=1)

    def fill(self, k: int = 0) -> str:
        """The body with each tabstop's default (choice k), `$0` empty."""
        def render(items: list, depth: int = 0) -> str:
            assert depth < 20, "a placeholder refers to itself"
            out = []
            for x in items:
                if isinstance(x, str):
                    out.append(x)
                elif x[1] == 0:
                    continue
                elif x[1] in self.choices:
                    opts = self.choices[x[1]]
                    out.append(opts[min(k, len(opts) - 1)])
                else:
                    assert x[1] in self.defaults, \
                        f"tabstop ${x[1]} has no default anywhere: the body cannot be checked"
                    out.append(render(self.defaults[x[1]], depth + 1))
            return "".join(out)
        return render(self.tree)


#: Where a snippet goes: a whole file, a statement of a model body, an expression, the
#: `minimize` statement, or a line at the top of a file that uses std.nn.
CONTEXT = {
    "op": "file", "op with compile-time parameters": "file", "model": "file",
    "classifier": "file", "import": "import", "comprehension": "statement", "sum": "statement",
    "guard": "statement", "causal sum": "statement", "param": "statement",
    "frozen param": "statement", "grad input": "statement", "stop_gradient": "expression",
    "minimize": "minimize",
}

PREAMBLE = """model ctx(batch = 2) {
  input  x: f32[batch, 4]
  param  w: f32[4, 4] = normal(0.0, 0.1)
  param  a: f32[4, 4] = normal(0.0, 0.1)
BODY
MINIMIZE
}
"""
LOSS = "  loss = sum(n, j) x[n, j] * w[j, j] + a[j, j]\n"


def _program(context: str, body: str) -> str:
    fixed = PREAMBLE.replace("MINIMIZE", "  minimize loss with sgd(lr = 0.1)")
    if context == "file":
        return body
    if context == "import":
        return body + "\nmodel m {\n  input x: f32[2, 3]\n  y = relu(x)\n  output y\n}\n"
    if context == "statement":
        return fixed.replace("BODY", "  " + body + "\n" + LOSS)
    if context == "expression":
        return fixed.replace("BODY", "  t = " + body + "\n" + LOSS + "  output t")
    assert context == "minimize"
    return PREAMBLE.replace("BODY", LOSS).replace("MINIMIZE", "  " + body)


SNIPPETS = json.loads((VSCODE / "snippets.json").read_text())


def test_every_snippet_has_a_context():
    assert set(SNIPPETS) == set(CONTEXT)
    for name, snip in SNIPPETS.items():
        assert snip["prefix"] and snip["description"], name


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet_compiles(name):
    body = SNIPPETS[name]["body"]
    snip = Snippet("\n".join(body) if isinstance(body, list) else body)
    for k in range(snip.variants()):
        src = _program(CONTEXT[name], snip.fill(k))
        assert "$" not in src and "\\" not in src, src
        module = compile_source(src, f"{name}.nf")
        if CONTEXT[name] != "file" or "model" in src:
            assert module.has_func("forward"), src


def test_the_snippet_filler_can_fail():
    # a tabstop without a default, a nested default, a mirror and an escaped comma
    with pytest.raises(AssertionError, match="no default"):
        Snippet("y = $1").fill()
    s = Snippet("${1:a${2:b}c} $2 ${3|x\\, y,z|}$0")
    assert [s.fill(0), s.fill(1)] == ["abc b x, y", "abc b z"]
