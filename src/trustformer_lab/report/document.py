"""A small document model rendered twice: ``report.md`` (images linked) and a self-contained
``report.html`` (images embedded, no external resources)."""

from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .tables import Table


@dataclass
class Document:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, table: Table, *, files: str = "") -> None:
        self.blocks.append(("table", table, files))

    def image(self, path: Path, caption: str) -> None:
        self.blocks.append(("img", Path(path), caption))

    def code(self, text: str, lang: str = "") -> None:
        self.blocks.append(("code", text, lang))

    # ------------------------------------------------------------------ Markdown
    def to_markdown(self, base: Path) -> str:
        out = [f"# {self.title}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out += ["#" * block[1] + " " + block[2], ""]
            elif kind == "p":
                out += [block[1], ""]
            elif kind == "ul":
                out += [f"- {item}" for item in block[1]] + [""]
            elif kind == "table":
                table, files = block[1], block[2]
                out += [f"**{table.title}**", "", table.to_markdown(), ""]
                out += [f"- {n}" for n in table.notes]
                if files:
                    out.append(f"- Files: {files}")
                out.append("")
            elif kind == "img":
                rel = relative_link(block[1], base)
                out += [f"![{block[2]}]({rel})", "", f"*{block[2]}*", ""]
            elif kind == "code":
                out += [f"```{block[2]}", block[1].rstrip("\n"), "```", ""]
        return "\n".join(out).rstrip() + "\n"

    # ------------------------------------------------------------------ HTML
    def to_html(self) -> str:
        parts = [f"<h1>{html.escape(self.title)}</h1>"]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                level = min(block[1], 6)
                parts.append(f"<h{level}>{_inline(block[2])}</h{level}>")
            elif kind == "p":
                parts.append(f"<p>{_inline(block[1])}</p>")
            elif kind == "ul":
                parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
            elif kind == "table":
                table, files = block[1], block[2]
                notes = "".join(f"<li>{_inline(n)}</li>" for n in table.notes)
                if files:
                    notes += f"<li>Files: {_inline(files)}</li>"
                parts.append(
                    f"<figure class='table'><figcaption>{html.escape(table.title)}</figcaption>"
                    f"<div class='scroll'>{table.to_html()}</div><ul class='notes'>{notes}</ul></figure>"
                )
            elif kind == "img":
                data = base64.b64encode(block[1].read_bytes()).decode("ascii")
                parts.append(
                    f"<figure><img alt='{html.escape(block[2], quote=True)}' "
                    f"src='data:image/png;base64,{data}'><figcaption>{_inline(block[2])}</figcaption></figure>"
                )
            elif kind == "code":
                parts.append(f"<pre><code>{html.escape(block[1])}</code></pre>")
        body = "\n".join(parts)
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
        )


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.85em;margin:.4em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f2f2f2}td:first-child,th:first-child,td.l{text-align:left;white-space:normal}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1.2em 0}figcaption{font-weight:600;margin-bottom:.3em}
figure img{max-width:100%;border:1px solid #eee}figure img + figcaption{font-weight:400;font-style:italic}
.scroll{overflow-x:auto}.notes{font-size:.85em;color:#555}
code{background:#f4f4f4;padding:0 .2em;border-radius:3px}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.8em}
"""


def _inline(text: str) -> str:
    """Markdown-ish inline markup to HTML: `code`, **bold**, *italic*, [text](link)."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<em>\1</em>", out)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r"<a href='\2'>\1</a>", out)
    return out


def relative_link(path: Path, base: Path) -> str:
    try:
        return Path(os.path.relpath(Path(path).resolve(), Path(base).resolve())).as_posix()
    except ValueError:  # another drive
        return Path(path).as_posix()
