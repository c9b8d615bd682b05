"""Measure code blocks of the built site in headless Chromium: which ones scroll, and how many characters fit.

    python docs/scripts/code_width.py SITE_DIR [--width 1280] [--shots DIR] [PAGE ...]

For each page (``getting-started/index.html`` ..., every page when none is given) Chromium lays the page
out at ``--width`` px, and a script reports every ``pre > code`` whose ``scrollWidth`` exceeds its
``clientWidth`` (a horizontal scrollbar: the end of the line is hidden), and how many monospace
characters fit in one line of a code block (``clientWidth`` minus the padding, divided by the width of
one character of the code font). ``--shots DIR`` also writes a screenshot of each page.
``tests/test_docs_width.py`` uses ``overflowing`` to check the pages when Chromium is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")

# Runs in the page after layout; leaves its findings as JSON in <pre id="code-width">.
_PROBE = """
<script>
window.addEventListener("load", () => {
  const found = {fits: null, overflowing: []};
  for (const code of document.querySelectorAll("pre > code")) {
    if (code.offsetParent === null) continue;                   // hidden (e.g. a closed tab)
    const style = getComputedStyle(code);
    if (found.fits === null) {
      const probe = document.createElement("span");
      probe.textContent = "x".repeat(100);
      code.appendChild(probe);
      const char = probe.getBoundingClientRect().width / 100;
      code.removeChild(probe);
      const inner = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      found.fits = Math.floor(inner / char);
    }
    if (code.scrollWidth > code.clientWidth + 1) {
      const lines = code.textContent.split("\\n");
      const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      found.overflowing.push({longest: longest, chars: longest.length,
                              scroll: code.scrollWidth, client: code.clientWidth});
    }
  }
  const out = document.createElement("pre");
  out.id = "code-width";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
"""
_RESULT = re.compile(r'<pre id="code-width">(.*?)</pre>', re.DOTALL)


def chromium() -> str | None:
    """The path of a Chromium binary on the PATH, or None."""
    return next((path for name in CHROMIUM if (path := shutil.which(name)) is not None), None)


def measure(site: Path, page: str, width: int = 1280, shot: Path | None = None) -> dict[str, object]:
    """``{"fits": characters per code line, "overflowing": [...]}`` for one built page (``page`` relative to ``site``)."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("no chromium on the PATH (apt-get install -y chromium)")
    source = site / page
    with tempfile.TemporaryDirectory() as tmp:
        # The probe goes into a copy beside the original, so the page's relative links (CSS, JS) still resolve.
        probed = source.with_name(f".probe-{Path(tmp).name}.html")
        probed.write_text(source.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
        try:
            flags = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},2000",
                     f"--user-data-dir={tmp}", "--virtual-time-budget=5000"]
            dom = subprocess.run([*flags, "--dump-dom", probed.as_uri()], capture_output=True, text=True,
                                 timeout=120, check=True).stdout
            if shot is not None:
                subprocess.run([*flags, f"--screenshot={shot}", f"--window-size={width},2400", source.as_uri()],
                               capture_output=True, timeout=120, check=True)
        finally:
            probed.unlink()
    match = _RESULT.search(dom)
    if match is None:
        raise RuntimeError(f"{page}: the probe left no result")
    return json.loads(match.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("pages", nargs="*")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--shots", type=Path)
    args = parser.parse_intermixed_args()
    pages = args.pages or sorted(str(p.relative_to(args.site)) for p in args.site.rglob("index.html")
                                 if not p.relative_to(args.site).parts[0].startswith(("assets", "search")))
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    for page in pages:
        shot = None if args.shots is None else args.shots / (page.replace("/", "_").removesuffix("_index.html") + ".png")
        found = measure(args.site, page, args.width, shot)
        print(f"{page}: {found['fits']} characters fit, {len(found['overflowing'])} blocks scroll")  # type: ignore[arg-type]
        for block in found["overflowing"]:  # type: ignore[attr-defined]
            print(f"    {block['chars']:4d}  {block['longest'].strip()[:110]}")


if __name__ == "__main__":
    main()
