"""The offline ``dvc plots show`` page: Vega inline, no CDN, accepted by DVC's renderer."""

from __future__ import annotations

from dvc_render.html import HTML
from dvc_render.vega import VegaRenderer

from envace.reporting.dvc_html import offline_template


def test_offline_page_has_vega_inline_and_no_cdn():
    template = offline_template()
    assert "{plot_divs}" in template and "{scripts}" not in template
    assert "window.vegaEmbed" in template and "cdn." not in template and "<script src" not in template
    page = HTML(template)
    renderer = VegaRenderer(
        [{"step": 1, "reward/mean": 0.5, "rev": "workspace"}], "train_steps.csv", x="step", y="reward/mean"
    )
    page.with_scripts(renderer.SCRIPTS)  # what DVC adds for vega plots: dropped without a {scripts} slot
    page.with_element(renderer.generate_html())
    html = page.embed()
    assert "cdn.jsdelivr" not in html and "vegaEmbed('#" in html
