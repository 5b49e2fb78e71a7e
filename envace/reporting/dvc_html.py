"""``dvc plots show`` as a page that renders offline.

DVC's default HTML page loads Vega, Vega-Lite and Vega-Embed from a CDN, so on a machine without network
the page stays blank. ``offline_template()`` builds a DVC HTML template (``--html-template``) that
carries those libraries inline instead: the bundle ``vl-convert-python`` ships (its
``javascript_bundle``, which exposes ``vegaEmbed`` as a global here). The template has no ``{scripts}``
placeholder, so DVC's CDN ``<script>`` tags are never inserted; the page embeds DVC's own plot ``<div>``s.

``python -m envace.reporting.dvc_html [-o DIR]`` (``make plots``) writes the template under
``.envace/`` and runs ``dvc plots show --html-template ... -o DIR`` (default ``reports/dvc_plots``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE_PATH = Path(".envace/dvc_plots_offline.html")
DEFAULT_OUT = Path("reports/dvc_plots")

_PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>envace: DVC plots</title>
    <script type="text/javascript">
__BUNDLE__
    </script>
    <style>table { border-spacing: 15px; }</style>
</head>
<body>
    {plot_divs}
</body>
</html>"""


def offline_template() -> str:
    """The HTML template text with Vega-Embed inline (as the global ``vegaEmbed`` DVC's divs call)."""
    import vl_convert  # vl-convert-python: Vega, Vega-Lite and Vega-Embed bundled, loaded only here

    bundle = vl_convert.javascript_bundle("window.vegaEmbed = vegaEmbed;")
    if "</script" in bundle:
        raise ValueError("the Vega bundle contains '</script', which would end the inline script early")
    return _PAGE.replace("__BUNDLE__", bundle)


def write_template(path: Path = TEMPLATE_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(offline_template(), encoding="utf-8")
    return path


def show(out: Path = DEFAULT_OUT, targets: list[str] | None = None) -> Path:
    """Run ``dvc plots show`` with the offline template; returns the page's path."""
    template = write_template()
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    cmd = [dvc, "plots", "show", "--html-template", str(template), "-o", str(out), *(targets or [])]
    subprocess.run(cmd, check=True)
    return out / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="dvc plots show, rendered offline (Vega inline)")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("targets", nargs="*", help="plot targets (default: every plot in dvc.yaml)")
    args = parser.parse_args(argv)
    print(show(args.out, args.targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
