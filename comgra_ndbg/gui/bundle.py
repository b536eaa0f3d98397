"""plotly.js as the explorer needs it: the cartesian bundle, served where Dash asks for the full one.

Every plot the explorer draws is a scatter, bar or heatmap trace on cartesian axes, which plotly.js's
cartesian bundle holds (``plotly-cartesian-4.1.1.min.js`` from the npm package
``plotly.js-cartesian-dist-min``, MIT licensed, shipped in ``vendor/``): 1.5 MB to download and compile on a
first visit instead of the full bundle's 4.8 MB, the same plotly.js version the installed ``plotly`` package
ships. Dash's graph component loads plotly.js from one fixed address of the app
(``_dash-component-suites/plotly/package_data/plotly.min.js``, also the page's preload); the app answers
that address with the cartesian bundle, so whichever asks first (the preload or the graph) gets the smaller
file and nothing loads plotly.js twice.

A custom visualization (``--visualization FILE``) may draw any trace type (3-D, maps, polar), so an app
with one keeps the full bundle.
"""
from __future__ import annotations

from pathlib import Path

import flask
from dash import Dash

__all__ = ["CARTESIAN", "PLOTLY_ADDRESS", "serve_cartesian_plotly"]

CARTESIAN = Path(__file__).resolve().parent / "vendor" / "plotly-cartesian-4.1.1.min.js"
PLOTLY_ADDRESS = "_dash-component-suites/plotly/package_data/plotly.min.js"  # after the app's path prefix


def serve_cartesian_plotly(app: Dash) -> None:
    """Answer ``app``'s plotly.js address with the cartesian bundle (revalidated by its ETag, as Dash serves
    its own unfingerprinted files, so a later visit costs one 304)."""
    address = f"{app.config.routes_pathname_prefix}{PLOTLY_ADDRESS}"

    @app.server.before_request
    def _cartesian() -> flask.Response | None:
        if flask.request.path != address:
            return None
        return flask.send_file(CARTESIAN, mimetype="application/javascript", conditional=True, etag=True,
                               max_age=0)
